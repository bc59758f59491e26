package gateway_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/bridge"
	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/ferrymq/ferrymq/gateway/gatewaytest"
)

// delayOpts runs delayed delivery with a short poll interval.
func delayOpts() *delay.Options { return &delay.Options{PollInterval: 20 * time.Millisecond} }

// inbox collects what an MQTT 5 client receives, as topic=payload.
type inbox struct {
	mu   sync.Mutex
	msgs []string
}

func (b *inbox) add(r paho.PublishReceived) (bool, error) {
	b.mu.Lock()
	b.msgs = append(b.msgs, r.Packet.Topic+"="+string(r.Packet.Payload))
	b.mu.Unlock()
	return true, nil
}

func (b *inbox) get() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.msgs...)
}

func subscribeV5(t *testing.T, c *paho.Client, filters ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	s := &paho.Subscribe{}
	for _, f := range filters {
		s.Subscriptions = append(s.Subscriptions, paho.SubscribeOptions{Topic: f, QoS: 1})
	}
	sa, err := c.Subscribe(ctx, s)
	require.NoError(t, err)
	for i, r := range sa.Reasons {
		require.Equal(t, byte(1), r, "subscription %s granted", filters[i])
	}
}

// publishV5 publishes and returns the ack's reason code (PUBACK, or PUBREC
// and then PUBCOMP for QoS 2; 0 for QoS 0 once written).
func publishV5(t *testing.T, c *paho.Client, topic string, qos byte, payload string) byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	res, err := c.Publish(ctx, &paho.Publish{Topic: topic, QoS: qos, Payload: []byte(payload)})
	if qos == 0 {
		require.NoError(t, err, "%s: QoS 0 written", topic)
		return 0
	}
	require.NotNil(t, res, "%s: acknowledged (%v)", topic, err)
	return res.ReasonCode
}

// bodies returns the bodies of ms, in order.
func bodies(ms []core.StoredMessage) []string {
	out := make([]string, 0, len(ms))
	for _, m := range ms {
		out = append(out, string(m.Body))
	}
	return out
}

// waitForMessages waits until topic holds n messages and returns them;
// more than n fails.
func waitForMessages(t *testing.T, env *gatewaytest.Env, topic string, n int) []core.StoredMessage {
	t.Helper()
	var ms []core.StoredMessage
	require.Eventually(t, func() bool {
		ms = readAll(t, env.Store, topic)
		return len(ms) >= n
	}, 10*time.Second, 10*time.Millisecond, "%d messages in %s", n, topic)
	require.Len(t, ms, n, "%s: %v", topic, bodies(ms))
	return ms
}

