package engine_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
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
// [MQTT-3.3.4-9], the next as each is acknowledged, all in order. The
// client is raw MQTT: paho's manual acknowledgement forgets PUBLISHes that
// arrive in the instant after its CONNACK (it resets its ack tracker
// after starting its reader), and a resumed session's arrive exactly then.
func TestResumeKeepsToTheReceiveMaximum(t *testing.T) {
	st := &restoredStore{memStore: newMemStore(), n: 10}
	_, addr := start(t, engine.Options{Hooks: engine.Hooks{Sessions: st}})
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	// Not a clean start; Session Expiry 3600, Receive Maximum 3.
	_, err = c.Write(packet(0x10, str("MQTT"), []byte{5, 0x00, 0, 30},
		[]byte{8, 0x11, 0, 0, 0x0E, 0x10, 0x21, 0, 3}, str("car")))
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	first, body := readFrame(t, c)
	require.Equal(t, byte(0x20), first, "CONNACK")
	require.Equal(t, byte(1), body[0]&1, "Session Present")
	require.Equal(t, byte(0), body[1], "accepted")

	var got []string
	var outstanding []uint16
	for len(got) < 10 {
		// While some are unacknowledged, wait a little for more than the
		// engine may send; then acknowledge the oldest.
		wait := 5 * time.Second
		if len(outstanding) > 0 {
			wait = 20 * time.Millisecond
		}
		require.NoError(t, c.SetReadDeadline(time.Now().Add(wait)))
		var b [1]byte
		if _, err := io.ReadFull(c, b[:]); err != nil {
			require.ErrorIs(t, err, os.ErrDeadlineExceeded, "got %v", got)
			require.NotEmpty(t, outstanding, "nothing sent for 5 s; got %v", got)
			_, err = c.Write(packet(0x40, []byte{byte(outstanding[0] >> 8), byte(outstanding[0])}))
			require.NoError(t, err)
			outstanding = outstanding[1:]
			continue
		}
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		first, p := parsePublishV5(t, io.MultiReader(bytes.NewReader(b[:]), c))
		require.Equal(t, byte(0x3A), first, "PUBLISH, DUP, QoS 1")
		require.Equal(t, "cmd/car", p.topic)
		got = append(got, p.payload)
		outstanding = append(outstanding, p.pid)
		require.LessOrEqual(t, len(outstanding), 3, "never more in flight than the Receive Maximum")
	}
	want := make([]string, 10)
	for i := range want {
		want[i] = fmt.Sprintf("m%02d", i)
	}
	require.Equal(t, want, got)
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
