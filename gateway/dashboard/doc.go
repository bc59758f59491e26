// Package dashboard serves the operator dashboard: one page, embedded in
// the binary, that polls the gateway's /stats JSON every second and draws
// live figures and small charts of the last two minutes (connections,
// MQTT messages in and out, core appends and fsyncs, disk, top topics,
// consumer-group lag, errors).
//
// The page needs no network beyond the server that serves it: its HTML,
// one script and one stylesheet are compiled in (go:embed), there is no
// CDN, no web font and no build step, and a Content-Security-Policy limits
// it to its own origin. Rates are computed in the browser by differencing
// counters between two polls over the server's clock ("time" in /stats).
//
// Every figure carries a data-metric attribute (its raw number in
// data-value) so that tests and scripts can read the rendered page.
//
// The handler holds no state and is safe for concurrent use. It shows only
// what /stats returns, which carries no secrets.
package dashboard
