package session

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"
)

// End to end: a real engine over the store, real MQTT clients, a restart
// of the engine and the store in between.

// TestRestartKeepsSubscriptionsAndQueuedMessages: what was queued for an
// offline persistent session arrives after a restart, in order, with the
// session present; its subscription still takes new messages.
func TestRestartKeepsSubscriptionsAndQueuedMessages(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	e, addr := startEngine(t, s)
	sub, _ := dialV3(t, addr, "car-7", persistent)
	wait(t, sub.Subscribe("cmd/car-7", 1, nil))
	sub.Disconnect(50)
	require.Eventually(t, func() bool { return !e.Connected("car-7") }, 5*time.Second, 5*time.Millisecond)
	pub, _ := dialV3(t, addr, "backend")
	for _, p := range []string{"a", "b", "c"} {
		wait(t, pub.Publish("cmd/car-7", 1, false, []byte(p)))
	}
	pub.Disconnect(50)
	require.Equal(t, 3, s.Stats().Messages)

	s, e, addr = restart(t, e, s, dir)
	require.True(t, e.HasSession("car-7"))
	var in inbox
	_, present := dialV3(t, addr, "car-7", persistent, func(o *paho3.ClientOptions) { o.SetDefaultPublishHandler(in.handler) })
	require.True(t, present, "session present [MQTT-3.2.2-2]")
	require.Eventually(t, func() bool { return in.count() == 3 }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, []string{"a", "b", "c"}, in.payloads(), "in the order queued [MQTT-4.6.0-2]")

	pub, _ = dialV3(t, addr, "backend")
	wait(t, pub.Publish("cmd/car-7", 1, false, []byte("d")))
	require.Eventually(t, func() bool { return in.count() == 4 }, 5*time.Second, 5*time.Millisecond, "the subscription survived")
	require.Never(t, func() bool { return in.count() > 4 }, 200*time.Millisecond, 10*time.Millisecond)
	require.Eventually(t, func() bool { return s.Stats().Messages == 0 }, 5*time.Second, 5*time.Millisecond, "acknowledged, forgotten")
}

// TestRestartResendsInflightWithDUP: a message sent and not acknowledged
// before a restart is sent again after it, with DUP set [MQTT-4.4.0-1].
func TestRestartResendsInflightWithDUP(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	e, addr := startEngine(t, s)
	var first inbox
	sub, _ := dialV3(t, addr, "car-7", persistent, func(o *paho3.ClientOptions) {
		o.SetAutoAckDisabled(true).SetDefaultPublishHandler(first.handler)
	})
	wait(t, sub.Subscribe("cmd/car-7", 1, nil))
	pub, _ := dialV3(t, addr, "backend")
	wait(t, pub.Publish("cmd/car-7", 1, false, []byte("open")))
	require.Eventually(t, func() bool { return first.count() == 1 }, 5*time.Second, 5*time.Millisecond)
	require.False(t, first.all()[0].Duplicate())
	// Not acknowledged: in flight when the engine stops.
	inflight, _, _, ok := e.Window("car-7")
	require.True(t, ok)
	require.Equal(t, 1, inflight)

	s, _, addr = restart(t, e, s, dir)
	var again inbox
	_, present := dialV3(t, addr, "car-7", persistent, func(o *paho3.ClientOptions) { o.SetDefaultPublishHandler(again.handler) })
	require.True(t, present)
	require.Eventually(t, func() bool { return again.count() == 1 }, 5*time.Second, 5*time.Millisecond)
	m := again.all()[0]
	require.Equal(t, "open", string(m.Payload()))
	require.True(t, m.Duplicate(), "resent with DUP")
	require.Equal(t, byte(1), m.Qos())
	require.Eventually(t, func() bool { return s.Stats().Messages == 0 }, 5*time.Second, 5*time.Millisecond)
}

