package gateway_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/bridge"
	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/gateway/gatewaytest"
)

// 100 devices × 100 messages, half over paho MQTT 3.1.1 and half over
// paho.golang MQTT 5, QoS 1 and 2 mixed per device: every acknowledged
// message is in the core under the device's key, in publish order, with
// the MQTT metadata as properties.
func TestUplinkEveryAckedMessageInOrderPerDevice(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{})
	const devices, perDevice = 100, 100
	var wg sync.WaitGroup
	errs := make(chan error, devices)
	for d := range devices {
		id := fmt.Sprintf("car-%03d", d)
		topic := "telemetry/" + id
		if d%2 == 0 {
			c := dialV3(t, env.TCP, id)
			wg.Add(1)
			go func() {
				defer wg.Done()
				toks := make([]paho3.Token, 0, perDevice)
				for i := range perDevice {
					toks = append(toks, c.Publish(topic, byte(1+i%2), false, fmt.Sprintf("m%04d", i)))
				}
				for _, tok := range toks {
					if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
						errs <- fmt.Errorf("%s: publish: %v", id, tok.Error())
						return
					}
				}
			}()
			continue
		}
		c := dialV5(t, env.TCP, id, nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perDevice {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				res, err := c.Publish(ctx, &paho.Publish{Topic: topic, QoS: byte(1 + i%2), Payload: fmt.Appendf(nil, "m%04d", i),
					Properties: &paho.PublishProperties{User: paho.UserProperties{{Key: "fw", Value: "1.2"}}, ContentType: "text/plain"}})
				cancel()
				if err != nil || res.ReasonCode != 0 {
					errs <- fmt.Errorf("%s: publish %d: %v %v", id, i, err, res)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	// Every publish was acknowledged, so all are in the core now.
	got := byKey(readAll(t, env.Store, "telemetry"))
	require.Len(t, got, devices)
	for _, k := range keys(got) {
		require.Equal(t, seqBodies(perDevice), got[k], "device %s", k)
	}
	ms := readAll(t, env.Store, "telemetry")
	for _, m := range ms {
		require.Equal(t, "telemetry/"+m.ShardingKey, m.Properties[bridge.PropTopic])
		require.Equal(t, m.ShardingKey, m.Properties[bridge.PropClientID])
		require.Equal(t, "false", m.Properties[bridge.PropRetain])
		require.Contains(t, []string{"1", "2"}, m.Properties[bridge.PropQoS])
		var d int
		_, err := fmt.Sscanf(m.ShardingKey, "car-%03d", &d)
		require.NoError(t, err)
		if d%2 == 1 {
			require.Equal(t, "1.2", m.Properties["fw"], "v5 user property")
			require.Equal(t, "text/plain", m.Properties[bridge.PropContentType])
		}
	}
}

// With --flush sync, an acknowledged publish is on disk: a power cut right
// after the PUBACK loses none of them.
func TestPubackOnlyAfterFsync(t *testing.T) {
	fs := vfsCrash()
	env := gatewaytest.Start(t, gatewaytest.Options{Dir: "/data", Store: store.Options{FS: fs, FlushPolicy: store.FlushSync}})
	c := dialV3(t, env.TCP, "dev-sync")
	const n = 300
	toks := make([]paho3.Token, n)
	for i := range toks {
		toks[i] = c.Publish("orders/dev-sync", 1, false, fmt.Sprintf("m%04d", i))
	}
	for _, tok := range toks {
		require.True(t, tok.WaitTimeout(20*time.Second))
		require.NoError(t, tok.Error())
	}
	// Power loss now: only fsynced bytes survive.
	survivor := fs.CrashClone()
	st, err := store.Open("/data", store.Options{FS: survivor})
	require.NoError(t, err)
	defer st.Close()
	got := byKey(readAll(t, st, "orders"))
	require.Equal(t, seqBodies(n), got["dev-sync"])
	require.Less(t, env.Store.Stats().Fsyncs, int64(n), "many publishes of one device share an fsync")
}

// QoS 0 is appended without waiting and still lands in order.
func TestQoS0Bridged(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{})
	c := dialV3(t, env.TCP, "dev-q0")
	for i := range 50 {
		tok := c.Publish("metrics/dev-q0", 0, false, fmt.Sprintf("m%04d", i))
		require.True(t, tok.WaitTimeout(5*time.Second))
	}
	require.Eventually(t, func() bool { return len(readAll(t, env.Store, "metrics")) == 50 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, seqBodies(50), byKey(readAll(t, env.Store, "metrics"))["dev-q0"])
}

// MQTT subscribers receive bridged messages as from any broker, at their
// QoS, and '$' topics or topics whose first level is no core name stay
// MQTT-only.
func TestMQTTSubscribersStillServed(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{})
	got := make(chan string, 10)
	sub := dialV3(t, env.TCP, "watcher")
	tok := sub.Subscribe("#", 1, func(_ paho3.Client, m paho3.Message) { got <- m.Topic() + "=" + string(m.Payload()) })
	require.True(t, tok.WaitTimeout(5*time.Second))
	require.NoError(t, tok.Error())

	pub := dialV3(t, env.TCP, "pub")
	for _, topic := range []string{"alerts/x", "bad topic!/x", "alerts/y"} {
		tok := pub.Publish(topic, 1, false, "hi")
		require.True(t, tok.WaitTimeout(5*time.Second))
		require.NoError(t, tok.Error())
	}
	var recv []string
	for range 3 {
		select {
		case s := <-got:
			recv = append(recv, s)
		case <-time.After(10 * time.Second):
			t.Fatalf("subscriber got only %v", recv)
		}
	}
	require.ElementsMatch(t, []string{"alerts/x=hi", "bad topic!/x=hi", "alerts/y=hi"}, recv)
	require.Len(t, readAll(t, env.Store, "alerts"), 2)
}

// Retained QoS 1 messages are stored for MQTT after they are durable.
func TestRetainedAfterDurable(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{})
	pub := dialV3(t, env.TCP, "pub")
	tok := pub.Publish("config/dev-1", 1, true, "v1")
	require.True(t, tok.WaitTimeout(5*time.Second))
	require.NoError(t, tok.Error())
	got := make(chan string, 1)
	sub := dialV3(t, env.TCP, "late")
	tok = sub.Subscribe("config/#", 1, func(_ paho3.Client, m paho3.Message) { got <- string(m.Payload()) })
	require.True(t, tok.WaitTimeout(5*time.Second))
	select {
	case v := <-got:
		require.Equal(t, "v1", v)
	case <-time.After(10 * time.Second):
		t.Fatal("retained message not delivered")
	}
	ms := readAll(t, env.Store, "config")
	require.Len(t, ms, 1)
	require.Equal(t, "true", ms[0].Properties[bridge.PropRetain])
}
