package admin

import (
	"errors"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/ferrymq/ferrymq/core/httperr"
	"github.com/ferrymq/ferrymq/session"
)

// inlineID is the client ID of the admin API's inline mochi client, the
// publisher of the empty retained messages that clear one.
const inlineID = "$ferrymq-admin"

// connTimes is a mochi hook that remembers when each connected client's
// session was established: mochi does not keep it.
type connTimes struct {
	mqtt.HookBase
	now func() time.Time

	mu sync.Mutex
	at map[*mqtt.Client]time.Time
}

func newConnTimes(now func() time.Time) *connTimes {
	return &connTimes{now: now, at: map[*mqtt.Client]time.Time{}}
}

func (h *connTimes) ID() string { return "ferrymq-admin" }

func (h *connTimes) Provides(b byte) bool {
	return b == mqtt.OnSessionEstablished || b == mqtt.OnDisconnect
}

func (h *connTimes) OnSessionEstablished(cl *mqtt.Client, _ packets.Packet) {
	t := h.now()
	h.mu.Lock()
	h.at[cl] = t
	h.mu.Unlock()
}

func (h *connTimes) OnDisconnect(cl *mqtt.Client, _ error, _ bool) {
	h.mu.Lock()
	delete(h.at, cl)
	h.mu.Unlock()
}

// get returns when cl connected, or the zero time when unknown.
func (h *connTimes) get(cl *mqtt.Client) time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.at[cl]
}

// prune forgets closed clients whose OnDisconnect never came (a connection
// the gateway closed after a panic in its read path).
func (h *connTimes) prune() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for cl := range h.at {
		if cl.Closed() {
			delete(h.at, cl)
		}
	}
}

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
	// Subscriptions are the client's, as mochi holds them (nil for a
	// parked session: see Session).
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

// sessionInfo is the stored session of a client (package session).
type sessionInfo struct {
	Parked        bool      `json:"parked"`
	Queued        int       `json:"queued"`
	QueuedBytes   int       `json:"queued_bytes"`
	Subscriptions int       `json:"subscriptions"`
	Deadline      time.Time `json:"deadline,omitzero"` // when a parked session expires
}

// connected reports whether cl is a live network connection.
func connected(cl *mqtt.Client) bool {
	return !cl.Net.Inline && cl.Net.Conn != nil && !cl.Closed()
}

func (a *api) toClient(cl *mqtt.Client) clientInfo {
	p := &cl.Properties // not copied: mochi writes the will's flag atomically
	out := clientInfo{
		ID: cl.ID, Connected: connected(cl), Username: string(p.Username), Remote: cl.Net.Remote, Listener: cl.Net.Listener,
		ProtocolVersion: p.ProtocolVersion, Keepalive: cl.State.Keepalive, CleanStart: p.Clean,
		Inflight: cl.State.Inflight.Len(),
	}
	if host, _, err := net.SplitHostPort(cl.Net.Remote); err == nil {
		out.RemoteIP = host
	}
	if p.ProtocolVersion == 5 && p.Props.SessionExpiryIntervalFlag {
		v := p.Props.SessionExpiryInterval
		out.SessionExpiry = &v
	}
	if out.Connected {
		out.ConnectedAt = a.conns.get(cl)
		if !out.ConnectedAt.IsZero() {
			out.ConnectedAt = out.ConnectedAt.UTC()
		}
	}
	subs := cl.State.Subscriptions.GetAll()
	out.Subscriptions = make([]clientSub, 0, len(subs))
	for _, s := range subs {
		out.Subscriptions = append(out.Subscriptions, clientSub{Filter: s.Filter, QoS: s.Qos})
	}
	slices.SortFunc(out.Subscriptions, func(x, y clientSub) int { return strings.Compare(x.Filter, y.Filter) })
	if a.opts.Sessions != nil {
		if in, ok := a.opts.Sessions.Session(cl.ID); ok {
			out.Session = toSession(in.Parked, in.Queued, in.QueuedBytes, in.Subscriptions, in.Deadline)
		}
	}
	return out
}

func toSession(parked bool, queued, queuedBytes, subs int, deadline time.Time) *sessionInfo {
	s := &sessionInfo{Parked: parked, Queued: queued, QueuedBytes: queuedBytes, Subscriptions: subs}
	if !deadline.IsZero() {
		s.Deadline = deadline.UTC()
	}
	return s
}

