package admin

import (
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/ferrymq/ferrymq/core/httperr"
	"github.com/ferrymq/ferrymq/gateway/engine"
)

// clientInfo describes an MQTT client. The password, the will and
// authentication data are never shown.
type clientInfo struct {
	ID        string `json:"id"`
	Connected bool   `json:"connected"`
	Username  string `json:"username,omitempty"`
	Remote    string `json:"remote,omitempty"`
	RemoteIP  string `json:"remote_ip,omitempty"`
	Listener  string `json:"listener,omitempty"`
	// ProtocolVersion is the CONNECT's protocol level: 3 (MQTT 3.1), 4
	// (3.1.1) or 5.
	ProtocolVersion byte      `json:"protocol_version,omitempty"`
	Keepalive       uint16    `json:"keepalive"`
	CleanStart      bool      `json:"clean_start"`
	SessionExpiry   *uint32   `json:"session_expiry,omitempty"` // seconds; MQTT 5 only
	ConnectedAt     time.Time `json:"connected_at,omitzero"`
	// Subscriptions are the session's.
	Subscriptions []clientSub `json:"subscriptions,omitempty"`
	// Inflight counts QoS 1/2 messages sent and not yet acknowledged (or
	// queued while offline).
	Inflight int          `json:"inflight"`
	Session  *sessionInfo `json:"session,omitempty"`
}

type clientSub struct {
	Filter string `json:"filter"`
	QoS    byte   `json:"qos"`
}

// sessionInfo is an offline session that outlives its connection.
type sessionInfo struct {
	Parked        bool      `json:"parked"`
	Queued        int       `json:"queued"`
	QueuedBytes   int       `json:"queued_bytes"`
	Subscriptions int       `json:"subscriptions"`
	Deadline      time.Time `json:"deadline,omitzero"` // when a parked session expires
}

func toClient(ci engine.ClientInfo) clientInfo {
	out := clientInfo{
		ID: ci.ID, Connected: ci.Connected, Username: ci.Username, Remote: ci.Remote, Listener: ci.Listener,
		ProtocolVersion: ci.Protocol, Keepalive: ci.Keepalive, CleanStart: ci.Clean,
		Inflight: ci.Inflight + ci.Queued,
	}
	if host, _, err := net.SplitHostPort(ci.Remote); err == nil {
		out.RemoteIP = host
	}
	if ci.Protocol == 5 || ci.SessionExpiry > 0 {
		v := ci.SessionExpiry
		out.SessionExpiry = &v
	}
	if ci.Connected {
		out.ConnectedAt = ci.Since.UTC()
	} else if ci.SessionExpiry > 0 {
		out.Session = &sessionInfo{Parked: true, Queued: ci.Inflight + ci.Queued, QueuedBytes: ci.QueuedBytes,
			Subscriptions: len(ci.Subscriptions), Deadline: ci.Expires.UTC()}
	}
	out.Subscriptions = make([]clientSub, 0, len(ci.Subscriptions))
	for _, s := range ci.Subscriptions {
		out.Subscriptions = append(out.Subscriptions, clientSub{Filter: s.Filter, QoS: s.Options.QoS})
	}
	slices.SortFunc(out.Subscriptions, func(x, y clientSub) int { return strings.Compare(x.Filter, y.Filter) })
	return out
}

func (a *api) mqttEngine() (*engine.Engine, error) {
	if a.engine == nil {
		return nil, disabled(CodeMQTTDisabled, "the MQTT gateway")
	}
	return a.engine, nil
}

// clientPage is one page of GET /api/v1/clients.
type clientPage struct {
	Clients []clientInfo `json:"clients"`
	Next    string       `json:"next,omitempty"`
}

// listClients serves GET /api/v1/clients?max=&cursor=: the connected
// clients, sorted by ID.
func (a *api) listClients(w http.ResponseWriter, r *http.Request) error {
	e, err := a.mqttEngine()
	if err != nil {
		return err
	}
	q, err := queryParams(r, "max", "cursor")
	if err != nil {
		return err
	}
	n, cursor, err := a.pageParams(q)
	if err != nil {
		return err
	}
	var live []engine.ClientInfo
	for _, ci := range e.Clients() {
		if ci.ID > cursor && ci.Connected {
			live = append(live, ci)
		}
	}
	slices.SortFunc(live, func(x, y engine.ClientInfo) int { return strings.Compare(x.ID, y.ID) })
	got, next := pageOf(live, func(ci engine.ClientInfo) string { return ci.ID }, n, "")
	page := clientPage{Clients: make([]clientInfo, 0, len(got)), Next: next}
	for _, ci := range got {
		page.Clients = append(page.Clients, toClient(ci))
	}
	a.writeJSON(w, r, http.StatusOK, page)
	return nil
}

// getClient serves GET /api/v1/clients/{id}: a connected client, or one
// whose session outlives its connection.
func (a *api) getClient(w http.ResponseWriter, r *http.Request) error {
	e, err := a.mqttEngine()
	if err != nil {
		return err
	}
	if _, err := queryParams(r); err != nil {
		return err
	}
	id := r.PathValue("id")
	ci, ok := e.Client(id)
	if !ok {
		return httperr.New(http.StatusNotFound, CodeClientNotFound, "no client %q connected or stored", id)
	}
	a.writeJSON(w, r, http.StatusOK, toClient(ci))
	return nil
}

type kickResult struct {
	ID           string `json:"id"`
	Disconnected bool   `json:"disconnected"`
}

// kickClient serves DELETE /api/v1/clients/{id}: disconnects a connected
// client (MQTT 5: DISCONNECT 0x98 administrative action). Its session, if
// it outlives the connection, stays; its will is published.
func (a *api) kickClient(w http.ResponseWriter, r *http.Request) error {
	e, err := a.mqttEngine()
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	if err := e.Disconnect(id, engine.AdministrativeAction, "disconnected by an operator"); err != nil {
		return httperr.New(http.StatusNotFound, CodeClientNotFound, "no client %q connected", id)
	}
	a.audit(r).Str(fieldClient, id).Msg("client disconnected")
	a.writeJSON(w, r, http.StatusOK, kickResult{ID: id, Disconnected: true})
	return nil
}

// sessionDeleted answers DELETE /api/v1/sessions/{id}.
type sessionDeleted struct {
	ID      string `json:"id"`
	Deleted bool   `json:"deleted"`
	// Dropped is how many queued messages went with it (each gets a
	// "dropped" receipt).
	Dropped int `json:"dropped"`
}

// deleteSession serves DELETE /api/v1/sessions/{id}: an offline session is
// deleted with its queued messages; one whose client is connected is 409 —
// kick the client first.
func (a *api) deleteSession(w http.ResponseWriter, r *http.Request) error {
	e, err := a.mqttEngine()
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	if e.Connected(id) {
		return httperr.New(http.StatusConflict, CodeSessionHeld,
			"session %q has a connected client: kick the client, then delete", id)
	}
	n, ok := e.DeleteSession(id)
	if !ok {
		return httperr.New(http.StatusNotFound, CodeSessionNotFound, "no session %q stored", id)
	}
	a.audit(r).Str(fieldClient, id).Int("dropped", n).Msg("session deleted")
	a.writeJSON(w, r, http.StatusOK, sessionDeleted{ID: id, Deleted: true, Dropped: n})
	return nil
}
