package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/bridge"
	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/gateway/gatewaytest"
)

type received struct {
	mu   sync.Mutex
	msgs []string // topic=payload
}

func (r *received) add(_ paho3.Client, m paho3.Message) {
	r.mu.Lock()
	r.msgs = append(r.msgs, m.Topic()+"="+string(m.Payload()))
	r.mu.Unlock()
}

func (r *received) get() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.msgs...)
}

func command(t *testing.T, env *gatewaytest.Env, key, body string, props map[string]string) string {
	t.Helper()
	res, err := env.Store.Produce(context.Background(), &core.Message{Topic: "commands", ShardingKey: key, Properties: props, Body: []byte(body)})
	require.NoError(t, err)
	return res.ID.String()
}

func receipts(t *testing.T, env *gatewaytest.Env) map[string]bridge.Receipt {
	t.Helper()
	out := map[string]bridge.Receipt{}
	for _, m := range readAll(t, env.Store, bridge.DefaultReceiptsTopic) {
		var r bridge.Receipt
		require.NoError(t, json.Unmarshal(m.Body, &r))
		require.Equal(t, r.Outcome, m.Tag)
		out[r.MessageID] = r
	}
	return out
}

// A backend's command reaches a subscribed device on the topic it names;
// a point-to-point command reaches a device that subscribed to nothing;
// both produce "delivered" receipts once the device acknowledged them.
func TestDownlinkToSubscriberAndPointToPoint(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{})
	var sub, p2p received
	car42 := dialV3(t, env.TCP, "car42")
	tok := car42.Subscribe("cars/car42/cmd", 1, sub.add)
	require.True(t, tok.WaitTimeout(5*time.Second))
	require.NoError(t, tok.Error())
	dialV3(t, env.TCP, "car7", func(o *paho3.ClientOptions) { o.SetDefaultPublishHandler(p2p.add) })

	id1 := command(t, env, "car42", "unlock", map[string]string{bridge.PropTopic: "cars/car42/cmd"})
	id2 := command(t, env, "car7", "honk", map[string]string{bridge.PropClientID: "car7", bridge.PropTopic: "cmd/car7"})
	require.Eventually(t, func() bool { return len(sub.get()) == 1 && len(p2p.get()) == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, []string{"cars/car42/cmd=unlock"}, sub.get())
	require.Equal(t, []string{"cmd/car7=honk"}, p2p.get())

	require.Eventually(t, func() bool { return len(receipts(t, env)) == 2 }, 10*time.Second, 10*time.Millisecond)
	rs := receipts(t, env)
	require.Equal(t, bridge.OutcomeDelivered, rs[id1].Outcome)
	require.Equal(t, "car42", rs[id1].ClientID)
	require.Equal(t, bridge.OutcomeDelivered, rs[id2].Outcome)
	require.Equal(t, "car7", rs[id2].ClientID)
	require.Equal(t, "cmd/car7", rs[id2].Topic)
}

// Without mqtt.topic a command goes to commands/<key>; 1,000 point-to-point
// commands to one car arrive in order.
func TestDownlinkOrderOfThousandCommands(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{})
	var got received
	dialV3(t, env.TCP, "car9", func(o *paho3.ClientOptions) { o.SetDefaultPublishHandler(got.add).SetOrderMatters(true) })
	const n = 1000
	want := make([]string, n)
	for i := range n {
		body := fmt.Sprintf("c%04d", i)
		want[i] = "commands/car9=" + body
		command(t, env, "car9", body, map[string]string{bridge.PropClientID: "car9"})
	}
	require.Eventually(t, func() bool { return len(got.get()) >= n }, 20*time.Second, 10*time.Millisecond)
	require.Equal(t, want, got.get())
}

// A device cannot read another device's point-to-point messages.
func TestPointToPointNamespaceIsClosed(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{})
	var spied received
	spy := dialV3(t, env.TCP, "spy")
	tok := spy.Subscribe("$ferrymq/p2p/#", 1, spied.add)
	require.True(t, tok.WaitTimeout(5*time.Second))
	st := tok.(*paho3.SubscribeToken)
	require.Equal(t, byte(0x80), st.Result()["$ferrymq/p2p/#"], "subscription refused")
	tok = spy.Subscribe("$share/g/$ferrymq/p2p/#", 1, spied.add)
	require.True(t, tok.WaitTimeout(5*time.Second))
	// paho files the result under the filter without its $share/g/ prefix
	require.Equal(t, map[string]byte{"$ferrymq/p2p/#": 0x80}, tok.(*paho3.SubscribeToken).Result(), "shared form refused too")
	tok = spy.Subscribe("$SHARE/g/$ferrymq/p2p/#", 1, spied.add) // mochi reads the share prefix in any case
	require.True(t, tok.WaitTimeout(5*time.Second))
	for f, code := range tok.(*paho3.SubscribeToken).Result() {
		require.Equal(t, byte(0x80), code, "upper-case shared form refused too: %q", f)
	}
	var victim received
	dialV3(t, env.TCP, "victim", func(o *paho3.ClientOptions) { o.SetDefaultPublishHandler(victim.add) })
	command(t, env, "victim", "secret", map[string]string{bridge.PropClientID: "victim"})
	require.Eventually(t, func() bool { return len(victim.get()) == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Empty(t, spied.get())
}

// Expired and invalid commands are never published and get receipts; what
// devices publish on a downlink topic is not bridged back into it (no loops).
func TestDownlinkExpiredInvalidAndNoLoop(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{})
	var all received
	watcher := dialV3(t, env.TCP, "watcher")
	tok := watcher.Subscribe("#", 1, all.add)
	require.True(t, tok.WaitTimeout(5*time.Second))

	old, err := env.Store.Produce(context.Background(), &core.Message{Topic: "commands", ShardingKey: "car1",
		BornAt: time.Now().Add(-time.Hour), Properties: map[string]string{bridge.PropTTL: "30s"}, Body: []byte("stale")})
	require.NoError(t, err)
	bad := command(t, env, "car1", "bad", map[string]string{bridge.PropTopic: "cars/+/cmd"})
	ok := command(t, env, "car1", "fresh", map[string]string{bridge.PropTTL: "60"})

	require.Eventually(t, func() bool { return len(all.get()) == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, []string{"commands/car1=fresh"}, all.get())
	require.Eventually(t, func() bool { return len(receipts(t, env)) == 3 }, 10*time.Second, 10*time.Millisecond)
	rs := receipts(t, env)
	require.Equal(t, bridge.OutcomeExpired, rs[old.ID.String()].Outcome)
	require.Equal(t, bridge.OutcomeInvalidTopic, rs[bad].Outcome)
	require.Equal(t, bridge.OutcomeDelivered, rs[ok].Outcome)
	require.Eventually(t, func() bool { return len(readAll(t, env.Store, bridge.DefaultDeadLetterTopic)) == 1 }, 10*time.Second, 10*time.Millisecond)
	dl := readAll(t, env.Store, bridge.DefaultDeadLetterTopic)[0]
	require.Equal(t, bad, dl.Properties[bridge.PropDLQOriginID])
	require.Equal(t, "commands", dl.Properties[bridge.PropDLQOriginTopic])
	require.NotEmpty(t, dl.Properties[bridge.PropDLQReason])
	require.Equal(t, "bad", string(dl.Body))

	// A device publishing on commands/… is not fed back into the commands topic.
	tok = watcher.Publish("commands/car1", 1, false, "from a device")
	require.True(t, tok.WaitTimeout(5*time.Second))
	require.NoError(t, tok.Error())
	require.Len(t, readAll(t, env.Store, "commands"), 3)
}
