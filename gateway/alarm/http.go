package alarm

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/ferrymq/ferrymq/core/httperr"
)

// List is the body of GET /api/v1/alarms.
type List struct {
	Active []Event `json:"active"`
	// Recent are the latest events, the newest first.
	Recent []Event `json:"recent"`
}

// maxListRecent bounds ?recent=.
const maxListRecent = 1000

// Handler serves GET /api/v1/alarms: the active alarms, the oldest first,
// and the latest events (?recent=N, default 50, at most the Monitor's
// Recent).
func (m *Monitor) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", "method not allowed")
			return
		}
		n := 50
		if s := r.URL.Query().Get("recent"); s != "" {
			v, err := strconv.Atoi(s)
			if err != nil || v < 0 || v > maxListRecent {
				writeError(w, http.StatusBadRequest, httperr.CodeBadRequest, "recent: want a count from 0 to 1000")
				return
			}
			n = v
		}
		l := List{Active: m.Active(), Recent: []Event{}}
		if n > 0 {
			l.Recent = m.Recent(n)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(l)
	})
}

// writeError answers the admin API's error body.
func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg, "code": code})
}
