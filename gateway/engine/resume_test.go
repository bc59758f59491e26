package engine_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// restoredStore is a session store whose Load gives one offline session
// ("car") with n queued QoS 1 messages, as a restarted node finds it;
// LoadMessages fails while failing is set.
type restoredStore struct {
	*memStore
	n       int
	failing atomic.Bool
}

func (r *restoredStore) messages() []engine.StoredMessage {
	out := make([]engine.StoredMessage, r.n)
	for i := range out {
		out[i] = engine.StoredMessage{PID: uint16(i + 1), Message: &engine.Message{Topic: "cmd/car", QoS: 1,
			Payload: fmt.Appendf(nil, "m%02d", i)}}
	}
	return out
}

func (r *restoredStore) Load() ([]engine.StoredSession, []*engine.Message, error) {
	return []engine.StoredSession{{Client: engine.ClientRecord{ID: "car", Protocol: 5, Expiry: 3600},
		Offline: time.Now(), Messages: r.messages()}}, nil, nil
}

func (r *restoredStore) LoadMessages(string) ([]engine.StoredMessage, error) {
	if r.failing.Load() {
		return nil, errors.New("disk on fire")
	}
	return r.messages(), nil
}

// TestResumeKeepsToTheReceiveMaximum: a restored session's messages are
// sent again (DUP) no more than the client's Receive Maximum at a time
// [MQTT-3.3.4-9], the next as each is acknowledged, all in order.
func TestResumeKeepsToTheReceiveMaximum(t *testing.T) {
	st := &restoredStore{memStore: newMemStore(), n: 10}
	_, addr := start(t, engine.Options{Hooks: engine.Hooks{Sessions: st}})
	var mu sync.Mutex
	var got []string
	var inflight, most atomic.Int32
	acks := make(chan *paho.Publish, 16)
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	c := paho.NewClient(paho.ClientConfig{Conn: conn, EnableManualAcknowledgment: true,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			mu.Lock()
			got = append(got, string(pr.Packet.Payload))
			mu.Unlock()
			if n := inflight.Add(1); n > most.Load() {
				most.Store(n)
			}
			acks <- pr.Packet
			return true, nil
		}}})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	ca, err := c.Connect(ctx, &paho.Connect{ClientID: "car", KeepAlive: 30,
		Properties: &paho.ConnectProperties{SessionExpiryInterval: new(uint32(3600)), ReceiveMaximum: new(uint16(3))}})
	require.NoError(t, err)
	require.True(t, ca.SessionPresent)
	t.Cleanup(func() { _ = c.Disconnect(&paho.Disconnect{}) })
	for range 10 {
		select {
		case p := <-acks:
			time.Sleep(20 * time.Millisecond) // let the engine send more than it may, if it would
			inflight.Add(-1)
			require.NoError(t, c.Ack(p))
		case <-time.After(5 * time.Second):
			t.Fatalf("got %v", got)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	want := make([]string, 10)
	for i := range want {
		want[i] = fmt.Sprintf("m%02d", i)
	}
	require.Equal(t, want, got)
	require.LessOrEqual(t, most.Load(), int32(3), "never more in flight than the Receive Maximum")
}

// TestResumeWaitsForTheStore: when the store cannot give a session's
// queued messages back, the connection ends (DISCONNECT 0x89 Server busy)
// and the session keeps them; the next connection gets them.
func TestResumeWaitsForTheStore(t *testing.T) {
	st := &restoredStore{memStore: newMemStore(), n: 3}
	st.failing.Store(true)
	_, addr := start(t, engine.Options{Hooks: engine.Hooks{Sessions: st}})
	connect := func(got chan string) (*paho.Client, chan *paho.Disconnect) {
		gone := make(chan *paho.Disconnect, 1)
		conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
		require.NoError(t, err)
		c := paho.NewClient(paho.ClientConfig{Conn: conn,
			OnServerDisconnect: func(d *paho.Disconnect) { gone <- d },
			OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
				got <- string(pr.Packet.Payload)
				return true, nil
			}}})
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		_, err = c.Connect(ctx, &paho.Connect{ClientID: "car", KeepAlive: 30,
			Properties: &paho.ConnectProperties{SessionExpiryInterval: new(uint32(3600))}})
		require.NoError(t, err)
		return c, gone
	}
	got := make(chan string, 10)
	_, gone := connect(got)
	select {
	case d := <-gone:
		require.Equal(t, byte(0x89), d.ReasonCode)
	case <-time.After(5 * time.Second):
		t.Fatal("not disconnected")
	}
	require.Empty(t, got)

	st.failing.Store(false)
	c, _ := connect(got)
	t.Cleanup(func() { _ = c.Disconnect(&paho.Disconnect{}) })
	for i := range 3 {
		select {
		case p := <-got:
			require.Equal(t, fmt.Sprintf("m%02d", i), p)
		case <-time.After(5 * time.Second):
			t.Fatal("the messages did not come once the store was back")
		}
	}
}
