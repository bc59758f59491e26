package engine_test

import (
	"cmp"
	"context"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/engine"
	"github.com/ferrymq/ferrymq/gateway/topictree"
)

// memStore is a SessionStore that keeps which client IDs it stores, and a
// SessionClaimer whose Claim returns what claim says.
type memStore struct {
	mu       sync.Mutex
	sessions map[string]engine.ClientRecord
	claim    func(clientID string) *engine.StoredSession
}

func newMemStore() *memStore { return &memStore{sessions: map[string]engine.ClientRecord{}} }

func (m *memStore) stored(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.sessions[id]
	return ok
}

func (m *memStore) Load() ([]engine.StoredSession, []*engine.Message, error) { return nil, nil, nil }
func (m *memStore) SaveClient(r engine.ClientRecord) {
	m.mu.Lock()
	m.sessions[r.ID] = r
	m.mu.Unlock()
}
func (m *memStore) SaveOffline(string, time.Time) {}
func (m *memStore) Delete(id string) {
	m.mu.Lock()
	delete(m.sessions, id)
	m.mu.Unlock()
}
func (m *memStore) SaveSubscription(string, string, topictree.Options)    {}
func (m *memStore) DeleteSubscription(string, string)                     {}
func (m *memStore) SaveMessage(string, uint16, *engine.Message, []uint32) {}
func (m *memStore) MessageReleased(string, uint16)                        {}
func (m *memStore) DeleteMessage(string, uint16)                          {}
func (m *memStore) SaveInbound(string, uint16, uint64, bool)              {}
func (m *memStore) SaveRetained(*engine.Message)                          {}
func (m *memStore) LoadMessages(string) ([]engine.StoredMessage, error)   { return nil, nil }

type claimStore struct{ *memStore }

func (c claimStore) Flush(context.Context, string) error { return nil } // every write is made in the call

func (c claimStore) Claim(_ context.Context, id string, _ bool) (*engine.StoredSession, error) {
	c.mu.Lock()
	claim := c.claim
	c.mu.Unlock()
	if claim == nil {
		return nil, nil
	}
	return claim(id), nil
}

// TestResumeWithoutExpiryEndsTheStoredSession: an MQTT 5 client resuming a
// stored session with no session expiry makes it a session that ends with
// its connection [MQTT-3.1.2-23]; the store must forget it, or the next
// start brings it back.
func TestResumeWithoutExpiryEndsTheStoredSession(t *testing.T) {
	st := newMemStore()
	e, addr := start(t, engine.Options{Hooks: engine.Hooks{Sessions: st}})
	c, _ := dialV5(t, addr, &paho.Connect{ClientID: "dev", CleanStart: true, KeepAlive: 30,
		Properties: &paho.ConnectProperties{SessionExpiryInterval: new(uint32(300))}}, nil)
	require.NoError(t, c.Disconnect(&paho.Disconnect{ReasonCode: 0}))
	require.Eventually(t, func() bool { return !e.Connected("dev") }, 5*time.Second, 5*time.Millisecond)
	require.True(t, st.stored("dev"))

	c, ca := dialV5(t, addr, &paho.Connect{ClientID: "dev", KeepAlive: 30}, nil)
	require.True(t, ca.SessionPresent)
	require.NoError(t, c.Disconnect(&paho.Disconnect{ReasonCode: 0}))
	require.Eventually(t, func() bool { return !e.HasSession("dev") }, 5*time.Second, 5*time.Millisecond)
	require.False(t, st.stored("dev"), "the stored session was left behind")
}

// TestAdoptedSessionEndsTheStaleConnection: when a claim hands the engine
// the session as another node stored it, a connection this engine still
// had on its own, stale copy is ended (DISCONNECT 0x8E, as by Forget), not
// left on a session the engine dropped.
func TestAdoptedSessionEndsTheStaleConnection(t *testing.T) {
	st := claimStore{newMemStore()}
	e, addr := start(t, engine.Options{Hooks: engine.Hooks{Sessions: st}})
	gone := make(chan *paho.Disconnect, 1)
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	old := paho.NewClient(paho.ClientConfig{Conn: conn, OnServerDisconnect: func(d *paho.Disconnect) { gone <- d }})
	_, err = old.Connect(t.Context(), &paho.Connect{ClientID: "dev", KeepAlive: 30, CleanStart: true,
		Properties: &paho.ConnectProperties{SessionExpiryInterval: new(uint32(300))}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = old.Disconnect(&paho.Disconnect{}); <-old.Done() })
	require.True(t, e.Connected("dev"))

	st.mu.Lock()
	st.claim = func(id string) *engine.StoredSession {
		return &engine.StoredSession{Client: engine.ClientRecord{ID: id, Protocol: 5, Expiry: 300}, Offline: time.Now()}
	}
	st.mu.Unlock()
	_, ca := dialV5(t, addr, &paho.Connect{ClientID: "dev", KeepAlive: 30,
		Properties: &paho.ConnectProperties{SessionExpiryInterval: new(uint32(300))}}, nil)
	require.True(t, ca.SessionPresent)
	select {
	case d := <-gone:
		require.Equal(t, byte(0x8E), d.ReasonCode)
	case <-time.After(5 * time.Second):
		t.Fatal("the stale connection was not ended")
	}
}

