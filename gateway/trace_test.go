package gateway_test

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/bridge"
	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/trace"
	"github.com/ferrymq/ferrymq/gateway/gatewaytest"
)

// timeline waits until message id has at least n trace events and returns
// them in time order.
func timeline(t *testing.T, env *gatewaytest.Env, id core.MessageID, n int) []trace.Event {
	t.Helper()
	var evs []trace.Event
	require.Eventually(t, func() bool {
		var err error
		evs, err = trace.Lookup(t.Context(), env.Store, id, 0)
		require.NoError(t, err)
		return len(evs) >= n
	}, 10*time.Second, 10*time.Millisecond, "%d trace events of %s", n, id)
	return evs
}

func hops(evs []trace.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Hop
	}
	return out
}

// storedBody waits for the message of topic whose body is body.
func storedBody(t *testing.T, env *gatewaytest.Env, topic, body string) core.StoredMessage {
	t.Helper()
	var m core.StoredMessage
	require.Eventually(t, func() bool {
		for _, x := range readAll(t, env.Store, topic) {
			if string(x.Body) == body {
				m = x
				return true
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond, "%q stored in %s", body, topic)
	return m
}

// A device's publish to a traced topic has the timeline mqtt.publish,
// stored, mqtt.ack (QoS 1 and 2) under the stored message's ID, with who
// sent it, how and where it was stored; QoS 0 and wills have no ack hop; a
// publish to an untraced topic records nothing.
func TestTraceUplink(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{Trace: &trace.Options{Topics: []string{"telemetry"}, Node: "n1"}})
	ctx := t.Context()
	v5 := dialV5With(t, env.TCP, &paho.Connect{ClientID: "car1", KeepAlive: 30, CleanStart: true, UsernameFlag: true, Username: "alice"}, nil)
	for _, p := range []struct {
		topic string
		qos   byte
		body  string
	}{{"other/car1", 1, "untraced"}, {"telemetry/car1/gps", 1, "q1"}, {"telemetry/car1/speed", 0, "q0"}} {
		_, err := v5.Publish(ctx, &paho.Publish{Topic: p.topic, QoS: p.qos, Payload: []byte(p.body)})
		require.NoError(t, err)
	}
	v3 := dialV3(t, env.TCP, "car2")
	tok := v3.Publish("telemetry/car2/door", 2, false, "q2")
	require.True(t, tok.WaitTimeout(5*time.Second))
	require.NoError(t, tok.Error())
	willer := dialV5With(t, env.TCP, &paho.Connect{ClientID: "car3", KeepAlive: 30, CleanStart: true,
		WillMessage: &paho.WillMessage{Topic: "telemetry/car3/status", QoS: 1, Payload: []byte("gone")}}, nil)
	require.NoError(t, willer.Disconnect(&paho.Disconnect{ReasonCode: 0x04})) // with will message
	<-willer.Done()

	q1 := storedBody(t, env, "telemetry", "q1")
	evs := timeline(t, env, q1.ID, 3)
	require.Equal(t, []string{trace.HopPublish, trace.HopStored, trace.HopPuback}, hops(evs))
	pub, stored, ack := evs[0], evs[1], evs[2]
	for _, e := range evs {
		require.Equal(t, q1.ID, e.ID)
		require.Equal(t, "n1", e.Node)
	}
	require.Equal(t, "car1", pub.Actor)
	require.Equal(t, "telemetry/car1/gps", pub.Attrs["mqtt_topic"])
	require.Equal(t, "1", pub.Attrs["qos"])
	require.NotEmpty(t, pub.Attrs["packet_id"])
	require.Equal(t, "5", pub.Attrs["protocol"])
	require.Equal(t, "alice", pub.Attrs["username"])
	require.Contains(t, pub.Attrs["remote"], "127.0.0.1:")
	require.Equal(t, "#", pub.Attrs["rule"])
	// The connect session: when the connection began, and the seq of its
	// "connected" presence event.
	connectedAt, err := time.Parse(time.RFC3339Nano, pub.Attrs["connected_at"])
	require.NoError(t, err)
	require.False(t, connectedAt.After(pub.At))
	var connected *bridge.Event
	for _, m := range readAll(t, env.Store, bridge.DefaultEventsTopic) {
		var ev bridge.Event
		require.NoError(t, json.Unmarshal(m.Body, &ev))
		if ev.Event == bridge.EventConnected && ev.ClientID == "car1" {
			connected = &ev
		}
	}
	require.NotNil(t, connected)
	require.Equal(t, strconv.FormatUint(connected.Seq, 10), pub.Attrs["connect_seq"])
	require.Equal(t, map[string]string{"topic": "telemetry", "queue": strconv.Itoa(q1.Queue),
		"offset": strconv.FormatInt(q1.QueueOffset, 10), "key": "car1"}, stored.Attrs)
	require.Equal(t, q1.StoredAt.UnixNano(), stored.At.UnixNano())
	require.Equal(t, "car1", ack.Actor)
	require.Equal(t, map[string]string{"packet_id": pub.Attrs["packet_id"], "qos": "1", "code": "0x00"}, ack.Attrs)

	q2 := storedBody(t, env, "telemetry", "q2")
	evs = timeline(t, env, q2.ID, 3)
	require.Equal(t, []string{trace.HopPublish, trace.HopStored, trace.HopPuback}, hops(evs))
	require.Equal(t, "4", evs[0].Attrs["protocol"])
	require.Equal(t, "2", evs[0].Attrs["qos"])
	require.NotContains(t, evs[0].Attrs, "username")
	require.Equal(t, "2", evs[2].Attrs["qos"])
	require.Equal(t, evs[0].Attrs["packet_id"], evs[2].Attrs["packet_id"])

	q0 := storedBody(t, env, "telemetry", "q0")
	evs = timeline(t, env, q0.ID, 2)
	require.Equal(t, []string{trace.HopPublish, trace.HopStored}, hops(evs))
	require.Equal(t, "0", evs[0].Attrs["qos"])
	require.NotContains(t, evs[0].Attrs, "packet_id")

	will := storedBody(t, env, "telemetry", "gone")
	evs = timeline(t, env, will.ID, 2)
	require.Equal(t, []string{trace.HopPublish, trace.HopStored}, hops(evs))
	require.Equal(t, "car3", evs[0].Actor)
	require.Equal(t, "true", evs[0].Attrs["will"])
	require.Equal(t, "telemetry/car3/status", evs[0].Attrs["mqtt_topic"])

	untraced := storedBody(t, env, "other", "untraced")
	require.Eventually(t, func() bool { w, _ := env.Trace.Stats(); return w == 3+3+2+2 }, 10*time.Second, 10*time.Millisecond)
	evs, err = trace.Lookup(ctx, env.Store, untraced.ID, 0)
	require.NoError(t, err)
	require.Empty(t, evs, "an untraced topic records nothing")
	written, dropped := env.Trace.Stats()
	require.Equal(t, int64(10), written)
	require.Zero(t, dropped)
}

// A traced "$delayed/{seconds}/{topic}" publish is delayed, not stored, when
// the device is acknowledged; the delay service records where it was
// stored once due, under the same ID.
func TestTraceDelayedPublish(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{Delay: delayOpts(), Trace: &trace.Options{Topics: []string{"telemetry"}}})
	c := dialV5(t, env.TCP, "car4", nil)
	require.Equal(t, byte(0), publishV5(t, c, "$delayed/1/telemetry/car4/later", 1, "later"))

	m := storedBody(t, env, "telemetry", "later")
	id, err := core.ParseMessageID(m.Properties["delay.id"])
	require.NoError(t, err)
	evs := timeline(t, env, id, 4)
	require.Equal(t, []string{trace.HopPublish, trace.HopDelayed, trace.HopPuback, trace.HopStored}, hops(evs))
	require.Equal(t, "$delayed/1/telemetry/car4/later", evs[0].Attrs["mqtt_topic"])
	delayed := evs[1].Attrs
	require.Equal(t, "telemetry", delayed["topic"])
	require.Equal(t, "1", delayed["delay_s"])
	due, err := time.Parse(time.RFC3339Nano, delayed["due"])
	require.NoError(t, err)
	require.WithinDuration(t, evs[0].At.Add(time.Second), due, time.Second)
	require.NotContains(t, delayed, "queue", "known only when delivered")
	require.Equal(t, strconv.FormatInt(m.QueueOffset, 10), evs[3].Attrs["offset"])
}

// A traced command has the timeline mqtt.deliver, mqtt.device-ack, receipt
// — point-to-point and to a subscriber alike.
func TestTraceDownlink(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{Bridge: bridge.Options{Node: "gw-1"},
		Trace: &trace.Options{Topics: []string{"commands"}}})
	var p2p, sub received
	dialV3(t, env.TCP, "car7", func(o *paho3.ClientOptions) { o.SetDefaultPublishHandler(p2p.add) })
	car8 := dialV3(t, env.TCP, "car8")
	tok := car8.Subscribe("cars/car8/cmd", 1, sub.add)
	require.True(t, tok.WaitTimeout(5*time.Second))
	require.NoError(t, tok.Error())

	honk := command(t, env, "car7", "honk", map[string]string{bridge.PropClientID: "car7", bridge.PropTopic: "cmd/car7"})
	unlock := command(t, env, "car8", "unlock", map[string]string{bridge.PropTopic: "cars/car8/cmd"})
	for _, c := range []struct{ id, client, topic string }{{honk, "car7", "cmd/car7"}, {unlock, "car8", "cars/car8/cmd"}} {
		id, err := core.ParseMessageID(c.id)
		require.NoError(t, err)
		evs := timeline(t, env, id, 3)
		require.Equal(t, []string{trace.HopDownlink, trace.HopDeviceAck, trace.HopReceipt}, hops(evs), c.client)
		deliver, devAck, receipt := evs[0], evs[1], evs[2]
		for _, e := range evs {
			require.Equal(t, c.client, e.Actor)
		}
		require.Equal(t, c.topic, deliver.Attrs["mqtt_topic"])
		require.Equal(t, "1", deliver.Attrs["qos"])
		require.NotEmpty(t, deliver.Attrs["packet_id"])
		require.Equal(t, "gw-1", deliver.Attrs["node"])
		require.NotContains(t, deliver.Attrs, "queued")
		require.Equal(t, map[string]string{"packet_id": deliver.Attrs["packet_id"], "qos": "1", "mqtt_topic": c.topic}, devAck.Attrs)
		require.Equal(t, map[string]string{"outcome": bridge.OutcomeDelivered, "topic": bridge.DefaultReceiptsTopic,
			"mqtt_topic": c.topic}, receipt.Attrs)
	}
	require.Equal(t, []string{"cmd/car7=honk"}, p2p.get())
	require.Equal(t, []string{"cars/car8/cmd=unlock"}, sub.get())
}

