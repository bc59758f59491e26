package admin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/retry"
	"github.com/ferrymq/ferrymq/gateway/admin"
	"github.com/ferrymq/ferrymq/gateway/gatewaytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// token is what the writes of the tests authorize with.
const token = "s3cret-admin-token"

// env is a running gateway (real store, sessions), group coordinator and
// retry service, with the admin API served over HTTP.
type env struct {
	gw     *gatewaytest.Env
	groups *group.Coordinator
	retry  *retry.Service
	url    string
}

// start runs everything until the test ends; tune adjusts the admin
// options (by default writes need the bearer token).
func start(t testing.TB, tune func(*admin.Options)) *env {
	t.Helper()
	gw := gatewaytest.Start(t, gatewaytest.Options{Sessions: true})
	groups, err := group.New(gw.Store, group.Options{})
	require.NoError(t, err)
	groups.Start()
	t.Cleanup(func() { require.NoError(t, groups.Close()) })
	rs, err := retry.New(gw.Store, retry.Options{})
	require.NoError(t, err)
	rs.Start()
	t.Cleanup(func() { require.NoError(t, rs.Close()) })
	opts := admin.Options{
		Broker: gw.Store, Groups: groups, Retry: rs, Gateway: gw.Gateway, Sessions: gw.Sessions,
		Node: "node-1", Version: "ferrymq v9.9.9-test",
		Config:    map[string]any{"http": map[string]string{"addr": "127.0.0.1:0"}, "core": map[string]string{"token": "<redacted>"}},
		Authorize: admin.BearerAuthorizer(token),
	}
	if tune != nil {
		tune(&opts)
	}
	h, err := admin.New(opts)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &env{gw: gw, groups: groups, retry: rs, url: srv.URL}
}

// reply is an HTTP answer.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// json decodes the body into a fresh T.
func decode[T any](t testing.TB, r reply) T {
	t.Helper()
	var v T
	require.NoError(t, json.Unmarshal(r.body, &v), "body %s", r.body)
	return v
}

// errBody is an error answer.
type errBody struct {
	Error string `json:"error"`
	Code  string `json:"code"`
}

// requireError checks an error answer's status and code.
func requireError(t testing.TB, r reply, status int, code string) {
	t.Helper()
	require.Equal(t, status, r.status, "body %s", r.body)
	require.Equal(t, "application/json", r.header.Get("Content-Type"))
	e := decode[errBody](t, r)
	require.Equal(t, code, e.Code, "error %q", e.Error)
	require.NotEmpty(t, e.Error)
}

// do sends a request; writes (POST, DELETE) carry the token unless noAuth.
func (e *env) do(t testing.TB, method, path, body string) reply {
	t.Helper()
	hdr := http.Header{}
	if method != http.MethodGet {
		hdr.Set("Authorization", "Bearer "+token)
	}
	return e.doWith(t, method, path, body, hdr)
}

func (e *env) get(t testing.TB, path string) reply {
	t.Helper()
	return e.do(t, http.MethodGet, path, "")
}

func (e *env) doWith(t testing.TB, method, path, body string, hdr http.Header) reply {
	t.Helper()
	return send(t, e.url, method, path, body, hdr)
}

func send(t testing.TB, base, method, path, body string, hdr http.Header) reply {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, base+path, rd)
	require.NoError(t, err)
	for k, v := range hdr {
		req.Header[k] = v
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return reply{status: res.StatusCode, header: res.Header, body: b}
}

// produce stores bodies in topic (sharding key "k": one queue) and returns
// the stored messages.
func (e *env) produce(t testing.TB, topic string, bodies ...string) []core.SendResult {
	t.Helper()
	var out []core.SendResult
	for _, b := range bodies {
		r, err := e.gw.Store.Produce(t.Context(), &core.Message{Topic: topic, ShardingKey: "k", Body: []byte(b)})
		require.NoError(t, err)
		out = append(out, r)
	}
	return out
}

// dialV3 connects a paho MQTT 3.1.1 client; the test's cleanup disconnects
// it.
func dialV3(t testing.TB, addr, id string, tune ...func(*paho3.ClientOptions)) paho3.Client {
	t.Helper()
	o := paho3.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).
		SetAutoReconnect(false).SetConnectRetry(false).SetProtocolVersion(4).SetKeepAlive(30 * time.Second)
	for _, f := range tune {
		f(o)
	}
	c := paho3.NewClient(o)
	tok := c.Connect()
	require.True(t, tok.WaitTimeout(10*time.Second), "connect %s timed out", id)
	require.NoError(t, tok.Error(), "connect %s", id)
	t.Cleanup(func() { c.Disconnect(100) })
	return c
}

// wait waits for a paho 3 token.
func wait(t testing.TB, tok paho3.Token) {
	t.Helper()
	require.True(t, tok.WaitTimeout(10*time.Second), "timed out")
	require.NoError(t, tok.Error())
}

// dialV5 connects a paho.golang MQTT 5 client with a clean start;
// onDisconnect is told of a DISCONNECT from the server.
func dialV5(t testing.TB, addr, id string, onDisconnect func(*paho.Disconnect)) *paho.Client {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	c := paho.NewClient(paho.ClientConfig{Conn: conn, OnServerDisconnect: onDisconnect})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ca, err := c.Connect(ctx, &paho.Connect{ClientID: id, KeepAlive: 30, CleanStart: true})
	require.NoError(t, err, "connect %s", id)
	require.Equal(t, byte(0), ca.ReasonCode)
	t.Cleanup(func() {
		_ = c.Disconnect(&paho.Disconnect{ReasonCode: 0})
		<-c.Done()
	})
	return c
}

// requireNoSecret checks that an answer does not hold s.
func requireNoSecret(t testing.TB, r reply, s string) {
	t.Helper()
	require.False(t, bytes.Contains(r.body, []byte(s)), "answer holds a secret: %s", r.body)
}