// TestRestartKeepsInboundQoS2: a QoS 2 publish answered PUBREC before a
// restart is not delivered again when the client resends it after, and
// its PUBREL gets a successful PUBCOMP [MQTT-4.3.3-8] [MQTT-4.3.3-10].
func TestRestartKeepsInboundQoS2(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	e, addr := startEngine(t, s)
	var seen inbox
	watcher, _ := dialV3(t, addr, "watcher")
	wait(t, watcher.Subscribe("up/#", 2, seen.handler))
	dev, _ := dialRaw(t, addr, &packets.Connect{ClientID: "dev", ProtocolName: "MQTT", ProtocolVersion: 5, KeepAlive: 30,
		CleanStart: true, Properties: &packets.Properties{SessionExpiryInterval: u32(300)}})
	dev.publish(7, 2, false, "up/dev", "once")
	require.Equal(t, uint16(7), dev.expect(packets.PUBREC).Content.(*packets.Pubrec).PacketID)
	require.Eventually(t, func() bool { return seen.count() == 1 }, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, dev.conn.Close()) // no PUBREL: the flow is open when the engine stops
	watcher.Disconnect(50)

	_, _, addr = restart(t, e, s, dir)
	var after inbox
	watcher, _ = dialV3(t, addr, "watcher")
	wait(t, watcher.Subscribe("up/#", 2, after.handler))
	dev, ack := dialRaw(t, addr, &packets.Connect{ClientID: "dev", ProtocolName: "MQTT", ProtocolVersion: 5, KeepAlive: 30,
		Properties: &packets.Properties{SessionExpiryInterval: u32(300)}})
	require.True(t, ack.SessionPresent)
	dev.publish(7, 2, true, "up/dev", "once")
	require.Equal(t, uint16(7), dev.expect(packets.PUBREC).Content.(*packets.Pubrec).PacketID, "answered again")
	dev.ack(packets.PUBREL, 7)
	comp := dev.expect(packets.PUBCOMP).Content.(*packets.Pubcomp)
	require.Equal(t, uint16(7), comp.PacketID)
	require.Equal(t, byte(packets.PubcompSuccess), comp.ReasonCode, "the packet ID survived the restart")
	dev.ack(packets.PUBREL, 8)
	comp = dev.expect(packets.PUBCOMP).Content.(*packets.Pubcomp)
	require.Equal(t, byte(packets.PubcompPacketIdentifierNotFound), comp.ReasonCode, "an ID never received")
	require.Never(t, func() bool { return after.count() > 0 }, 300*time.Millisecond, 10*time.Millisecond, "not delivered twice")
}

// TestRestartKeepsRetainedMessages: retained messages survive a restart;
// a cleared one does not come back.
func TestRestartKeepsRetainedMessages(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	e, addr := startEngine(t, s)
	pub, _ := dialV3(t, addr, "pub")
	wait(t, pub.Publish("home/kitchen/temp", 1, true, []byte("21")))
	wait(t, pub.Publish("home/hall/temp", 1, true, []byte("19")))
	wait(t, pub.Publish("home/hall/temp", 1, true, []byte{}))
	pub.Disconnect(50)

	_, _, addr = restart(t, e, s, dir)
	var in inbox
	sub, _ := dialV3(t, addr, "sub")
	wait(t, sub.Subscribe("home/#", 1, in.handler))
	require.Eventually(t, func() bool { return in.count() == 1 }, 5*time.Second, 5*time.Millisecond)
	require.Never(t, func() bool { return in.count() > 1 }, 200*time.Millisecond, 10*time.Millisecond)
	m := in.all()[0]
	require.Equal(t, "home/kitchen/temp", m.Topic())
	require.Equal(t, "21", string(m.Payload()))
	require.True(t, m.Retained())
}