// A command for a parked session is traced as queued; once the device is
// back it is delivered, acknowledged and receipted.
func TestTraceParkedCommand(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{Sessions: true,
		Trace: &trace.Options{Topics: []string{"commands"}}})
	persistent := func(o *paho3.ClientOptions) { o.SetCleanSession(false) }
	c := dialV3(t, env.TCP, "car9", persistent)
	c.Disconnect(100)
	waitParked(t, env, "car9")

	wake := command(t, env, "car9", "wake", map[string]string{bridge.PropClientID: "car9"})
	id, err := core.ParseMessageID(wake)
	require.NoError(t, err)
	evs := timeline(t, env, id, 1)
	require.Equal(t, []string{trace.HopDownlink}, hops(evs))
	require.Equal(t, "car9", evs[0].Actor)
	require.Equal(t, "true", evs[0].Attrs["queued"])
	require.Equal(t, "commands/car9", evs[0].Attrs["mqtt_topic"])
	require.NotContains(t, evs[0].Attrs, "packet_id", "not known while queued")

	var got received
	dialV3(t, env.TCP, "car9", persistent, func(o *paho3.ClientOptions) { o.SetDefaultPublishHandler(got.add) })
	evs = timeline(t, env, id, 4)
	require.Equal(t, []string{trace.HopDownlink, trace.HopDownlink, trace.HopDeviceAck, trace.HopReceipt}, hops(evs))
	require.Equal(t, "true", evs[0].Attrs["queued"])
	require.NotContains(t, evs[1].Attrs, "queued")
	require.NotEmpty(t, evs[1].Attrs["packet_id"])
	require.Equal(t, evs[1].Attrs["packet_id"], evs[2].Attrs["packet_id"])
	require.Equal(t, bridge.OutcomeDelivered, evs[3].Attrs["outcome"])
	require.Equal(t, []string{"commands/car9=wake"}, got.get())
}
