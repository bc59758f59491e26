package node_test

import (
	"encoding/json"
	"net"
	"net/http"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/gateway/alarm"
	"github.com/ferrymq/ferrymq/gateway/node"
)

// Secure by default (docs/security.md): without auth, an MQTT listener
// beyond loopback is refused before anything is opened, whichever way it
// is configured; loopback, a name that resolves to it, and a listener
// that requires client certificates are allowed.
func TestSecureDefaultRefusesAnonymousBeyondLoopback(t *testing.T) {
	dir := t.TempDir()
	cert, key := writeCert(t, dir, "server", time.Now().Add(365*24*time.Hour))
	for name, c := range map[string]struct {
		change  func(*node.Options)
		refused bool
	}{
		"tcp on every interface": {func(o *node.Options) { o.MQTTAddr = ":0" }, true},
		"tcp on 0.0.0.0":         {func(o *node.Options) { o.MQTTAddr = "0.0.0.0:0" }, true},
		"websocket on [::]":      {func(o *node.Options) { o.WSAddr = "[::]:0" }, true},
		"tls without client_ca":  {func(o *node.Options) { o.TLS = []node.TLSListener{{Type: "tcp", Addr: ":0", Cert: cert, Key: key}} }, true},
		"loopback":               {func(o *node.Options) {}, false},
		"localhost":              {func(o *node.Options) { o.MQTTAddr = "localhost:0" }, false},
		"ipv6 loopback":          {func(o *node.Options) { o.WSAddr = "[::1]:0" }, false},
		"mtls on every interface": {func(o *node.Options) {
			o.TLS = []node.TLSListener{{Type: "tcp", Addr: ":0", Cert: cert, Key: key, ClientCA: cert}}
		}, false},
		"auth configured": {func(o *node.Options) {
			o.MQTTAddr, o.Auth = ":0", &node.AuthOptions{HMAC: &auth.HMACOptions{ProductSecrets: map[string][]byte{"fleet": []byte("s3cret")}}}
		}, false},
	} {
		t.Run(name, func(t *testing.T) {
			o := options(t)
			o.Core, o.Delay, o.Trace, o.HTTPAddr = nil, nil, nil, ""
			c.change(&o)
			n, err := node.New(t.Context(), o, nil)
			if !c.refused {
				require.NoError(t, err)
				require.Empty(t, n.AnonymousListeners())
				shutdown(t, n)
				return
			}
			require.ErrorIs(t, err, node.ErrAnonymousBeyondLoopback)
			require.ErrorContains(t, err, "auth: {anonymous: true}", "the message says the ways out")
			require.Nil(t, n)
		})
	}
}

// With auth: {anonymous: true}, a listener beyond loopback is allowed and
// said loudly: AnonymousListeners, /stats "security", the gauge and the
// anonymous_access alarm (one per listener; the loopback one is not
// listed). Started again with it on loopback, the restored alarm clears.
func TestSecureDefaultAnonymousIsSaidLoudly(t *testing.T) {
	hook := newHookSink(t)
	o := options(t)
	o.Alarms = alarmOptions(hook)
	o.Auth = &node.AuthOptions{Anonymous: true}
	o.MQTTAddr = "0.0.0.0:0" // listens on every interface; the test talks only to 127.0.0.1
	n, err := node.New(t.Context(), o, nil)
	require.NoError(t, err)
	open := n.AnonymousListeners()
	require.Len(t, open, 1, "the websocket listener is on loopback")
	require.Equal(t, "tcp", open[0].Name)
	_, port, err := net.SplitHostPort(open[0].Addr)
	require.NoError(t, err)

	c := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://127.0.0.1:" + port).SetClientID("anon-1").SetAutoReconnect(false))
	tok := c.Connect()
	require.True(t, tok.WaitTimeout(10*time.Second))
	require.NoError(t, tok.Error(), "no credentials, let in")
	c.Disconnect(100)

	e := hook.wait(t, alarm.KindAnonymous, "tcp", alarm.StateRaised)
	require.Contains(t, e.Message, open[0].Addr)
	require.True(t, activeKinds(t, n)["anonymous_access tcp"])
	code, body := httpGet(t, n, "/stats")
	require.Equal(t, http.StatusOK, code)
	var stats struct {
		Security struct {
			AnonymousListeners []string `json:"anonymous_listeners"`
		} `json:"security"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &stats))
	require.Equal(t, []string{"tcp " + open[0].Addr}, stats.Security.AnonymousListeners)
	_, metrics := httpGet(t, n, "/metrics")
	require.Contains(t, metrics, "\nferrymq_mqtt_anonymous_listeners 1\n")
	require.Eventually(t, func() bool { return len(storedEvents(t, n.Broker())) == 1 }, 10*time.Second, 20*time.Millisecond)
	shutdown(t, n)

	o.MQTTAddr = "127.0.0.1:0" // the same data folder
	n, err = node.New(t.Context(), o, nil)
	require.NoError(t, err)
	defer shutdown(t, n)
	hook.wait(t, alarm.KindAnonymous, "tcp", alarm.StateCleared)
	require.Empty(t, n.AnonymousListeners())
	_, metrics = httpGet(t, n, "/metrics")
	require.Contains(t, metrics, "\nferrymq_mqtt_anonymous_listeners 0\n")
	_, body = httpGet(t, n, "/stats")
	var raw struct {
		Security map[string]json.RawMessage `json:"security"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &raw))
	require.Equal(t, "[]", string(raw.Security["anonymous_listeners"]), "an empty list, not null")
	require.Len(t, hook.find(alarm.KindAnonymous, "", alarm.StateRaised), 1)
}
