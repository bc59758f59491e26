package dashboard_test

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/dashboard"
)

func get(t *testing.T, h http.Handler, method, path string) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	return rec
}

func TestRoutes(t *testing.T) {
	h := dashboard.Handler(dashboard.Options{})
	for _, tc := range []struct {
		method, path string
		code         int
		contentType  string
	}{
		{"GET", "/", 200, "text/html; charset=utf-8"},
		{"HEAD", "/", 200, "text/html; charset=utf-8"},
		{"GET", "/dashboard/dashboard.js", 200, "text/javascript; charset=utf-8"},
		{"GET", "/dashboard/dashboard.css", 200, "text/css; charset=utf-8"},
		{"GET", "/dashboard/index.html", 404, ""}, // the template, unrendered
		{"GET", "/dashboard/", 404, ""},
		{"GET", "/dashboard/nope.js", 404, ""},
		{"GET", "/stats", 404, ""}, // someone else's
		{"GET", "/index.html", 404, ""},
		{"POST", "/", 405, ""},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			rec := get(t, h, tc.method, tc.path)
			require.Equal(t, tc.code, rec.Code)
			if tc.code != 200 {
				return
			}
			require.Equal(t, tc.contentType, rec.Header().Get("Content-Type"))
			csp := rec.Header().Get("Content-Security-Policy")
			require.Contains(t, csp, "default-src 'none'")
			require.Contains(t, csp, "connect-src 'self'")
			require.Equal(t, "nosniff", rec.Header().Get("X-Content-Type-Options"))
		})
	}
}

func TestPageOptions(t *testing.T) {
	body := get(t, dashboard.Handler(dashboard.Options{}), "GET", "/").Body.String()
	require.Contains(t, body, `data-stats="/stats"`)
	require.Contains(t, body, `data-interval="1000"`)
	require.Contains(t, body, `data-window="120000"`)
	require.Contains(t, body, `<script src="/dashboard/dashboard.js" defer></script>`)
	require.Contains(t, body, `<link rel="stylesheet" href="/dashboard/dashboard.css">`)
	require.Contains(t, body, `<title>ferrymq · dashboard</title>`)

	body = get(t, dashboard.Handler(dashboard.Options{StatsPath: "/ops/stats", Interval: 10 * time.Millisecond, Window: time.Minute, Title: "gw-1 <eu>"}), "GET", "/").Body.String()
	require.Contains(t, body, `data-stats="/ops/stats"`)
	require.Contains(t, body, `data-interval="100"`, "at least 100 ms")
	require.Contains(t, body, `data-window="60000"`)
	require.Contains(t, body, `gw-1 &lt;eu&gt;`, "escaped")

	for _, bad := range []string{"stats", "http://elsewhere/stats", "//elsewhere/stats"} {
		require.Panics(t, func() { dashboard.Handler(dashboard.Options{StatsPath: bad}) }, bad)
	}
}

// The page works offline: nothing it loads comes from elsewhere, and it
// writes data into the page only as text.
func TestAssetsSelfContained(t *testing.T) {
	h := dashboard.Handler(dashboard.Options{})
	page := get(t, h, "GET", "/").Body.String()
	js := get(t, h, "GET", "/dashboard/dashboard.js").Body.String()
	css := get(t, h, "GET", "/dashboard/dashboard.css").Body.String()

	urls := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}`)
	for name, text := range map[string]string{"index.html": page, "dashboard.js": js, "dashboard.css": css} {
		for _, u := range urls.FindAllString(text, -1) {
			require.Equal(t, "http://www.w3.org", u, "%s refers to %s (only the SVG namespace may appear)", name, u)
		}
	}
	require.NotContains(t, css, "@import")
	require.NotContains(t, css, "url(")
	require.NotContains(t, css, "@font-face")
	for _, sink := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"} {
		require.NotContains(t, js, sink, "data goes into the page as text only")
	}

	// Every figure and chart the script fills is on the page.
	for _, m := range regexp.MustCompile(`\b(?:set|put)\('([a-z0-9-]+)',`).FindAllStringSubmatch(js, -1) {
		require.Contains(t, page, `data-metric="`+m[1]+`"`, "figure %s", m[1])
	}
	for _, m := range regexp.MustCompile(`\bchart\('([a-z0-9-]+)'`).FindAllStringSubmatch(js, -1) {
		require.Contains(t, page, `data-chart="`+m[1]+`"`, "chart %s", m[1])
	}
	for _, q := range []string{"0", "1", "2"} {
		require.Contains(t, page, `data-metric="mqtt-in-rate-qos`+q+`"`)
	}
	for _, table := range []string{"topics", "groups", "slow", "errors"} {
		require.Contains(t, page, `data-table="`+table+`"`)
		require.Contains(t, js, `fill('`+table+`'`)
	}
}