// TestRestartKeepsMQTT5Properties: a queued message keeps its properties,
// its expiry (what is left of it) and its subscription identifier.
func TestRestartKeepsMQTT5Properties(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	e, addr := startEngine(t, s)
	sub, _ := dialV5(t, addr, &paho.Connect{ClientID: "sub5", CleanStart: true, KeepAlive: 30,
		Properties: &paho.ConnectProperties{SessionExpiryInterval: u32(300)}}, nil)
	_, err := sub.Subscribe(t.Context(), &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "rpc/#", QoS: 1}},
		Properties: &paho.SubscribeProperties{SubscriptionIdentifier: intp(7)}})
	require.NoError(t, err)
	require.NoError(t, sub.Disconnect(&paho.Disconnect{ReasonCode: 0}))
	require.Eventually(t, func() bool { return !e.Connected("sub5") }, 5*time.Second, 5*time.Millisecond)
	pub, _ := dialV5(t, addr, &paho.Connect{ClientID: "pub5", CleanStart: true, KeepAlive: 30}, nil)
	_, err = pub.Publish(t.Context(), &paho.Publish{Topic: "rpc/req", QoS: 1, Payload: []byte("ping"), Properties: &paho.PublishProperties{
		ResponseTopic: "rpc/resp", CorrelationData: []byte{1, 2, 3}, ContentType: "text/plain",
		User: paho.UserProperties{{Key: "a", Value: "1"}, {Key: "a", Value: "2"}}, MessageExpiry: u32(600),
	}})
	require.NoError(t, err)

	_, _, addr = restart(t, e, s, dir)
	got := make(chan *paho.Publish, 4)
	_, ca := dialV5(t, addr, &paho.Connect{ClientID: "sub5", KeepAlive: 30, Properties: &paho.ConnectProperties{SessionExpiryInterval: u32(300)}},
		func(pr paho.PublishReceived) (bool, error) { got <- pr.Packet; return true, nil })
	require.True(t, ca.SessionPresent)
	select {
	case p := <-got:
		require.Equal(t, "ping", string(p.Payload))
		require.Equal(t, "rpc/resp", p.Properties.ResponseTopic)
		require.Equal(t, []byte{1, 2, 3}, p.Properties.CorrelationData)
		require.Equal(t, "text/plain", p.Properties.ContentType)
		require.Equal(t, paho.UserProperties{{Key: "a", Value: "1"}, {Key: "a", Value: "2"}}, p.Properties.User)
		require.NotNil(t, p.Properties.SubscriptionIdentifier)
		require.Equal(t, 7, *p.Properties.SubscriptionIdentifier)
		require.NotNil(t, p.Properties.MessageExpiry)
		require.LessOrEqual(t, *p.Properties.MessageExpiry, uint32(600))
		require.Greater(t, *p.Properties.MessageExpiry, uint32(500))
	case <-time.After(5 * time.Second):
		t.Fatal("the queued message did not arrive")
	}
}

// TestWillOfAConnectionThatDiedWithTheProcess: the log as a crash leaves
// it (what was written, read while the process still runs) holds the
// connected client's will; the next start publishes it after its will
// delay [MQTT-3.1.2-8], counted from the start.
func TestWillOfAConnectionThatDiedWithTheProcess(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	_, addr := startEngine(t, s)
	dialV5(t, addr, &paho.Connect{ClientID: "car-9", CleanStart: true, KeepAlive: 30,
		Properties:     &paho.ConnectProperties{SessionExpiryInterval: u32(300)},
		WillMessage:    &paho.WillMessage{Topic: "wills/car-9", QoS: 1, Payload: []byte("lost")},
		WillProperties: &paho.WillProperties{WillDelayInterval: u32(1)}}, nil)

	crashed := t.TempDir()
	b, err := os.ReadFile(filepath.Join(dir, logName))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(crashed, logName), b, 0o644))

	s2 := openStore(t, crashed)
	started := time.Now()
	_, addr2 := startEngine(t, s2)
	var wills inbox
	watcher, _ := dialV3(t, addr2, "watcher")
	wait(t, watcher.Subscribe("wills/#", 1, wills.handler))
	require.Eventually(t, func() bool { return wills.count() == 1 }, 5*time.Second, 5*time.Millisecond)
	require.GreaterOrEqual(t, time.Since(started), 750*time.Millisecond, "not before the will delay")
	require.Equal(t, []string{"lost"}, wills.payloads())
	require.Never(t, func() bool { return wills.count() > 1 }, 300*time.Millisecond, 10*time.Millisecond)
}

// TestCleanStartAfterRestartDiscardsTheSession: a clean session of a
// stored client ID ends what was stored; nothing of it comes back.
func TestCleanStartAfterRestartDiscardsTheSession(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	e, addr := startEngine(t, s)
	sub, _ := dialV3(t, addr, "car-7", persistent)
	wait(t, sub.Subscribe("cmd/car-7", 1, nil))
	sub.Disconnect(50)
	require.Eventually(t, func() bool { return !e.Connected("car-7") }, 5*time.Second, 5*time.Millisecond)
	pub, _ := dialV3(t, addr, "backend")
	wait(t, pub.Publish("cmd/car-7", 1, false, []byte("a")))

	s, e, addr = restart(t, e, s, dir)
	var in inbox
	c, present := dialV3(t, addr, "car-7", func(o *paho3.ClientOptions) { o.SetDefaultPublishHandler(in.handler) })
	require.False(t, present)
	require.Never(t, func() bool { return in.count() > 0 }, 200*time.Millisecond, 10*time.Millisecond)
	c.Disconnect(50)
	require.Eventually(t, func() bool { return s.Stats().Sessions == 0 }, 5*time.Second, 5*time.Millisecond)

	s, _, _ = restart(t, e, s, dir)
	sessions, _, err := s.b.load()
	require.NoError(t, err)
	require.Empty(t, sessions)
}

