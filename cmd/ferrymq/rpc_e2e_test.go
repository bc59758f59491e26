package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/trace"
	"github.com/ferrymq/ferrymq/core/wire"
)

// TestRPCFromEveryFront: a device (MQTT 3.1.1, by the topic convention)
// answers calls made with `ferrymq rpc`, the Go client and the HTTP API;
// a call to a device nobody has connected fails at once on each, one it
// does not answer times out; the call's hops are traced.
func TestRPCFromEveryFront(t *testing.T) {
	addrs := serveAddrs(t, "trace: {all: true, node: gw-1}\n")
	o := paho3.NewClientOptions().AddBroker("tcp://" + addrs["tcp"]).SetClientID("car-42").SetProtocolVersion(4).SetAutoReconnect(false)
	o.SetDefaultPublishHandler(func(c paho3.Client, m paho3.Message) {
		if string(m.Payload()) == "ignore me" {
			return
		}
		go c.Publish(strings.Replace(m.Topic(), "/request/", "/response/", 1), 1, false, "ok:"+string(m.Payload()))
	})
	dev := paho3.NewClient(o)
	tok := dev.Connect()
	require.True(t, tok.WaitTimeout(10*time.Second))
	require.NoError(t, tok.Error())
	t.Cleanup(func() { dev.Disconnect(100) })

	// The CLI prints the answer as it came.
	r := cli(t, t.Context(), "", "rpc", "--server", addrs["core"], "--client", "car-42", "unlock")
	require.NoError(t, r.runErr, r.err)
	require.Equal(t, "ok:unlock", r.out)
	r = cli(t, t.Context(), "from stdin", "rpc", "--server", addrs["core"], "--client", "car-42", "--json", "-")
	require.NoError(t, r.runErr, r.err)
	var a wire.CallResp
	require.NoError(t, json.Unmarshal([]byte(r.out), &a))
	require.Equal(t, "ok:from stdin", string(a.Payload))

	r = cli(t, t.Context(), "", "rpc", "--server", addrs["core"], "--client", "car-0", "x")
	requireOneLineError(t, r, "not connected")
	r = cli(t, t.Context(), "", "rpc", "--server", addrs["core"], "--client", "car-42", "--timeout", "90s", "x")
	requireOneLineError(t, r, "--timeout")

	// The Go client.
	c, err := client.Dial(t.Context(), client.Options{Addr: addrs["core"]})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	a, err = c.Call(t.Context(), "car-42", []byte("go"))
	require.NoError(t, err)
	require.Equal(t, "ok:go", string(a.Payload))
	_, err = c.Call(t.Context(), "car-0", []byte("go"))
	require.ErrorIs(t, err, wire.ErrDeviceNotConnected)
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	_, err = c.Call(ctx, "car-42", []byte("ignore me"))
	cancel()
	require.ErrorIs(t, err, wire.ErrDeviceTimeout)

	// The HTTP API.
	post := func(id, body string) (int, map[string]any) {
		resp, err := http.Post("http://"+addrs["http"]+"/api/v1/devices/"+id+"/rpc", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		var out map[string]any
		require.NoError(t, json.Unmarshal(b, &out), "%s", b)
		return resp.StatusCode, out
	}
	status, out := post("car-42", `{"payload":"http","timeout_ms":2000}`)
	require.Equal(t, http.StatusOK, status, "%v", out)
	require.Equal(t, "ok:http", out["payload"])
	status, out = post("car-0", `{"payload":"http"}`)
	require.Equal(t, http.StatusNotFound, status)
	require.Equal(t, "device_not_connected", out["code"])
	status, out = post("car-42", `{"payload":"ignore me","timeout_ms":1000}`)
	require.Equal(t, http.StatusGatewayTimeout, status)
	require.Equal(t, "device_timeout", out["code"])
	status, out = post("car-42", `{"payload":"x","timeout_ms":500}`)
	require.Equal(t, http.StatusBadRequest, status)
	status, _ = post("car-42", `{"payload":`)
	require.Equal(t, http.StatusBadRequest, status)

	// The call's hops: the request, its delivery, the answer.
	id, err := core.ParseMessageID(a.ID)
	require.NoError(t, err)
	var hops []trace.Event
	require.Eventually(t, func() bool {
		hops, err = c.Trace(t.Context(), id)
		return err == nil && len(hops) >= 3
	}, 10*time.Second, 50*time.Millisecond, "hops: %v %v", hops, err)
	var names []string
	for _, h := range hops {
		names = append(names, h.Hop)
	}
	require.Equal(t, []string{"rpc.call", "rpc.request", "rpc.answer"}, names)
	require.Equal(t, "car-42", hops[1].Actor)
}
