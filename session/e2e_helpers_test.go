package session

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// startEngine runs an engine with store s and one TCP listener on a free
// loopback port until stopEngine or the end of the test.
func startEngine(t testing.TB, s *Store) (*engine.Engine, string) {
	t.Helper()
	e, err := engine.New(engine.Options{Listeners: []engine.Listener{{Type: "tcp", Addr: "127.0.0.1:0"}},
		Hooks: engine.Hooks{Sessions: s}})
	require.NoError(t, err)
	s.Attach(e)
	require.NoError(t, e.Start())
	t.Cleanup(func() { stopEngine(t, e) })
	return e, e.Addr("tcp").String()
}

func stopEngine(t testing.TB, e *engine.Engine) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, e.Shutdown(ctx))
}

// restart stops engine e and closes its store s, then opens the store of
// dir again under a new engine: a graceful restart of the process.
func restart(t testing.TB, e *engine.Engine, s *Store, dir string) (*Store, *engine.Engine, string) {
	t.Helper()
	stopEngine(t, e)
	require.NoError(t, s.Close())
	s = openStore(t, dir)
	e, addr := startEngine(t, s)
	return s, e, addr
}

func persistent(o *paho3.ClientOptions) { o.SetCleanSession(false) }

func dialV3(t testing.TB, addr, id string, tune ...func(*paho3.ClientOptions)) (paho3.Client, bool) {
	t.Helper()
	o := paho3.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).
		SetAutoReconnect(false).SetConnectRetry(false).SetProtocolVersion(4).
		SetOrderMatters(true).SetWriteTimeout(10 * time.Second)
	for _, f := range tune {
		f(o)
	}
	c := paho3.NewClient(o)
	tok := c.Connect()
	require.True(t, tok.WaitTimeout(10*time.Second), "connect %s timed out", id)
	require.NoError(t, tok.Error(), "connect %s", id)
	t.Cleanup(func() { c.Disconnect(50) })
	return c, tok.(*paho3.ConnectToken).SessionPresent()
}

func wait(t testing.TB, tok paho3.Token) {
	t.Helper()
	require.True(t, tok.WaitTimeout(10*time.Second), "timed out")
	require.NoError(t, tok.Error())
}

// inbox collects the messages a paho 3 client receives.
type inbox struct {
	mu   sync.Mutex
	msgs []paho3.Message
}

func (in *inbox) handler(_ paho3.Client, m paho3.Message) {
	in.mu.Lock()
	in.msgs = append(in.msgs, m)
	in.mu.Unlock()
}

func (in *inbox) all() []paho3.Message {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]paho3.Message(nil), in.msgs...)
}

func (in *inbox) payloads() []string {
	var out []string
	for _, m := range in.all() {
		out = append(out, string(m.Payload()))
	}
	return out
}

func (in *inbox) count() int { return len(in.all()) }

// dialV5 connects a paho.golang (MQTT 5) client; published messages go to
// onPub. It is disconnected at the end of the test.
func dialV5(t testing.TB, addr string, cp *paho.Connect, onPub func(paho.PublishReceived) (bool, error)) (*paho.Client, *paho.Connack) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	cfg := paho.ClientConfig{Conn: conn}
	if onPub != nil {
		cfg.OnPublishReceived = []func(paho.PublishReceived) (bool, error){onPub}
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
	return c, ca
}

// raw is an MQTT 5 connection driven packet by packet (paho.golang's
// codec), for flows a client library completes on its own.
type raw struct {
	t    testing.TB
	conn net.Conn
}

func dialRaw(t testing.TB, addr string, cp *packets.Connect) (*raw, *packets.Connack) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	r := &raw{t: t, conn: conn}
	pk := packets.NewControlPacket(packets.CONNECT)
	props := pk.Content.(*packets.Connect).Properties
	*pk.Content.(*packets.Connect) = *cp
	if cp.Properties == nil {
		pk.Content.(*packets.Connect).Properties = props
	}
	r.send(pk)
	ack := r.expect(packets.CONNACK).Content.(*packets.Connack)
	require.Equal(t, byte(0), ack.ReasonCode)
	return r, ack
}

func (r *raw) send(pk *packets.ControlPacket) {
	r.t.Helper()
	require.NoError(r.t, r.conn.SetWriteDeadline(time.Now().Add(5*time.Second)))
	_, err := pk.WriteTo(r.conn)
	require.NoError(r.t, err)
}

func (r *raw) expect(typ byte) *packets.ControlPacket {
	r.t.Helper()
	require.NoError(r.t, r.conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	pk, err := packets.ReadPacket(r.conn)
	require.NoError(r.t, err)
	require.Equal(r.t, typ, pk.Type, "got %s", pk.PacketType())
	return pk
}

func (r *raw) publish(pid uint16, qos byte, dup bool, topic, payload string) {
	pk := packets.NewControlPacket(packets.PUBLISH)
	p := pk.Content.(*packets.Publish)
	p.PacketID, p.QoS, p.Duplicate, p.Topic, p.Payload = pid, qos, dup, topic, []byte(payload)
	r.send(pk)
}

func (r *raw) ack(typ byte, pid uint16) {
	pk := packets.NewControlPacket(typ)
	switch c := pk.Content.(type) {
	case *packets.Pubrel:
		c.PacketID = pid
	case *packets.Puback:
		c.PacketID = pid
	case *packets.Pubrec:
		c.PacketID = pid
	case *packets.Pubcomp:
		c.PacketID = pid
	}
	r.send(pk)
}

func u32(v uint32) *uint32 { return &v }
