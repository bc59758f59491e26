package rpc_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/gateway/gatewaytest"
	"github.com/ferrymq/ferrymq/gateway/rpc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// dialV5 connects an MQTT 5 device whose handler answers each request it
// gets (nil: it never answers); it reports every request on got.
func dialV5(t *testing.T, addr, id string, answer func(*paho.Publish) []byte, got chan<- *paho.Publish) *paho.Client {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	var c *paho.Client
	var answering sync.WaitGroup
	c = paho.NewClient(paho.ClientConfig{Conn: conn, OnPublishReceived: []func(paho.PublishReceived) (bool, error){
		func(r paho.PublishReceived) (bool, error) {
			p := r.Packet
			answers := answer != nil && p.Properties != nil && p.Properties.ResponseTopic != ""
			if answers {
				answering.Add(1) // before got: a test that read got waits for it in Cleanup
			}
			if got != nil {
				got <- p
			}
			if answers {
				go func() { // not on paho's receive goroutine
					defer answering.Done()
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					_, _ = c.Publish(ctx, &paho.Publish{Topic: p.Properties.ResponseTopic, QoS: 1, Payload: answer(p),
						Properties: &paho.PublishProperties{CorrelationData: p.Properties.CorrelationData}})
				}()
			}
			return true, nil
		}}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ca, err := c.Connect(ctx, &paho.Connect{ClientID: id, KeepAlive: 30, CleanStart: true})
	require.NoError(t, err)
	require.Equal(t, byte(0), ca.ReasonCode)
	t.Cleanup(func() {
		answering.Wait()
		_ = c.Disconnect(&paho.Disconnect{})
		<-c.Done()
	})
	return c
}

// An MQTT 5 device gets the request with Response Topic and Correlation
// Data, answers on it, and the call returns its answer.
func TestCallAnsweredByMQTT5Device(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{})
	got := make(chan *paho.Publish, 1)
	dialV5(t, env.TCP, "car-5", func(p *paho.Publish) []byte { return append([]byte("done:"), p.Payload...) }, got)
	svc := env.Node.RPC()
	a, err := svc.Call(t.Context(), "car-5", []byte("unlock"), 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, "done:unlock", string(a.Payload))
	p := <-got
	id := a.ID.String()
	require.Equal(t, "$rpc/car-5/request/"+id, p.Topic)
	require.Equal(t, byte(1), p.QoS)
	require.Equal(t, "$rpc/car-5/response/"+id, p.Properties.ResponseTopic)
	require.Equal(t, id, string(p.Properties.CorrelationData))
	require.NotNil(t, p.Properties.MessageExpiry, "the request expires with the call")
	require.LessOrEqual(t, *p.Properties.MessageExpiry, uint32(6))
	require.Equal(t, 1.0, calls(t, svc, "answered"))
}

// An MQTT 3.1.1 device has no Response Topic: it answers on the topic the
// convention builds from the request's.
func TestCallAnsweredByMQTT311Device(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{})
	o := paho3.NewClientOptions().AddBroker("tcp://" + env.TCP).SetClientID("car-3").SetProtocolVersion(4).SetAutoReconnect(false)
	o.SetDefaultPublishHandler(func(c paho3.Client, m paho3.Message) {
		resp := strings.Replace(m.Topic(), "/request/", "/response/", 1)
		go c.Publish(resp, 1, false, append([]byte("v3:"), m.Payload()...))
	})
	c := paho3.NewClient(o)
	tok := c.Connect()
	require.True(t, tok.WaitTimeout(10*time.Second))
	require.NoError(t, tok.Error())
	t.Cleanup(func() { c.Disconnect(100) })
	a, err := env.Node.RPC().Call(t.Context(), "car-3", []byte("horn"), 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, "v3:horn", string(a.Payload))
}

// A call to a device nobody has connected fails at once; one to a device
// that does not answer times out; a bad call is refused before anything.
func TestCallRefusedOrTimedOut(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{})
	svc := env.Node.RPC()
	start := time.Now()
	_, err := svc.Call(t.Context(), "nobody", []byte("x"), 5*time.Second)
	require.ErrorIs(t, err, rpc.ErrNotConnected)
	require.Less(t, time.Since(start), 5*time.Second, "not connected must not wait for the timeout")

	got := make(chan *paho.Publish, 1)
	dialV5(t, env.TCP, "mute", nil, got)
	_, err = svc.Call(t.Context(), "mute", []byte("x"), time.Second)
	require.ErrorIs(t, err, rpc.ErrTimeout)
	<-got // it was delivered, just not answered

	for _, c := range []struct {
		id string
		to time.Duration
		n  int
	}{{"mute", 500 * time.Millisecond, 1}, {"mute", 61 * time.Second, 1}, {"", time.Second, 1}, {"a+b", time.Second, 1},
		{"a#", time.Second, 1}, {"mute", time.Second, rpc.DefaultMaxPayload + 1}} {
		_, err := svc.Call(t.Context(), c.id, make([]byte, c.n), c.to)
		require.ErrorIs(t, err, rpc.ErrBadRequest, "%q %v %d", c.id, c.to, c.n)
	}
	require.Equal(t, 1.0, calls(t, svc, "not_connected"))
	require.Equal(t, 1.0, calls(t, svc, "timeout"))
	require.Equal(t, 6.0, calls(t, svc, "bad_request"))
	here, asked := svc.Pending()
	require.Zero(t, here+asked, "ended calls are forgotten")
}

// A device may answer only its own calls: a publish to another client's
// $rpc topic, or to a request topic, is refused; a late answer is taken
// and counted; none of them reaches subscribers.
func TestDevicesAnswerOnlyTheirOwnCalls(t *testing.T) {
	env := gatewaytest.Start(t, gatewaytest.Options{})
	spy := make(chan *paho.Publish, 4)
	s := dialV5(t, env.TCP, "spy", nil, spy)
	_, err := s.Subscribe(t.Context(), &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "$rpc/#", QoS: 1}}})
	require.NoError(t, err)
	got := make(chan *paho.Publish, 1)
	d := dialV5(t, env.TCP, "dev", nil, got)
	svc := env.Node.RPC()
	callDone := make(chan error, 1)
	go func() {
		_, err := svc.Call(context.Background(), "dev", []byte("q"), time.Second)
		callDone <- err
	}()
	req := <-got
	id := string(req.Properties.CorrelationData)
	for _, topic := range []string{"$rpc/other/response/" + id, "$rpc/dev/request/" + id, "$rpc/dev/response/not-an-id", "$rpc/dev"} {
		r, err := d.Publish(t.Context(), &paho.Publish{Topic: topic, QoS: 1, Payload: []byte("a")})
		require.Error(t, err, topic) // paho returns a refusal as an error, with the PUBACK
		require.NotNil(t, r, topic)
		require.Equal(t, byte(0x87), r.ReasonCode, topic)
	}
	require.ErrorIs(t, <-callDone, rpc.ErrTimeout, "no refused publish answered the call")
	r, err := d.Publish(t.Context(), &paho.Publish{Topic: req.Properties.ResponseTopic, QoS: 1, Payload: []byte("late")})
	require.NoError(t, err)
	require.Equal(t, byte(0), r.ReasonCode)
	require.Eventually(t, func() bool {
		return metric(t, svc, "ferrymq_rpc_answers_unmatched_total", "") == 1
	}, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, 4.0, metric(t, svc, "ferrymq_rpc_publishes_refused_total", ""))
	select {
	case p := <-spy:
		t.Fatalf("a $rpc publish reached a subscriber: %s", p.Topic)
	case <-time.After(200 * time.Millisecond):
	}
}