// TestResumedWithoutExpiryTheSessionIsForgotten: an MQTT 5 client that
// resumes a stored session asking for no expiry ends it with its
// connection [MQTT-3.1.2-23]; the store must not keep it.
func TestResumedWithoutExpiryTheSessionIsForgotten(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	e, addr := startEngine(t, s)
	c, _ := dialV5(t, addr, &paho.Connect{ClientID: "dev", CleanStart: true, KeepAlive: 30,
		Properties: &paho.ConnectProperties{SessionExpiryInterval: u32(300)}}, nil)
	_, err := c.Subscribe(t.Context(), &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "x", QoS: 1}}})
	require.NoError(t, err)
	require.NoError(t, c.Disconnect(&paho.Disconnect{ReasonCode: 0}))
	require.Eventually(t, func() bool { return !e.Connected("dev") }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, 1, s.Stats().Sessions)

	c, ca := dialV5(t, addr, &paho.Connect{ClientID: "dev", KeepAlive: 30}, nil)
	require.True(t, ca.SessionPresent)
	require.NoError(t, c.Disconnect(&paho.Disconnect{ReasonCode: 0}))
	require.Eventually(t, func() bool { return !e.HasSession("dev") }, 5*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool { return s.Stats().Sessions == 0 }, 5*time.Second, 5*time.Millisecond,
		"the session ended with its connection")

	_, e, _ = restart(t, e, s, dir)
	require.False(t, e.HasSession("dev"), "and does not come back")
}

func intp(v int) *int { return &v }

// TestKill9LosesNothingWritten: a gateway process killed with SIGKILL
// loses nothing its store wrote. A QoS 1 message was stored for its
// subscriber before its publisher got the PUBACK; after the kill the next
// process resends every one, in order, with the session present; the will
// of a client connected at the kill is published at its start (retained
// here, so that a later subscriber sees it).
func TestKill9LosesNothingWritten(t *testing.T) {
	dir := t.TempDir()
	child, addr := startChild(t, dir)
	dialV3(t, addr, "car-9", persistent, func(o *paho3.ClientOptions) { o.SetWill("wills/car-9", "lost", 1, true) })
	// car-7 holds its acks back: everything it is sent stays in flight.
	var subscribed inbox
	s7, _ := dialV3(t, addr, "car-7", persistent, func(o *paho3.ClientOptions) {
		o.SetAutoAckDisabled(true).SetDefaultPublishHandler(subscribed.handler)
	})
	wait(t, s7.Subscribe("cmd/car-7", 1, nil))
	pub, _ := dialV3(t, addr, "backend")
	for i := range 5 {
		wait(t, pub.Publish("cmd/car-7", 1, false, []byte{'0' + byte(i)}))
	}
	require.Eventually(t, func() bool { return subscribed.count() == 5 }, 5*time.Second, 5*time.Millisecond)
	kill9(t, child)

	_, addr = startChild(t, dir)
	var wills inbox
	watcher, _ := dialV3(t, addr, "watcher")
	wait(t, watcher.Subscribe("wills/#", 1, wills.handler))
	require.Eventually(t, func() bool { return wills.count() == 1 }, 5*time.Second, 5*time.Millisecond, "the will, retained")
	require.Equal(t, "lost", wills.payloads()[0])
	var again inbox
	_, present := dialV3(t, addr, "car-7", persistent, func(o *paho3.ClientOptions) { o.SetDefaultPublishHandler(again.handler) })
	require.True(t, present)
	require.Eventually(t, func() bool { return again.count() == 5 }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, []string{"0", "1", "2", "3", "4"}, again.payloads())
	for _, m := range again.all() {
		require.True(t, m.Duplicate())
	}
}
