package gateway_test

import (
	"context"
	"fmt"
	"net"
	"sort"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/gateway/gatewaytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// dialV3 connects a paho MQTT 3.1.1 client.
func dialV3(t testing.TB, addr, id string, tune ...func(*paho3.ClientOptions)) paho3.Client {
	t.Helper()
	o := paho3.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).
		SetAutoReconnect(false).SetConnectRetry(false).SetProtocolVersion(4).
		SetOrderMatters(true).SetWriteTimeout(10 * time.Second).SetMaxResumePubInFlight(0)
	for _, f := range tune {
		f(o)
	}
	c := paho3.NewClient(o)
	tok := c.Connect()
	require.True(t, tok.WaitTimeout(10*time.Second), "connect %s timed out", id)
	require.NoError(t, tok.Error(), "connect %s", id)
	t.Cleanup(func() { c.Disconnect(100) })
	return c
}

// dialV5 connects a paho.golang MQTT 5 client with a clean start.
func dialV5(t testing.TB, addr, id string, onPub func(paho.PublishReceived) (bool, error)) *paho.Client {
	t.Helper()
	return dialV5With(t, addr, &paho.Connect{ClientID: id, KeepAlive: 30, CleanStart: true}, func(cfg *paho.ClientConfig) {
		if onPub != nil {
			cfg.OnPublishReceived = []func(paho.PublishReceived) (bool, error){onPub}
		}
	})
}

// dialV5With dials addr and sends cp with a paho.golang MQTT 5 client
// (tune, if set, adjusts its config); the CONNECT must succeed. The test's
// cleanup disconnects it.
func dialV5With(t testing.TB, addr string, cp *paho.Connect, tune func(*paho.ClientConfig)) *paho.Client {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	cfg := paho.ClientConfig{Conn: conn}
	if tune != nil {
		tune(&cfg)
	}
	c := paho.NewClient(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ca, err := c.Connect(ctx, cp)
	require.NoError(t, err, "connect %s", cp.ClientID)
	require.Equal(t, byte(0), ca.ReasonCode)
	t.Cleanup(func() {
		_ = c.Disconnect(&paho.Disconnect{ReasonCode: 0})
		<-c.Done()
	})
	return c
}

// readAll returns every message of a topic, queue by queue, in queue order.
func readAll(t testing.TB, st *store.Store, topic string) []core.StoredMessage {
	t.Helper()
	ctx := context.Background()
	info, err := st.Topic(ctx, topic)
	if err != nil {
		return nil
	}
	var out []core.StoredMessage
	for q := 0; q < info.Queues; q++ {
		off := int64(0)
		for {
			res, err := st.Read(ctx, core.ReadRequest{Topic: topic, Queue: q, Offset: off, MaxCount: 1000})
			require.NoError(t, err)
			if len(res.Messages) == 0 {
				break
			}
			for _, m := range res.Messages {
				out = append(out, *m)
			}
			off = res.NextOffset
		}
	}
	return out
}

// byKey groups bodies by sharding key, keeping queue order.
func byKey(ms []core.StoredMessage) map[string][]string {
	out := map[string][]string{}
	for _, m := range ms {
		out[m.ShardingKey] = append(out[m.ShardingKey], string(m.Body))
	}
	return out
}

func seqBodies(n int) []string {
	s := make([]string, n)
	for i := range s {
		s[i] = fmt.Sprintf("m%04d", i)
	}
	return s
}

func keys(m map[string][]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func zerologNop() zerolog.Logger { return zerolog.Nop() }

// sessionOf returns what the engine holds of clientID's session: queued
// counts its messages in flight and queued; offline says it has no
// connection.
func sessionOf(env *gatewaytest.Env, clientID string) (queued int, offline, ok bool) {
	ci, ok := env.Gateway.Engine().Client(clientID)
	return ci.Inflight + ci.Queued, !ci.Connected, ok
}
