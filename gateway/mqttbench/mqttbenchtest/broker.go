// Package mqttbenchtest runs an in-process MQTT broker (mochi-mqtt, allow
// all) on loopback ports for tests of MQTT clients and load tools.
package mqttbenchtest

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"
)

// Broker is a running in-process broker.
type Broker struct {
	Server *mqtt.Server
	// Addr is the MQTT over TCP address, tcp://127.0.0.1:port.
	Addr string
	// WSAddr is the MQTT over websocket address, ws://127.0.0.1:port/mqtt.
	WSAddr string

	closeOnce sync.Once
}

// Close stops the broker; it may be called more than once (mochi's own
// Close panics on a second call). Clients are disconnected first, and
// Close waits until they are gone: mochi's listener close takes the
// clients' read lock twice and deadlocks if a client leaves in between
// (mochi v2.7.9).
func (b *Broker) Close() {
	b.closeOnce.Do(func() {
		for _, cl := range b.Server.Clients.GetAll() {
			if !cl.Closed() {
				cl.Stop(packets.ErrServerShuttingDown)
			}
		}
		deadline := time.Now().Add(10 * time.Second)
		for atomic.LoadInt64(&b.Server.Info.ClientsConnected) > 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		_ = b.Server.Close()
	})
}

// Options adjust a test broker.
type Options struct {
	// Auth decides who may connect and use which topics; default: all.
	Auth mqtt.Hook
}

// Start starts a broker with one TCP and one websocket listener on free
// loopback ports; t's cleanup closes it.
func Start(t testing.TB, o Options) *Broker {
	t.Helper()
	if o.Auth == nil {
		o.Auth = new(allowAll)
	}
	caps := mqtt.NewDefaultServerCapabilities()
	caps.MaximumClientWritesPending = 1024 // default 8,192: 64 KiB a client
	s := mqtt.New(&mqtt.Options{Logger: slog.New(slog.DiscardHandler), Capabilities: caps})
	require.NoError(t, s.AddHook(o.Auth, nil))
	tcp := listeners.NewTCP(listeners.Config{ID: "tcp", Address: "127.0.0.1:0"})
	require.NoError(t, s.AddListener(tcp)) // binds: Address() is the bound address now
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ws := &wsListener{ln: ln}
	require.NoError(t, s.AddListener(ws))
	require.NoError(t, s.Serve())
	b := &Broker{Server: s, Addr: "tcp://" + tcp.Address(), WSAddr: "ws://" + ln.Addr().String() + "/mqtt"}
	t.Cleanup(b.Close)
	return b
}

// allowAll lets every client connect and use every topic: mochi's
// auth.AllowHook, whose package needs gopkg.in/yaml.v3 (not in go.sum).
type allowAll struct{ mqtt.HookBase }

func (*allowAll) ID() string { return "allow-all" }

func (*allowAll) Provides(b byte) bool {
	return b == mqtt.OnConnectAuthenticate || b == mqtt.OnACLCheck
}

func (*allowAll) OnConnectAuthenticate(*mqtt.Client, packets.Packet) bool { return true }

func (*allowAll) OnACLCheck(*mqtt.Client, string, bool) bool { return true }

// wsListener serves MQTT over websocket [MQTT-6.0.0-4] on a listener
// bound before (mochi's own binds in Serve, which hides a port 0).
type wsListener struct {
	ln     net.Listener
	mu     sync.Mutex // guards srv and closed
	srv    *http.Server
	closed bool
}

func (l *wsListener) ID() string       { return "ws" }
func (l *wsListener) Address() string  { return l.ln.Addr().String() }
func (l *wsListener) Protocol() string { return "ws" }

func (l *wsListener) Init(*slog.Logger) error { return nil }

func (l *wsListener) Serve(establish listeners.EstablishFn) {
	up := websocket.Upgrader{Subprotocols: []string{"mqtt"}, CheckOrigin: func(*http.Request) bool { return true }}
	l.mu.Lock()
	l.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		_ = establish("ws", &wsConn{Conn: c.UnderlyingConn(), c: c})
	})}
	closed := l.closed
	l.mu.Unlock()
	if !closed {
		_ = l.srv.Serve(l.ln)
	}
}

func (l *wsListener) Close(closeClients listeners.CloseFn) {
	l.mu.Lock()
	l.closed = true
	srv := l.srv
	l.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
	_ = l.ln.Close()
	closeClients("ws")
}

// wsConn is a websocket connection as a byte stream: MQTT packets may
// span binary messages [MQTT-6.0.0-2].
type wsConn struct {
	net.Conn
	c *websocket.Conn
	r io.Reader // the current message; nil between messages
}

func (w *wsConn) Read(p []byte) (int, error) {
	for {
		if w.r == nil {
			op, r, err := w.c.NextReader()
			if err != nil {
				return 0, err
			}
			if op != websocket.BinaryMessage {
				return 0, errors.New("mqttbenchtest: websocket message is not binary")
			}
			w.r = r
		}
		n, err := w.r.Read(p)
		if errors.Is(err, io.EOF) {
			w.r, err = nil, nil
			if n == 0 {
				continue
			}
		}
		return n, err
	}
}

func (w *wsConn) Write(p []byte) (int, error) {
	if err := w.c.WriteMessage(websocket.BinaryMessage, p); err != nil {
		return 0, err
	}
	return len(p), nil
}