// An MQTT 5 publish to $delayed/1/{topic} is acknowledged at once, stored
// as a waiting copy, and reaches the core topic about a second later with
// the inner MQTT topic, the delay and the publisher as properties — at
// every QoS. MQTT subscribers never get it: neither "#" (the inner topic,
// when it comes due) nor "$delayed/#" (the topic as published).
func TestDelayedPublishV5(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{Delay: delayOpts()})
	var all, dollar inbox
	subAll := dialV5(t, env.TCP, "sub-all", all.add)
	subscribeV5(t, subAll, "#")
	subDollar := dialV5(t, env.TCP, "sub-delayed", dollar.add)
	subscribeV5(t, subDollar, "$delayed/#", "barrier/#")
	pub := dialV5(t, env.TCP, "car-7", nil)

	before := time.Now()
	require.Equal(t, byte(0), publishV5(t, pub, "$delayed/1/cars/7/cmd", 1, "unlock"), "PUBACK success")
	require.Equal(t, byte(0), publishV5(t, pub, "$delayed/1/cars/7/q2", 2, "qos2"), "PUBREC success")
	publishV5(t, pub, "$delayed/1/cars/7/q0", 0, "qos0")
	require.Empty(t, readAll(t, env.Store, "cars"), "nothing in the core topic at once")
	require.GreaterOrEqual(t, len(readAll(t, env.Store, delay.DelayTopic)), 2, "the acknowledged ones wait, stored")

	ms := waitForMessages(t, env, "cars", 3)
	byBody := map[string]core.StoredMessage{}
	for _, m := range ms {
		byBody[string(m.Body)] = m
	}
	for body, want := range map[string]struct{ topic, qos string }{
		"unlock": {"cars/7/cmd", "1"}, "qos2": {"cars/7/q2", "2"}, "qos0": {"cars/7/q0", "0"},
	} {
		m, ok := byBody[body]
		require.True(t, ok, "%s delivered", body)
		require.Equal(t, want.topic, m.Properties[bridge.PropTopic], body)
		require.Equal(t, "1", m.Properties[bridge.PropDelay], body)
		require.Equal(t, "car-7", m.Properties[bridge.PropClientID], body)
		require.Equal(t, want.qos, m.Properties[bridge.PropQoS], body)
		require.Equal(t, "car-7", m.ShardingKey, "%s: the client ID is the key", body)
		_, err := core.ParseMessageID(m.Properties[delay.PropID])
		require.NoError(t, err, "%s: names the ID of its waiting copy", body)
		require.False(t, m.StoredAt.Before(before.Add(time.Second)), "%s: stored %v, a second after %v at the earliest", body, m.StoredAt, before)
		require.False(t, m.DeliverAt.Before(before.Add(time.Second)), body)
	}

	// A plain publish after the delayed ones came due is republished to MQTT
	// subscribers in order after anything of this publisher's before it: once
	// both subscribers have it, a delayed message would have arrived too.
	require.Equal(t, byte(0), publishV5(t, pub, "barrier/x", 1, "b"))
	require.Eventually(t, func() bool { return len(all.get()) > 0 && len(dollar.get()) > 0 },
		10*time.Second, 10*time.Millisecond, "the barrier reaches both subscribers")
	require.Equal(t, []string{"barrier/x=b"}, all.get(), "\"#\" never gets a delayed message")
	require.Equal(t, []string{"barrier/x=b"}, dollar.get(), "\"$delayed/#\" never gets a delayed publish")
}

// A $delayed publish that is malformed, too long (beyond the bridge's
// MaxDelay or the core's), for a topic no rule bridges or for a downlink
// topic gets PUBACK 0x90 (topic name invalid) and stores nothing; at QoS 0
// it is dropped and the connection kept.
func TestDelayedPublishRefusedV5(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{Delay: delayOpts(), Bridge: bridge.Options{MaxDelay: time.Hour}})
	c := dialV5(t, env.TCP, "car-1", nil)
	for _, topic := range []string{
		"$delayed/abc/cars/1",
		"$delayed/-1/cars/1",
		"$delayed//cars/1",
		"$delayed/10/",
		"$delayed/10",
		"$delayed/10/$SYS/x",
		"$delayed/99999999999/cars/1",
		"$delayed/7200/cars/1",    // beyond the bridge's MaxDelay (1 h)
		"$delayed/3601/cars/1",    // by a second
		"$delayed/1/bad!/x",       // "bad!" is no core topic
		"$delayed/1/commands/x",   // a downlink topic is never fed by devices
		"$delayed/1/$delayed/1/x", // no nesting
	} {
		require.Equal(t, byte(0x90), publishV5(t, c, topic, 1, "refused"), topic)
	}
	require.Equal(t, byte(0x90), publishV5(t, c, "$delayed/x/cars/1", 2, "refused"), "QoS 2: PUBREC 0x90")
	require.Equal(t, byte(0), publishV5(t, c, "$delayed/3600/trucks/1", 1, "an hour"), "the longest delay allowed")
	publishV5(t, c, "$delayed/abc/cars/1", 0, "dropped")
	publishV5(t, c, "$delayed/7200/cars/1", 0, "dropped")
	require.Equal(t, byte(0), publishV5(t, c, "$delayed/1/trucks/2", 1, "valid"), "the connection is kept")

	ms := waitForMessages(t, env, "trucks", 1)
	require.Equal(t, "valid", string(ms[0].Body))
	require.Empty(t, readAll(t, env.Store, "cars"), "nothing refused was stored")
	require.ElementsMatch(t, []string{"an hour", "valid"}, bodies(readAll(t, env.Store, delay.DelayTopic)),
		"the only waiting copies are the accepted ones")

	t.Run("beyond the core's longest delay", func(t *testing.T) {
		opts := delayOpts()
		opts.MaxDelay = time.Hour
		env := gatewaytest.Start(t, gatewaytest.Options{Delay: opts})
		c := dialV5(t, env.TCP, "car-2", nil)
		require.Equal(t, byte(0x90), publishV5(t, c, "$delayed/7200/cars/2", 1, "refused"))
		require.Equal(t, byte(0), publishV5(t, c, "$delayed/3000/cars/2", 1, "fine"))
		require.Equal(t, []string{"fine"}, bodies(readAll(t, env.Store, delay.DelayTopic)))
	})
}

