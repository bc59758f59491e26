package gateway_test

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"testing"
	"time"

	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway"
	"github.com/ferrymq/ferrymq/gateway/gatewaytest"
)

// Devices on WebSocket and on TLS (with a client certificate) are bridged
// like TCP ones.
func TestWebsocketAndTLSListenersBridge(t *testing.T) {
	srvTLS, err := gateway.LoadTLS("../testdata/tls/server.pem", "../testdata/tls/server-key.pem", "../testdata/tls/ca.pem")
	require.NoError(t, err)
	env := gatewaytest.Start(t, gatewaytest.Options{Gateway: gateway.Options{Listeners: []gateway.Listener{
		{Type: "tcp", Addr: "127.0.0.1:0"},
		{Type: "ws", Addr: "127.0.0.1:0"},
		{Type: "tcp", Addr: "127.0.0.1:0", TLS: srvTLS},
	}}})
	require.Equal(t, []string{"tcp", "ws", "tls"}, env.Gateway.Listeners())

	ws := dialV3(t, env.WS, "ws-dev", func(o *paho3.ClientOptions) {
		o.Servers = nil
		o.AddBroker("ws://" + env.WS + "/mqtt")
	})
	tok := ws.Publish("telemetry/ws-dev", 1, false, "over ws")
	require.True(t, tok.WaitTimeout(5*time.Second))
	require.NoError(t, tok.Error())

	pool := x509.NewCertPool()
	ca, err := os.ReadFile("../testdata/tls/ca.pem")
	require.NoError(t, err)
	require.True(t, pool.AppendCertsFromPEM(ca))
	cert, err := tls.LoadX509KeyPair("../testdata/tls/client.pem", "../testdata/tls/client-key.pem")
	require.NoError(t, err)
	tlsAddr := env.Gateway.Addr("tls").String()
	sec := dialV3(t, tlsAddr, "tls-dev", func(o *paho3.ClientOptions) {
		o.Servers = nil
		o.AddBroker("ssl://" + tlsAddr)
		o.SetTLSConfig(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, ServerName: "localhost"})
	})
	tok = sec.Publish("telemetry/tls-dev", 1, false, "over tls")
	require.True(t, tok.WaitTimeout(5*time.Second))
	require.NoError(t, tok.Error())

	got := byKey(readAll(t, env.Store, "telemetry"))
	require.Equal(t, []string{"over ws"}, got["ws-dev"])
	require.Equal(t, []string{"over tls"}, got["tls-dev"])
}
