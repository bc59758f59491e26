package bridge_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/bridge"
	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/brokertest"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
	"github.com/ferrymq/ferrymq/core/server/servertest"
	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/gateway/engine"
)

// TestMain checks that every goroutine the hook starts (the downlink
// consumers, the held-command sweeper, the notices goroutine, Drain's
// waiter) has ended when the tests end — but those of the NATS servers
// the JetStream cases run in process.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m, natstest.IgnoreServerGoroutines()...) }

func readAll(t testing.TB, st *store.Store, topic string) []*core.StoredMessage {
	t.Helper()
	msgs, err := brokertest.ReadTopic(t.Context(), st, topic)
	require.NoError(t, err)
	return msgs
}

// The hook's whole life on a real engine on a loopback port, for each
// Core: the embedded store in process, and a core server over TCP (the
// store behind it is where the test reads). Every goroutine the hook starts
// works — a device's publish is stored, its connection becomes presence
// events, a backend's command reaches it, the receipt is stored — and,
// after the engine's shutdown and Drain, has ended (TestMain's goleak
// check).
func TestHookStartsAndDrains(t *testing.T) {
	for _, c := range []struct {
		name string
		open func(t *testing.T) (*store.Store, bridge.Options)
	}{
		{name: "embedded", open: func(t *testing.T) (*store.Store, bridge.Options) {
			st, err := store.Open(t.TempDir(), store.Options{})
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, st.Close()) })
			return st, bridge.Options{Broker: st}
		}},
		{name: "remote", open: func(t *testing.T) (*store.Store, bridge.Options) {
			env := servertest.Start(t, servertest.Options{})
			cl, err := client.Dial(t.Context(), client.Options{Addr: env.Addr, MaxBackoff: 100 * time.Millisecond})
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, cl.Close()) })
			return env.Store, bridge.Options{Core: bridge.Remote(cl, nil)}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			st, o := c.open(t)
			o.Node = "gw-1"
			hookLifecycle(t, st, o)
		})
	}
}

// hookLifecycle runs a hook with options o, whose core stores into st,
// from New to Drain.
func hookLifecycle(t *testing.T, st *store.Store, o bridge.Options) {
	h, err := bridge.New(o)
	require.NoError(t, err)
	e, err := engine.New(engine.Options{
		Listeners: []engine.Listener{{Name: "tcp", Type: "tcp", Addr: "127.0.0.1:0"}},
		Hooks:     engine.Hooks{Uplink: h, Presence: h, Delivery: h},
	})
	require.NoError(t, err)
	h.Attach(e)
	require.NoError(t, e.Start())
	h.Start()
	stopped := false
	stop := func() { // the gateway's Shutdown: the engine, then the hook
		if stopped {
			return
		}
		stopped = true
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, e.Shutdown(ctx))
		require.NoError(t, h.Drain(ctx))
	}
	t.Cleanup(stop) // also when the test fails half-way

	got := make(chan string, 64)
	mo := paho3.NewClientOptions().AddBroker("tcp://" + e.Addr("tcp").String()).SetClientID("car-7").
		SetAutoReconnect(false).SetConnectRetry(false).SetProtocolVersion(4).
		SetDefaultPublishHandler(func(_ paho3.Client, m paho3.Message) { got <- m.Topic() + "=" + string(m.Payload()) })
	c := paho3.NewClient(mo)
	t.Cleanup(func() { c.Disconnect(100) }) // a no-op once disconnected
	tok := c.Connect()
	require.True(t, tok.WaitTimeout(10*time.Second))
	require.NoError(t, tok.Error())
	tok = c.Subscribe("commands/car-7", 1, nil)
	require.True(t, tok.WaitTimeout(10*time.Second))
	require.NoError(t, tok.Error())

	// Uplink: acknowledged once stored.
	tok = c.Publish("telemetry/car-7/gps", 1, false, "52.5,13.4")
	require.True(t, tok.WaitTimeout(10*time.Second))
	require.NoError(t, tok.Error())
	up := readAll(t, st, "telemetry")
	require.Len(t, up, 1)
	require.Equal(t, "car-7", up[0].ShardingKey)
	require.Equal(t, "52.5,13.4", string(up[0].Body))

	// Downlink: a backend's command reaches the device, which acknowledges
	// it, and the receipt names that command. It is produced at once: the
	// downlink reads from the hook's start, also when its consumer (the
	// remote core's broadcast member) joins its group later than that.
	res, err := st.Produce(t.Context(), &core.Message{Topic: "commands", ShardingKey: "car-7", Body: []byte("unlock")})
	require.NoError(t, err)
	id := res.ID.String()
	select {
	case m := <-got:
		require.Equal(t, "commands/car-7=unlock", m)
	case <-time.After(10 * time.Second):
		t.Fatal("the command never reached the device")
	}
	require.Eventually(t, func() bool {
		rs, err := brokertest.ReadTopic(t.Context(), st, bridge.DefaultReceiptsTopic)
		for _, r := range rs {
			var rc bridge.Receipt
			if json.Unmarshal(r.Body, &rc) == nil && rc.MessageID == id {
				return err == nil && rc.Outcome == bridge.OutcomeDelivered && rc.ClientID == "car-7"
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond, "no delivered receipt for %s", id)

	c.Disconnect(100)
	stop()

	// Presence: stored by the notices goroutine before Drain returned.
	var events []string
	for _, m := range readAll(t, st, bridge.DefaultEventsTopic) {
		events = append(events, m.Tag)
	}
	require.Equal(t, []string{bridge.EventConnected, bridge.EventDisconnected}, events)
}