func (m *memStore) record(id string) (engine.ClientRecord, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.sessions[id]
	return r, ok
}

// TestSpentWillLeavesTheStore: a will stays in the stored client record
// while it is due — so that a restart still sends it — and leaves it once
// it went out after its delay, or once a clean DISCONNECT cancelled it: a
// restart must not send it again.
func TestSpentWillLeavesTheStore(t *testing.T) {
	st := newMemStore()
	e, addr := start(t, engine.Options{Hooks: engine.Hooks{Sessions: st}})
	connect := func(id string) (*paho.Client, net.Conn) {
		conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		c := paho.NewClient(paho.ClientConfig{Conn: conn})
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		_, err = c.Connect(ctx, &paho.Connect{ClientID: id, KeepAlive: 30, CleanStart: true,
			Properties:     &paho.ConnectProperties{SessionExpiryInterval: new(uint32(60))},
			WillMessage:    &paho.WillMessage{Topic: "status/" + id, QoS: 1, Payload: []byte("gone")},
			WillProperties: &paho.WillProperties{WillDelayInterval: new(uint32(1))}})
		require.NoError(t, err)
		return c, conn
	}
	hasWill := func(id string) bool { r, ok := st.record(id); return ok && r.Will != nil }

	_, lost := connect("lost")
	require.True(t, hasWill("lost"))
	require.NoError(t, lost.Close()) // no DISCONNECT: the will is due after 1 s
	require.Eventually(t, func() bool { return !e.Connected("lost") }, 5*time.Second, 10*time.Millisecond, "the engine sees the connection end")
	require.Never(t, func() bool { return !hasWill("lost") }, 300*time.Millisecond, 10*time.Millisecond, "due: the will left the store before it was sent")
	require.True(t, hasWill("lost"), "due: still stored")
	require.Eventually(t, func() bool { return !hasWill("lost") }, 5*time.Second, 10*time.Millisecond, "sent: gone from the store")

	left, _ := connect("left")
	require.NoError(t, left.Disconnect(&paho.Disconnect{ReasonCode: 0}))
	require.Eventually(t, func() bool { return !hasWill("left") }, 5*time.Second, 10*time.Millisecond, "cancelled: gone from the store")
	_, stored := st.record("left")
	require.True(t, stored, "the session itself stays")
}

// msgStore is a memStore that also keeps the queued messages, as the real
// session stores do (LoadMessages gives them back; Delete forgets them).
type msgStore struct {
	*memStore
	msgs map[string]map[uint16]engine.StoredMessage
}

func newMsgStore() *msgStore {
	return &msgStore{memStore: newMemStore(), msgs: map[string]map[uint16]engine.StoredMessage{}}
}

func (m *msgStore) SaveMessage(id string, pid uint16, msg *engine.Message, subIDs []uint32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.msgs[id] == nil {
		m.msgs[id] = map[uint16]engine.StoredMessage{}
	}
	cp := *msg
	cp.Payload = append([]byte(nil), msg.Payload...)
	m.msgs[id][pid] = engine.StoredMessage{PID: pid, Message: &cp, SubIDs: subIDs}
}

func (m *msgStore) DeleteMessage(id string, pid uint16) {
	m.mu.Lock()
	delete(m.msgs[id], pid)
	m.mu.Unlock()
}

func (m *msgStore) Delete(id string) {
	m.memStore.Delete(id)
	m.mu.Lock()
	delete(m.msgs, id)
	m.mu.Unlock()
}

func (m *msgStore) LoadMessages(id string) ([]engine.StoredMessage, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []engine.StoredMessage
	for _, sm := range m.msgs[id] {
		out = append(out, sm)
	}
	slices.SortFunc(out, func(a, b engine.StoredMessage) int { return cmp.Compare(a.PID, b.PID) })
	return out, nil
}

