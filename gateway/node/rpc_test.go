package node_test

import (
	"strings"
	"testing"
	"time"

	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
	"github.com/ferrymq/ferrymq/core/wire"
	"github.com/ferrymq/ferrymq/gateway/devicesim"
	"github.com/ferrymq/ferrymq/gateway/node"
	"github.com/ferrymq/ferrymq/gateway/rpc"
)

// TestNATSCallsReachDevicesOnOtherNodes: two nodes on one nats-server. A
// call made through one node reaches the device connected to the other
// (MQTT 5, answering on its Response Topic; MQTT 3.1.1, by the topic
// convention), and the answer comes back to the node the call came
// through — from the node's service and from a backend on its core port.
// A device no node has fails once the other node said absent; one that
// does not answer times out.
func TestNATSCallsReachDevicesOnOtherNodes(t *testing.T) {
	ns := natstest.RunServer(t)
	n1, err := node.New(t.Context(), natsOptions(t, ns.URL, "gw-1"), nil)
	require.NoError(t, err)
	defer shutdown(t, n1)
	n2, err := node.New(t.Context(), natsOptions(t, ns.URL, "gw-2"), nil)
	require.NoError(t, err)
	defer shutdown(t, n2)

	d5, err := devicesim.Connect(t.Context(), devicesim.Options{Addr: n2.Addr("tcp").String(), ClientID: "car-5", Answer: "v5:{payload}"})
	require.NoError(t, err)
	defer func() { require.NoError(t, d5.Close()) }()
	o := paho3.NewClientOptions().AddBroker("tcp://" + n1.Addr("tcp").String()).SetClientID("car-3").SetAutoReconnect(false)
	o.SetDefaultPublishHandler(func(c paho3.Client, m paho3.Message) {
		if string(m.Payload()) != "mute" {
			go c.Publish(strings.Replace(m.Topic(), "/request/", "/response/", 1), 1, false, "v3:"+string(m.Payload()))
		}
	})
	c3 := paho3.NewClient(o)
	tok := c3.Connect()
	require.True(t, tok.WaitTimeout(10*time.Second))
	require.NoError(t, tok.Error())
	defer c3.Disconnect(100)

	// The first calls may come before gw-1 sees gw-2's liveness lease.
	var a rpc.Answer
	require.Eventually(t, func() bool {
		a, err = n1.RPC().Call(t.Context(), "car-5", []byte("ping"), 5*time.Second)
		return err == nil
	}, 20*time.Second, 100*time.Millisecond, "last error: %v", err)
	require.Equal(t, "v5:ping", string(a.Payload))
	require.Equal(t, "gw-2", a.Node)

	a, err = n2.RPC().Call(t.Context(), "car-3", []byte("ping"), 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, "v3:ping", string(a.Payload))
	require.Equal(t, "gw-1", a.Node)

	// A backend on gw-1's core port.
	c, err := client.Dial(t.Context(), client.Options{Addr: n1.CoreAddr().String()})
	require.NoError(t, err)
	defer c.Close()
	ans, err := c.Call(t.Context(), "car-5", []byte("backend"))
	require.NoError(t, err)
	require.Equal(t, "v5:backend", string(ans.Payload))
	require.Equal(t, "gw-2", ans.Node)

	start := time.Now()
	_, err = n1.RPC().Call(t.Context(), "nobody", []byte("x"), 10*time.Second)
	require.ErrorIs(t, err, rpc.ErrNotConnected)
	t.Logf("not connected anywhere: told in %v", time.Since(start))
	require.Less(t, time.Since(start), 10*time.Second, "not connected must not wait for the call's timeout")
	_, err = c.Call(t.Context(), "nobody", []byte("x"))
	require.ErrorIs(t, err, wire.ErrDeviceNotConnected)

	_, err = n2.RPC().Call(t.Context(), "car-3", []byte("mute"), time.Second)
	require.ErrorIs(t, err, rpc.ErrTimeout)
	here, asked := n2.RPC().Pending()
	require.Zero(t, here+asked)
	here, asked = n1.RPC().Pending()
	require.Zero(t, here+asked)
}
