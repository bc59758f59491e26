package engine_test

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

func tlsFile(name string) string { return filepath.Join("..", "..", "testdata", "tls", name) }

// serverTLS is the test server certificate; with mtls, clients must present
// one signed by the test CA.
func serverTLS(t testing.TB, mtls bool) *tls.Config {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(tlsFile("server.pem"), tlsFile("server-key.pem"))
	require.NoError(t, err)
	cfg := &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	if mtls {
		cfg.ClientCAs = caPool(t)
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg
}

func caPool(t testing.TB) *x509.CertPool {
	t.Helper()
	pem, err := os.ReadFile(tlsFile("ca.pem"))
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(pem))
	return pool
}

// clientTLS trusts the test CA and presents testdata/tls/<cert>.pem when
// cert is set.
func clientTLS(t testing.TB, cert string) *tls.Config {
	t.Helper()
	cfg := &tls.Config{RootCAs: caPool(t), MinVersion: tls.VersionTLS12}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(tlsFile(cert+".pem"), tlsFile(cert+"-key.pem"))
		require.NoError(t, err)
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg
}

func connectURL(t testing.TB, broker, id string, tc *tls.Config) (paho3.Client, error) {
	t.Helper()
	o := paho3.NewClientOptions().AddBroker(broker).SetClientID(id).SetProtocolVersion(4).SetTLSConfig(tc).
		SetAutoReconnect(false).SetConnectRetry(false).SetConnectTimeout(10 * time.Second).
		SetWebsocketOptions(&paho3.WebsocketOptions{Proxy: func(*http.Request) (*url.URL, error) { return nil, nil }})
	c := paho3.NewClient(o)
	tok := c.Connect()
	if !tok.WaitTimeout(10 * time.Second) {
		return nil, fmt.Errorf("connect %s: timed out", broker)
	}
	if err := tok.Error(); err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Disconnect(50) })
	return c, nil
}

// TestListenersCarryMQTT: the same broker over TCP, TLS, mTLS, WebSocket
// and WSS — a message published on one listener reaches subscribers on all
// the others.
func TestListenersCarryMQTT(t *testing.T) {
	e, _ := start(t, engine.Options{Listeners: []engine.Listener{
		{Type: "tcp", Addr: "127.0.0.1:0"},
		{Type: "tcp", Addr: "127.0.0.1:0", TLS: serverTLS(t, false)},
		{Name: "mtls", Type: "tcp", Addr: "127.0.0.1:0", TLS: serverTLS(t, true)},
		{Type: "ws", Addr: "127.0.0.1:0"},
		{Type: "ws", Addr: "127.0.0.1:0", TLS: serverTLS(t, false)},
	}})
	urls := map[string]string{
		"tcp":  "tcp://" + e.Addr("tcp").String(),
		"tls":  "ssl://" + e.Addr("tls").String(),
		"mtls": "ssl://" + e.Addr("mtls").String(),
		"ws":   "ws://" + e.Addr("ws").String() + "/mqtt",
		"wss":  "wss://" + e.Addr("wss").String() + "/mqtt",
	}
	tc := map[string]*tls.Config{"tls": clientTLS(t, ""), "mtls": clientTLS(t, "client"), "wss": clientTLS(t, "")}
	boxes := map[string]*inbox{}
	for name, u := range urls {
		in := &inbox{}
		boxes[name] = in
		c, err := connectURL(t, u, "sub-"+name, tc[name])
		require.NoError(t, err, name)
		wait(t, c.Subscribe("all/#", 1, in.handler))
	}
	for name, u := range urls {
		c, err := connectURL(t, u, "pub-"+name, tc[name])
		require.NoError(t, err, name)
		wait(t, c.Publish("all/"+name, 1, false, []byte(name)))
	}
	for name, in := range boxes {
		require.Eventually(t, func() bool { return len(in.payloads()) == len(urls) }, 10*time.Second, 10*time.Millisecond, name)
	}

	// mTLS without a client certificate, or with one the CA did not sign,
	// fails the handshake.
	_, err := connectURL(t, urls["mtls"], "nocert", clientTLS(t, ""))
	require.Error(t, err)
	_, err = connectURL(t, urls["mtls"], "untrusted", clientTLS(t, "client-untrusted"))
	require.Error(t, err)
}

// TestMTLSIdentityReachesAuthentication: the client certificate is in the
// ConnectInfo the authenticator sees.
func TestMTLSIdentityReachesAuthentication(t *testing.T) {
	seen := make(chan *tls.ConnectionState, 1)
	e, _ := start(t, engine.Options{
		Listeners: []engine.Listener{{Name: "mtls", Type: "tcp", Addr: "127.0.0.1:0", TLS: serverTLS(t, true)}},
		Hooks:     engine.Hooks{Auth: authFunc(func(ci *engine.ConnectInfo) (engine.Identity, error) { seen <- ci.TLS; return engine.Identity{}, nil })},
	})
	_, err := connectURL(t, "ssl://"+e.Addr("mtls").String(), "car-1", clientTLS(t, "client"))
	require.NoError(t, err)
	st := <-seen
	require.NotNil(t, st)
	require.Len(t, st.PeerCertificates, 1)
	require.NotEmpty(t, st.VerifiedChains)
}
