package listener

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitFor bounds every wait in these tests. It is generous: a test that
// passes never comes near it.
const waitFor = 10 * time.Second

// testListener is what both listener types offer.
type testListener interface {
	listeners.Listener
	Stats() Stats
}

// broker is a real mochi server with one listener.
type broker struct {
	srv       *mqtt.Server
	closeOnce sync.Once
}

// startBroker runs a mochi server that lets everyone in, serving on l.
func startBroker(t testing.TB, l listeners.Listener) *broker {
	t.Helper()
	srv := mqtt.New(&mqtt.Options{
		InlineClient: false,
		Logger:       slog.New(slog.DiscardHandler),
	})
	require.NoError(t, srv.AddHook(new(allowAll), nil))
	require.NoError(t, srv.AddListener(l))
	require.NoError(t, srv.Serve())
	b := &broker{srv: srv}
	t.Cleanup(b.close)
	return b
}

// allowAll lets every client connect and use every topic. It stands in for
// mochi's auth.AllowHook, whose package needs gopkg.in/yaml.v3, which is not
// in go.sum.
type allowAll struct{ mqtt.HookBase }

func (*allowAll) ID() string { return "allow-all" }

func (*allowAll) Provides(b byte) bool {
	return b == mqtt.OnConnectAuthenticate || b == mqtt.OnACLCheck
}

func (*allowAll) OnConnectAuthenticate(*mqtt.Client, packets.Packet) bool { return true }

func (*allowAll) OnACLCheck(*mqtt.Client, string, bool) bool { return true }

// close closes the server once; mochi's Close panics on a second call.
func (b *broker) close() {
	b.closeOnce.Do(func() { _ = b.srv.Close() })
}

func tlsFile(name string) string {
	return filepath.Join("..", "..", "testdata", "tls", name)
}

// serverTLS loads the test server certificate; with mTLS set, clients must
// present a certificate signed by the test CA.
func serverTLS(t testing.TB, mTLS bool) *tls.Config {
	t.Helper()
	ca := ""
	if mTLS {
		ca = tlsFile("ca.pem")
	}
	cfg, err := LoadTLS(tlsFile("server.pem"), tlsFile("server-key.pem"), ca)
	require.NoError(t, err)
	return cfg
}

// clientTLS trusts the test CA and, when cert is not empty, presents
// testdata/tls/<cert>.pem.
func clientTLS(t testing.TB, cert string) *tls.Config {
	t.Helper()
	caPEM, err := os.ReadFile(tlsFile("ca.pem"))
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(caPEM))
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(tlsFile(cert+".pem"), tlsFile(cert+"-key.pem"))
		require.NoError(t, err)
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg
}

// connectPaho connects a paho client to broker (a URL such as
// tcp://127.0.0.1:1883) and disconnects it at cleanup.
func connectPaho(t testing.TB, broker, clientID string, tc *tls.Config) (paho.Client, error) {
	t.Helper()
	opts := paho.NewClientOptions().
		AddBroker(broker).
		SetClientID(clientID).
		SetProtocolVersion(4). // no fallback to 3.1 on failure: one dial per Connect
		SetTLSConfig(tc).
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetConnectTimeout(waitFor).
		SetWebsocketOptions(&paho.WebsocketOptions{
			Proxy: func(*http.Request) (*url.URL, error) { return nil, nil },
		})
	c := paho.NewClient(opts)
	tok := c.Connect()
	if !tok.WaitTimeout(waitFor) {
		return nil, fmt.Errorf("connect %s: timed out", broker)
	}
	if err := tok.Error(); err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Disconnect(100) })
	return c, nil
}

// roundTrip subscribes c to a topic, publishes to it and waits for the
// message to come back.
func roundTrip(t testing.TB, c paho.Client) {
	t.Helper()
	got := make(chan []byte, 1)
	tok := c.Subscribe("test/echo", 1, func(_ paho.Client, m paho.Message) {
		select {
		case got <- m.Payload():
		default:
		}
	})
	require.True(t, tok.WaitTimeout(waitFor), "subscribe timed out")
	require.NoError(t, tok.Error())

	tok = c.Publish("test/echo", 1, false, []byte("hello"))
	require.True(t, tok.WaitTimeout(waitFor), "publish timed out")
	require.NoError(t, tok.Error())

	select {
	case p := <-got:
		require.Equal(t, []byte("hello"), p)
	case <-time.After(waitFor):
		t.Fatal("message did not come back")
	}
}

// dialSilent opens a TCP connection to addr that never sends a byte.
func dialSilent(t testing.TB, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// requireClosedByPeer reads from c until the peer closes it, failing if
// that takes longer than waitFor.
func requireClosedByPeer(t testing.TB, c net.Conn) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(waitFor)))
	buf := make([]byte, 512)
	for {
		_, err := c.Read(buf)
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("connection still open after %v", waitFor)
		}
		return
	}
}

// syncBuffer is a bytes.Buffer safe to use as a log writer.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
