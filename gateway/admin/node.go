package admin

import (
	"encoding/json"
	"net/http"
	"runtime"
	"time"
)

// nodeInfo is GET /api/v1/node.
type nodeInfo struct {
	Node          string          `json:"node"`
	Version       string          `json:"version"`
	Engine        string          `json:"engine"`
	GoVersion     string          `json:"go_version"`
	StartedAt     time.Time       `json:"started_at"`
	Uptime        string          `json:"uptime"`
	UptimeSeconds int64           `json:"uptime_seconds"`
	MQTT          *mqttSummary    `json:"mqtt,omitempty"`
	Sessions      *sessionSummary `json:"sessions,omitempty"`
	Config        json.RawMessage `json:"config,omitempty"`
}

type mqttSummary struct {
	Listeners        []listenerInfo `json:"listeners"`
	ClientsConnected int64          `json:"clients_connected"`
	Retained         int            `json:"retained"`
}

type listenerInfo struct {
	Name string `json:"name"`
	Addr string `json:"addr,omitempty"`
}

type sessionSummary struct {
	Stored   int   `json:"stored"`
	Parked   int   `json:"parked"`
	Queued   int   `json:"queued"`
	LogBytes int64 `json:"log_bytes"`
}

// node serves GET /api/v1/node.
func (a *api) node(w http.ResponseWriter, r *http.Request) error {
	if _, err := queryParams(r); err != nil {
		return err
	}
	now := a.opts.Now()
	up := max(now.Sub(a.opts.Started), 0)
	out := nodeInfo{
		Node:          a.opts.Node,
		Version:       a.opts.Version,
		Engine:        a.opts.Engine,
		GoVersion:     runtime.Version(),
		StartedAt:     a.opts.Started.UTC(),
		Uptime:        up.Round(time.Second).String(),
		UptimeSeconds: int64(up / time.Second),
		Config:        a.config,
	}
	if g := a.opts.Gateway; g != nil {
		st := a.engine.Stats()
		m := &mqttSummary{Listeners: []listenerInfo{}, ClientsConnected: st.Connected, Retained: st.Retained}
		for _, name := range g.Listeners() {
			li := listenerInfo{Name: name}
			if addr := g.Addr(name); addr != nil {
				li.Addr = addr.String()
			}
			m.Listeners = append(m.Listeners, li)
		}
		out.MQTT = m
	}
	if s := a.opts.Sessions; s != nil {
		st := s.Stats()
		es := a.engine.Stats()
		out.Sessions = &sessionSummary{Stored: st.Sessions, Parked: es.Sessions - int(es.Connected), Queued: st.Messages, LogBytes: st.LogBytes}
	}
	a.writeJSON(w, r, http.StatusOK, out)
	return nil
}