func (a *api) mqttServer() (*mqtt.Server, error) {
	if a.server == nil {
		return nil, disabled(CodeMQTTDisabled, "the MQTT gateway")
	}
	return a.server, nil
}

// clientPage is one page of GET /api/v1/clients.
type clientPage struct {
	Clients []clientInfo `json:"clients"`
	Next    string       `json:"next,omitempty"`
}

// listClients serves GET /api/v1/clients?max=&cursor=: the connected
// clients, sorted by ID.
func (a *api) listClients(w http.ResponseWriter, r *http.Request) error {
	s, err := a.mqttServer()
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
	a.conns.prune()
	var live []*mqtt.Client
	for id, cl := range s.Clients.GetAll() {
		if id > cursor && connected(cl) {
			live = append(live, cl)
		}
	}
	slices.SortFunc(live, func(x, y *mqtt.Client) int { return strings.Compare(x.ID, y.ID) })
	got, next := pageOf(live, func(cl *mqtt.Client) string { return cl.ID }, n, "")
	page := clientPage{Clients: make([]clientInfo, 0, len(got)), Next: next}
	for _, cl := range got {
		page.Clients = append(page.Clients, a.toClient(cl))
	}
	a.writeJSON(w, r, http.StatusOK, page)
	return nil
}

// getClient serves GET /api/v1/clients/{id}: a connected client, or one
// whose session outlives its connection (mochi still holds it, or it is
// parked in the session store).
func (a *api) getClient(w http.ResponseWriter, r *http.Request) error {
	s, err := a.mqttServer()
	if err != nil {
		return err
	}
	if _, err := queryParams(r); err != nil {
		return err
	}
	id := r.PathValue("id")
	if cl, ok := s.Clients.Get(id); ok && !cl.Net.Inline {
		a.writeJSON(w, r, http.StatusOK, a.toClient(cl))
		return nil
	}
	if ss := a.opts.Sessions; ss != nil {
		if in, ok := ss.Session(id); ok {
			out := clientInfo{ID: id, Inflight: in.Queued,
				Session: toSession(in.Parked, in.Queued, in.QueuedBytes, in.Subscriptions, in.Deadline)}
			if user, ok := ss.Owner(id); ok {
				out.Username = user
			}
			a.writeJSON(w, r, http.StatusOK, out)
			return nil
		}
	}
	return httperr.New(http.StatusNotFound, CodeClientNotFound, "no client %q connected or stored", id)
}

type kickResult struct {
	ID           string `json:"id"`
	Disconnected bool   `json:"disconnected"`
}

// kickClient serves DELETE /api/v1/clients/{id}: disconnects a connected
// client (MQTT 5: DISCONNECT 0x98 administrative action). Its session, if
// it outlives the connection, stays; its will is published.
func (a *api) kickClient(w http.ResponseWriter, r *http.Request) error {
	s, err := a.mqttServer()
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	cl, ok := s.Clients.Get(id)
	if !ok || !connected(cl) {
		return httperr.New(http.StatusNotFound, CodeClientNotFound, "no client %q connected", id)
	}
	_ = s.DisconnectClient(cl, packets.ErrAdministrativeAction) // returns the code it sent
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

// deleteSession serves DELETE /api/v1/sessions/{id}: a parked (offline)
// session is deleted with its queued messages; one the MQTT server holds
// (connected, just disconnected, or with a will pending) is 409 — kick the
// client first.
func (a *api) deleteSession(w http.ResponseWriter, r *http.Request) error {
	ss := a.opts.Sessions
	if ss == nil {
		return disabled(CodeSessionsDisabled, "a session store")
	}
	id := r.PathValue("id")
	n, err := ss.Delete(id, "the session was deleted by an operator")
	switch {
	case errors.Is(err, session.ErrNotParked):
		return httperr.New(http.StatusNotFound, CodeSessionNotFound, "no session %q stored", id)
	case errors.Is(err, session.ErrHeld):
		return httperr.New(http.StatusConflict, CodeSessionHeld,
			"session %q is held by the MQTT server (connected, disconnected under a second ago, or with a will pending): kick the client, then delete", id)
	case err != nil:
		return err
	}
	a.audit(r).Str(fieldClient, id).Int("dropped", n).Msg("session deleted")
	a.writeJSON(w, r, http.StatusOK, sessionDeleted{ID: id, Deleted: true, Dropped: n})
	return nil
}
