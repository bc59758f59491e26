package gateway_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/bridge"
	"github.com/ferrymq/ferrymq/gateway/gatewaytest"
)

// A car with a persistent session subscribes and goes offline; 100
// commands are sent; the gateway restarts; the car reconnects with clean
// session 0 and receives all 100 in order, and a receipt appears for each.
func TestPersistentSessionGetsCommandsAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	env := gatewaytest.Start(t, gatewaytest.Options{Dir: dir, Sessions: true})
	persistent := func(o *paho3.ClientOptions) { o.SetCleanSession(false) }
	c := dialV3(t, env.TCP, "car42", persistent)
	tok := c.Subscribe("cars/car42/cmd", 1, nil)
	require.True(t, tok.WaitTimeout(5*time.Second))
	require.NoError(t, tok.Error())
	c.Disconnect(100)

	const n = 100
	want := make([]string, n)
	ids := map[string]bool{}
	for i := range n {
		want[i] = fmt.Sprintf("cars/car42/cmd=c%03d", i)
		ids[command(t, env, "car42", fmt.Sprintf("c%03d", i), map[string]string{bridge.PropTopic: "cars/car42/cmd"})] = true
	}
	require.Eventually(t, func() bool { return queued(env, "car42") == n }, 10*time.Second, 10*time.Millisecond,
		"commands queued for the offline car")
	env.Stop(t)

	env = gatewaytest.Start(t, gatewaytest.Options{Dir: dir, Sessions: true})
	q, offline, ok := sessionOf(env, "car42")
	require.True(t, ok, "the offline session is back after the restart")
	require.True(t, offline)
	require.Equal(t, n, q)
	var got received
	dialV3(t, env.TCP, "car42", persistent, func(o *paho3.ClientOptions) {
		o.SetDefaultPublishHandler(got.add).SetOrderMatters(true)
	})
	require.Eventually(t, func() bool { return len(got.get()) >= n }, 20*time.Second, 10*time.Millisecond)
	require.Equal(t, want, got.get())
	require.Eventually(t, func() bool {
		delivered := 0
		for id, r := range receipts(t, env) {
			if ids[id] && r.Outcome == bridge.OutcomeDelivered {
				delivered++
			}
		}
		return delivered == n
	}, 10*time.Second, 10*time.Millisecond, "a delivered receipt per command")
}

// A point-to-point command to a car that is offline with a persistent
// session waits in its session; one to a clean-session car that is gone is
// not queued.
func TestPointToPointToOfflineSession(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{Sessions: true})
	c := dialV3(t, env.TCP, "car8", func(o *paho3.ClientOptions) { o.SetCleanSession(false) })
	c.Disconnect(100)
	command(t, env, "car8", "wake", map[string]string{bridge.PropClientID: "car8"})
	var got received
	require.Eventually(t, func() bool { return queued(env, "car8") == 1 }, 10*time.Second, 10*time.Millisecond)
	dialV3(t, env.TCP, "car8", func(o *paho3.ClientOptions) { o.SetCleanSession(false).SetDefaultPublishHandler(got.add) })
	require.Eventually(t, func() bool { return len(got.get()) == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, []string{"commands/car8=wake"}, got.get())
}

// Retained messages survive a restart; a session whose expiry passed does
// not (MQTT 5 session expiry of 1 s).
func TestRetainedSurviveAndSessionsExpire(t *testing.T) {
	dir := t.TempDir()
	env := gatewaytest.Start(t, gatewaytest.Options{Dir: dir, Sessions: true})
	pub := dialV3(t, env.TCP, "pub")
	tok := pub.Publish("config/car-1", 1, true, "v7")
	require.True(t, tok.WaitTimeout(5*time.Second))
	require.NoError(t, tok.Error())

	c := dialV5With(t, env.TCP, &paho.Connect{ClientID: "short-lived", KeepAlive: 30, CleanStart: true,
		Properties: &paho.ConnectProperties{SessionExpiryInterval: ptr(uint32(1))}}, nil)
	require.NoError(t, c.Disconnect(&paho.Disconnect{ReasonCode: 0}))
	<-c.Done()
	keep := dialV3(t, env.TCP, "keeper", func(o *paho3.ClientOptions) { o.SetCleanSession(false) })
	keep.Disconnect(100)
	require.Eventually(t, func() bool {
		_, _, stored := sessionOf(env, "short-lived")
		return !stored
	}, 10*time.Second, 50*time.Millisecond, "expired after 1 s")
	env.Stop(t)

	env = gatewaytest.Start(t, gatewaytest.Options{Dir: dir, Sessions: true})
	_, offline, ok := sessionOf(env, "keeper")
	require.True(t, ok && offline)
	_, _, ok = sessionOf(env, "short-lived")
	require.False(t, ok)
	var got received
	sub := dialV3(t, env.TCP, "reader")
	tok = sub.Subscribe("config/#", 1, got.add)
	require.True(t, tok.WaitTimeout(5*time.Second))
	require.Eventually(t, func() bool { return len(got.get()) == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, []string{"config/car-1=v7"}, got.get())
}

func ptr[T any](v T) *T { return &v }

// queued counts what waits for clientID's session, -1 without one.
func queued(env *gatewaytest.Env, clientID string) int {
	if q, _, ok := sessionOf(env, clientID); ok {
		return q
	}
	return -1
}

// An offline session's queue is bounded: past the configured count the
// backend gets "dropped" receipts at once; QoS 0 is not queued.
func TestOfflineQueueBounded(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{Sessions: true, Bridge: bridge.Options{OfflineMaxMessages: 3}})
	c := dialV3(t, env.TCP, "car5", func(o *paho3.ClientOptions) { o.SetCleanSession(false) })
	c.Disconnect(100)
	var ids []string
	for i := range 5 {
		ids = append(ids, command(t, env, "car5", fmt.Sprint("c", i), map[string]string{bridge.PropClientID: "car5"}))
	}
	q0 := command(t, env, "car5", "q0", map[string]string{bridge.PropClientID: "car5", bridge.PropQoS: "0"})
	require.Eventually(t, func() bool { return len(receipts(t, env)) == 3 }, 10*time.Second, 10*time.Millisecond)
	rs := receipts(t, env)
	require.Equal(t, bridge.OutcomeDropped, rs[ids[3]].Outcome)
	require.Equal(t, bridge.OutcomeDropped, rs[ids[4]].Outcome)
	require.Equal(t, bridge.OutcomeDropped, rs[q0].Outcome)
	var got received
	dialV3(t, env.TCP, "car5", func(o *paho3.ClientOptions) { o.SetCleanSession(false).SetDefaultPublishHandler(got.add) })
	require.Eventually(t, func() bool { return len(got.get()) == 3 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, []string{"commands/car5=c0", "commands/car5=c1", "commands/car5=c2"}, got.get())
}