// MQTT 3.1.1: a $delayed publish at QoS 1 is acknowledged and delivered
// after its delay; a malformed one cannot be refused with a reason code,
// so the client is disconnected without an ack and nothing is stored.
func TestDelayedPublishV3(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{Delay: delayOpts()})
	c := dialV3(t, env.TCP, "car-3")
	before := time.Now()
	tok := c.Publish("$delayed/2/cars/3", 1, false, "valid")
	require.True(t, tok.WaitTimeout(10*time.Second))
	require.NoError(t, tok.Error())
	require.True(t, c.Publish("$delayed/2/cars/3/q0", 0, false, "valid q0").WaitTimeout(10*time.Second))

	lost := make(chan error, 1)
	bad := dialV3(t, env.TCP, "car-bad", func(o *paho3.ClientOptions) {
		o.SetConnectionLostHandler(func(_ paho3.Client, err error) { lost <- err })
	})
	badTok := bad.Publish("$delayed/x/cars/3", 1, false, "malformed")
	select {
	case <-lost:
	case <-time.After(10 * time.Second):
		t.Fatal("MQTT 3 client publishing a malformed $delayed topic at QoS 1 was not disconnected")
	}
	require.True(t, badTok.WaitTimeout(10*time.Second), "the token ends with the connection")
	require.Error(t, badTok.Error(), "never acknowledged")
	require.Empty(t, readAll(t, env.Store, "cars"), "not yet due")

	ms := waitForMessages(t, env, "cars", 2)
	require.ElementsMatch(t, []string{"valid", "valid q0"}, bodies(ms))
	for _, m := range ms {
		require.False(t, m.StoredAt.Before(before.Add(2*time.Second)), "stored %v, two seconds after %v at the earliest", m.StoredAt, before)
		require.Equal(t, "2", m.Properties[bridge.PropDelay])
		require.Equal(t, "car-3", m.ShardingKey)
	}
	for _, m := range readAll(t, env.Store, delay.DelayTopic) {
		require.NotEqual(t, "malformed", string(m.Body), "the malformed publish was never stored")
	}
}

// The ACL is applied to a $delayed publish's inner topic: a device allowed
// only cars/{its client ID}/# may delay a publish there (acknowledged and
// delivered later) but not to another device's topic (PUBACK 0x87, never
// stored). A malformed one passes the ACL and is refused by the bridge.
func TestDelayedPublishACL(t *testing.T) {
	acl, err := auth.NewACL([]auth.ACLRule{{Action: auth.ActionAllow, Publish: []string{"cars/%c/#"}}})
	require.NoError(t, err)
	env := gatewaytest.Start(t, gatewaytest.Options{Delay: delayOpts(),
		Auth: auth.NewHook(auth.HookOptions{Chain: &auth.Chain{AllowAnonymous: true}, ACL: acl})})
	c := dialV5(t, env.TCP, "c1", nil)
	require.Equal(t, byte(0), publishV5(t, c, "$delayed/1/cars/c1/x", 1, "mine"), "its own topic")
	require.Equal(t, byte(0x87), publishV5(t, c, "$delayed/1/cars/c2/x", 1, "theirs"), "another device's topic")
	require.Equal(t, byte(0x87), publishV5(t, c, "$delayed/1/trucks/c1/x", 2, "theirs"), "QoS 2: PUBREC 0x87")
	require.Equal(t, byte(0x87), publishV5(t, c, "cars/c2/x", 1, "theirs"), "as without $delayed")
	require.Equal(t, byte(0x90), publishV5(t, c, "$delayed/x/cars/c2/x", 1, "malformed"))

	ms := waitForMessages(t, env, "cars", 1)
	require.Equal(t, "mine", string(ms[0].Body))
	require.Equal(t, "cars/c1/x", ms[0].Properties[bridge.PropTopic])
	for _, m := range readAll(t, env.Store, delay.DelayTopic) {
		require.Equal(t, "mine", string(m.Body), "nothing refused was stored")
	}
	require.Empty(t, readAll(t, env.Store, "trucks"))
}
