// Package alarm watches a node's health and raises and clears alarms.
//
// A Monitor evaluates its probes every Options.Interval (default 10s), on
// its own goroutine, never on the data path: a probe reads counters and
// gauges the parts already keep (the store's sticky failure and fsync
// times, a group's lag, the dead-letter topics, the filesystem's free
// space, certificates' expiry…) and returns the Readings of the
// conditions it watches. A condition found true raises an alarm — one per
// kind and subject, not one per evaluation — and the alarm clears once the
// condition has been false for Options.ClearAfter, so a value wavering
// around its threshold does not flap. Rules with memory (a lag growing for
// a period, a rate over a window, arrivals within a quiet period) are
// built with the constructors of rules.go.
//
// Each raise and clear is an Event (kind, subject, value, threshold,
// since). It is
//   - logged (one line: WARN raised, INFO cleared);
//   - stored by Options.Store — the node stores it in the system topic
//     %ALARM% (Topic), one queue, keyed by kind and subject, tagged
//     "raised" or "cleared": queryable like any topic, consumable by a group;
//   - kept among the Recent events and, while raised, the Active ones
//     (GET /api/v1/alarms, /stats, the dashboard);
//   - exported as ferrymq_alarm_active{kind,subject} while active;
//   - pushed to every Webhook as a JSON POST, from a bounded queue per
//     webhook (the oldest event is dropped when it is full), retried with
//     exponential backoff; a slow or dead webhook holds up nothing else.
//
// At Start a Monitor takes up the alarms Options.Restore reports raised
// and not cleared (the node reads them back from %ALARM%), so after a
// restart an alarm that no longer holds is cleared instead of forgotten,
// and one that still holds is not raised a second time.
//
// # Concurrency
//
// A Monitor is safe for concurrent use. Start starts the evaluation and
// the webhook senders; Close stops them and returns once they have ended
// (events still queued for a webhook are dropped, and logged).
package alarm