// TestResumeWithoutExpiryDeliversWhatWasQueued: a session that queued
// messages while offline (held by the store, not in memory) and is
// resumed with no session expiry gets them all before it ends; the store
// forgets it only after they were read back [MQTT-3.1.2-23]. (The Paho
// suite's client_test5 test_offline_message_queueing does this: it found
// the messages deleted with the stored session before they were loaded.)
func TestResumeWithoutExpiryDeliversWhatWasQueued(t *testing.T) {
	st := newMsgStore()
	e, addr := start(t, engine.Options{Hooks: engine.Hooks{Sessions: st}})
	c, _ := dialV5(t, addr, &paho.Connect{ClientID: "dev", CleanStart: true, KeepAlive: 30,
		Properties: &paho.ConnectProperties{SessionExpiryInterval: new(uint32(300))}}, nil)
	_, err := c.Subscribe(t.Context(), &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "cmd/dev", QoS: 1}}})
	require.NoError(t, err)
	require.NoError(t, c.Disconnect(&paho.Disconnect{ReasonCode: 0}))
	require.Eventually(t, func() bool { return !e.Connected("dev") }, 5*time.Second, 5*time.Millisecond)

	pub := dialV3(t, addr, "backend")
	for _, p := range []string{"a", "b"} {
		wait(t, pub.Publish("cmd/dev", 1, false, []byte(p)))
	}

	var mu sync.Mutex
	var got []string
	c, ca := dialV5(t, addr, &paho.Connect{ClientID: "dev", KeepAlive: 0}, func(pr paho.PublishReceived) (bool, error) {
		mu.Lock()
		got = append(got, string(pr.Packet.Payload))
		mu.Unlock()
		return true, nil
	})
	require.True(t, ca.SessionPresent)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 2
	}, 5*time.Second, 5*time.Millisecond, "the queued messages never came")
	mu.Lock()
	require.Equal(t, []string{"a", "b"}, got)
	mu.Unlock()
	require.False(t, st.stored("dev"), "the session stays stored after a resume without expiry")
	require.NoError(t, c.Disconnect(&paho.Disconnect{ReasonCode: 0}))
	require.Eventually(t, func() bool { return !e.HasSession("dev") }, 5*time.Second, 5*time.Millisecond)
}

// savingStore is a memStore that keeps the packet identifiers of the
// messages stored for each session.
type savingStore struct {
	*memStore
	smu   sync.Mutex
	saved map[uint16]bool
}

func (s *savingStore) SaveMessage(_ string, pid uint16, _ *engine.Message, _ []uint32) {
	s.smu.Lock()
	s.saved[pid] = true
	s.smu.Unlock()
}

func (s *savingStore) DeleteMessage(_ string, pid uint16) {
	s.smu.Lock()
	delete(s.saved, pid)
	s.smu.Unlock()
}

func (s *savingStore) pids() []uint16 {
	s.smu.Lock()
	defer s.smu.Unlock()
	out := make([]uint16, 0, len(s.saved))
	for p := range s.saved {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// TestTakeoverWithAnExpiryStoresWhatTheSessionHolds: the messages queued
// for a session that had no expiry wait without packet identifiers; when
// a connection with an expiry takes the session over, each gets its
// identifier and everything the session holds is stored (a restart would
// otherwise lose what it had been queued), then all of it arrives on the
// new connection in order.
func TestTakeoverWithAnExpiryStoresWhatTheSessionHolds(t *testing.T) {
	st := &savingStore{memStore: newMemStore(), saved: map[uint16]bool{}}
	e, addr := start(t, engine.Options{Hooks: engine.Hooks{Sessions: st}})
	// MQTT 5, clean start 0, no expiry, Receive Maximum 2.
	old := rawConnect(t, addr, packet(0x10, str("MQTT"), []byte{5, 0x00, 0, 60, 3, 0x21, 0, 2}, str("dev")))
	_, err := old.Write(packet(0x82, []byte{0, 1, 0}, str("cmd/dev"), []byte{1}))
	require.NoError(t, err)
	require.NoError(t, old.SetReadDeadline(time.Now().Add(5*time.Second)))
	typ, _ := readFrame(t, old)
	require.Equal(t, byte(0x90), typ, "SUBACK")
	const total = 10
	for i := range total {
		require.NoError(t, e.Send("dev", &engine.Message{Topic: "cmd/dev", QoS: 1, Payload: []byte{byte(i)}}))
	}
	inflight, queued := e.Held()
	require.Equal(t, [2]int{2, total - 2}, [2]int{inflight, queued})
	require.Empty(t, st.pids(), "nothing stored while the session has no expiry")

	// Clean start 0, session expiry 300 s, Receive Maximum 16.
	nc := rawConnect(t, addr, packet(0x10, str("MQTT"), []byte{5, 0x00, 0, 60, 8, 0x11, 0, 0, 1, 44, 0x21, 0, 16}, str("dev")))
	require.Len(t, st.pids(), total, "everything the session holds, stored with its identifier")
	require.NotContains(t, st.pids(), uint16(0))
	require.NoError(t, nc.SetReadDeadline(time.Now().Add(5*time.Second)))
	seen := map[uint16]bool{}
	for next := 0; next < total; next++ {
		typ, body := readFrame(t, nc)
		require.Equal(t, byte(0x30), typ>>4<<4, "PUBLISH")
		tl := int(body[0])<<8 | int(body[1])
		pid := uint16(body[2+tl])<<8 | uint16(body[3+tl])
		require.Contains(t, st.pids(), pid, "sent with the identifier it was stored with")
		require.False(t, seen[pid])
		seen[pid] = true
		props := int(body[4+tl]) // a one-byte length here
		require.Equal(t, []byte{byte(next)}, body[5+tl+props:], "in order")
		_, err := nc.Write([]byte{0x40, 2, byte(pid >> 8), byte(pid)})
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return len(st.pids()) == 0 }, 5*time.Second, 10*time.Millisecond,
		"each acknowledged message leaves the store")
}
