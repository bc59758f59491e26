package bridge_test

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/bridge"
	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/brokertest"
	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/ferrymq/ferrymq/core/jetstream"
	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/gateway/engine"
	"github.com/ferrymq/ferrymq/session"
)

// gateway is a gateway as `ferrymq serve` wires it, in process: a core,
// the session log, the engine and the bridge, on a core and a session
// folder that outlive it (a restart opens them again).
type gateway struct {
	core core.Broker
	// delay, when set, writes the gateway's delayed publishes (never
	// started: first copies only, as a gateway's own delay service).
	delay *delay.Service
	ss    *session.Store
	e     *engine.Engine
	h     *bridge.Hook
	addr  string
}

// coreSpot is where the test's core lives across restarts: open connects
// a new engine to it (closed by gateway.stop).
type coreSpot interface {
	open(t *testing.T) core.Broker
}

// embeddedCore is the embedded store in a folder.
type embeddedCore string

func (dir embeddedCore) open(t *testing.T) core.Broker {
	t.Helper()
	st, err := store.Open(string(dir), store.Options{})
	require.NoError(t, err)
	return st
}

// jetstreamCore is the JetStream engine on a NATS server.
type jetstreamCore string

func (url jetstreamCore) open(t *testing.T) core.Broker {
	t.Helper()
	e, err := jetstream.Open(t.Context(), jetstream.Options{URLs: []string{string(url)}, Timeout: 5 * time.Second})
	require.NoError(t, err)
	return e
}

// startGateway opens the core at cs and the sessions in sessDir and serves
// MQTT on a loopback port; wrap, if set, stands between the bridge and the
// core.
func startGateway(t *testing.T, cs coreSpot, sessDir string, wrap func(bridge.Core) bridge.Core) *gateway {
	t.Helper()
	return startGatewayWith(t, cs, sessDir, "", wrap)
}

// startGatewayWith is startGateway whose bridge produces through a delay
// service in delayDir ("": none).
func startGatewayWith(t *testing.T, cs coreSpot, sessDir, delayDir string, wrap func(bridge.Core) bridge.Core) *gateway {
	t.Helper()
	g := &gateway{core: cs.open(t)}
	var err error
	g.ss, err = session.Open(sessDir, session.Options{})
	require.NoError(t, err)
	b := g.core
	if delayDir != "" {
		g.delay, err = delay.New(g.core, delayDir, delay.Options{})
		require.NoError(t, err)
		b = g.delay.Broker()
	}
	c := bridge.Embedded(b)
	if wrap != nil {
		c = wrap(c)
	}
	g.h, err = bridge.New(bridge.Options{Core: c, Node: "gw-1", DisableEvents: true, DisableDownlink: true, DisableReceipts: true})
	require.NoError(t, err)
	g.e, err = engine.New(engine.Options{
		Listeners: []engine.Listener{{Name: "tcp", Type: "tcp", Addr: "127.0.0.1:0"}},
		Hooks:     engine.Hooks{Uplink: g.h, Sessions: g.ss},
	})
	require.NoError(t, err)
	g.ss.Attach(g.e)
	g.h.Attach(g.e)
	require.NoError(t, g.e.Start())
	g.h.Start()
	g.addr = g.e.Addr("tcp").String()
	return g
}

// stop shuts the gateway down; crash first closes the session store, so
// that nothing the engine writes from then on (a PUBREC's marker, an
// offline time) is kept: what a kill -9 at that moment leaves.
func (g *gateway) stop(t *testing.T, crash func()) {
	t.Helper()
	if crash != nil {
		require.NoError(t, g.ss.Close())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, g.e.Shutdown(ctx))
	if crash != nil {
		crash()
	}
	require.NoError(t, g.h.Drain(ctx))
	if crash == nil {
		require.NoError(t, g.ss.Close())
	}
	if g.delay != nil {
		require.NoError(t, g.delay.Close())
	}
	require.NoError(t, g.core.Close())
}

// crashingCore is a core through which, once armed, a process dies
// around its append: after it (the message is stored, its done never
// runs: no PUBREC) or before it (nothing is stored). Held completions are
// let go by release, after the crash, so that the hook can drain.
type crashingCore struct {
	bridge.Core
	afterAppend bool
	// failAfterAppend: no crash; the append is reported failed although
	// it was stored (a timeout, say).
	failAfterAppend bool
	armed           atomic.Bool
	appended        chan struct{} // one per publish that reached the core armed

	mu   sync.Mutex
	held []func()
}

func (c *crashingCore) ProduceAsync(msgs []*core.Message, done func([]core.SendResult, error)) {
	if !c.armed.Load() {
		c.Core.ProduceAsync(msgs, done)
		return
	}
	if c.failAfterAppend {
		c.Core.ProduceAsync(msgs, func([]core.SendResult, error) {
			done(nil, errors.New("core: request timed out"))
			c.appended <- struct{}{}
		})
		return
	}
	if !c.afterAppend {
		c.hold(func() { done(nil, core.ErrClosed) })
		c.appended <- struct{}{}
		return
	}
	c.Core.ProduceAsync(msgs, func(res []core.SendResult, err error) {
		c.hold(func() { done(nil, core.ErrClosed) }) // the process is gone: no ack
		c.appended <- struct{}{}
	})
}

func (c *crashingCore) hold(f func()) {
	c.mu.Lock()
	c.held = append(c.held, f)
	c.mu.Unlock()
}

func (c *crashingCore) release() {
	c.mu.Lock()
	held := c.held
	c.held = nil
	c.mu.Unlock()
	for _, f := range held {
		f()
	}
}

// storedBodies reads every message of topic in the core at cs.
func storedBodies(t *testing.T, cs coreSpot, topic string) []string {
	t.Helper()
	b := cs.open(t)
	defer func() { require.NoError(t, b.Close()) }()
	msgs, err := brokertest.ReadTopic(t.Context(), b, topic)
	require.NoError(t, err)
	var out []string
	for _, m := range msgs {
		out = append(out, string(m.Body))
	}
	return out
}

// A QoS 2 publish stored in the core by a process that died before its
// PUBREC went out is resent by the client (MQTT 3.1.1, paho with a file
// store, clean session 0) to the restarted gateway: it is answered and
// completes, and the core holds it once — and a publish the process died
// before storing is stored once, after the restart. [MQTT-4.3.3-10]
func TestQoS2ResendAfterCrashStoredOnceV3(t *testing.T) {
	for _, afterAppend := range []bool{true, false} {
		name := map[bool]string{true: "crash after the append", false: "crash before the append"}[afterAppend]
		t.Run(name, func(t *testing.T) {
			cs, sessDir, pahoDir := embeddedCore(t.TempDir()), t.TempDir(), t.TempDir()
			cc := &crashingCore{afterAppend: afterAppend, appended: make(chan struct{}, 1)}
			g := startGateway(t, cs, sessDir, func(c bridge.Core) bridge.Core { cc.Core = c; return cc })

			dial := func(addr string) paho3.Client {
				o := paho3.NewClientOptions().AddBroker("tcp://" + addr).SetClientID("car-7").SetCleanSession(false).
					SetStore(paho3.NewFileStore(pahoDir)).SetAutoReconnect(false).SetConnectRetry(false).SetProtocolVersion(4)
				c := paho3.NewClient(o)
				tok := c.Connect()
				require.True(t, tok.WaitTimeout(10*time.Second))
				require.NoError(t, tok.Error())
				return c
			}
			c := dial(g.addr)
			tok := c.Publish("telemetry/car-7", 1, false, "before") // a completed flow first: IDs get reused
			require.True(t, tok.WaitTimeout(10*time.Second))
			require.NoError(t, tok.Error())
			cc.armed.Store(true)
			c.Publish("telemetry/car-7", 2, false, "once")
			select {
			case <-cc.appended:
			case <-time.After(10 * time.Second):
				t.Fatal("the publish never reached the core")
			}
			g.stop(t, cc.release)
			c.Disconnect(0) // the connection is gone already; the file store keeps the PUBLISH

			g = startGateway(t, cs, sessDir, nil)
			c = dial(g.addr) // resends the PUBLISH with DUP set
			require.Eventually(t, func() bool { return pahoOutbound(t, pahoDir) == 0 }, 10*time.Second, 10*time.Millisecond,
				"the resent publish completes (PUBREC, PUBREL, PUBCOMP)")
			c.Disconnect(50)
			g.stop(t, nil)
			require.Equal(t, []string{"before", "once"}, storedBodies(t, cs, "telemetry"), "in the core once")
		})
	}
}

// An append reported failed may still have been stored: the MQTT 3.1.1
// client is disconnected without a PUBREC, and its resend on the next
// connection to the same gateway is looked for in the core and answered,
// not stored again.
func TestQoS2FailedAppendResentStoredOnce(t *testing.T) {
	cs, sessDir, pahoDir := embeddedCore(t.TempDir()), t.TempDir(), t.TempDir()
	cc := &crashingCore{failAfterAppend: true, appended: make(chan struct{}, 1)}
	g := startGateway(t, cs, sessDir, func(c bridge.Core) bridge.Core { cc.Core = c; return cc })
	lost := make(chan error, 1)
	dial := func() paho3.Client {
		o := paho3.NewClientOptions().AddBroker("tcp://" + g.addr).SetClientID("car-9").SetCleanSession(false).
			SetStore(paho3.NewFileStore(pahoDir)).SetAutoReconnect(false).SetConnectRetry(false).SetProtocolVersion(4).
			SetConnectionLostHandler(func(_ paho3.Client, err error) { lost <- err })
		c := paho3.NewClient(o)
		tok := c.Connect()
		require.True(t, tok.WaitTimeout(10*time.Second))
		require.NoError(t, tok.Error())
		return c
	}
	c := dial()
	cc.armed.Store(true)
	c.Publish("telemetry/car-9", 2, false, "once")
	select {
	case <-lost: // disconnected: MQTT 3 cannot be told the append failed
	case <-time.After(10 * time.Second):
		t.Fatal("the client was not disconnected")
	}
	<-cc.appended
	cc.armed.Store(false)
	c.Disconnect(0)

	c = dial() // resends the PUBLISH with DUP set
	require.Eventually(t, func() bool { return pahoOutbound(t, pahoDir) == 0 }, 10*time.Second, 10*time.Millisecond,
		"the resent publish completes")
	c.Disconnect(50)
	g.stop(t, nil)
	require.Equal(t, []string{"once"}, storedBodies(t, cs, "telemetry"), "in the core once")
}

// pahoOutbound counts the outbound packets a paho file store holds.
func pahoOutbound(t *testing.T, dir string) int {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	n := 0
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "o.") && strings.HasSuffix(e.Name(), ".msg") {
			n++
		}
	}
	return n
}

// The same for MQTT 5, packet by packet: packet ID 7 first carries a
// completed publish, then one the process stores and dies before
// answering; the resend of 7 with DUP after the restart is answered
// PUBREC, its PUBREL gets PUBCOMP, and the core holds each once. A resend
// of the same ID on the same connection while the flow is open is not
// stored again either. [MQTT-4.3.3-10] With each engine: the embedded
// store, and JetStream (a NATS server of the test's; the look goes
// through the JetStream engine's key index).
func TestQoS2ResendAfterCrashStoredOnceV5(t *testing.T) {
	for _, c := range []struct {
		name string
		spot func(t *testing.T) coreSpot
	}{
		{"embedded", func(t *testing.T) coreSpot { return embeddedCore(t.TempDir()) }},
		{"jetstream", func(t *testing.T) coreSpot { return jetstreamCore(natstest.RunServer(t, natstest.SyncAlways()).URL) }},
	} {
		t.Run(c.name, func(t *testing.T) { resendAfterCrashV5(t, c.spot(t), nil) })
	}
	// The JetStream engine writes a message's key-index entry after the
	// message: a process killed in between leaves the message out of
	// FindByKey. The look then finds it in the queue of its key.
	t.Run("jetstream without the key index", func(t *testing.T) {
		url := natstest.RunServer(t, natstest.SyncAlways()).URL
		resendAfterCrashV5(t, jetstreamCore(url), func() {
			nc, err := nats.Connect(url)
			require.NoError(t, err)
			defer nc.Close()
			js, err := natsjs.New(nc)
			require.NoError(t, err)
			keys, err := js.Stream(t.Context(), "FMQ__KEYS")
			require.NoError(t, err)
			require.NoError(t, keys.Purge(t.Context()))
			info, err := keys.Info(t.Context())
			require.NoError(t, err)
			require.Zero(t, info.State.Msgs, "every key-index entry gone")
		})
	})
}

// resendAfterCrashV5: packet ID 7 completes, is reused, and the process
// dies after the core stored the second message; afterCrash, if set, runs
// then (before the restart). The resend is answered and stored once.
func resendAfterCrashV5(t *testing.T, cs coreSpot, afterCrash func()) {
	sessDir := t.TempDir()
	cp := &packets.Connect{ClientID: "car-8", ProtocolName: "MQTT", ProtocolVersion: 5, KeepAlive: 30, CleanStart: true,
		Properties: &packets.Properties{SessionExpiryInterval: u32(300)}}

	// The first use of ID 7 completes.
	g := startGateway(t, cs, sessDir, nil)
	dev := dialRaw(t, g.addr, cp)
	dev.publish(7, 2, false, "telemetry/car-8", "first")
	require.Equal(t, uint16(7), dev.expect(packets.PUBREC).Content.(*packets.Pubrec).PacketID)
	dev.ack(packets.PUBREL, 7)
	require.Equal(t, uint16(7), dev.expect(packets.PUBCOMP).Content.(*packets.Pubcomp).PacketID)
	dev.close()
	g.stop(t, nil)

	// The second dies with the process after its append.
	cc := &crashingCore{afterAppend: true, appended: make(chan struct{}, 1)}
	cc.armed.Store(true)
	g = startGateway(t, cs, sessDir, func(c bridge.Core) bridge.Core { cc.Core = c; return cc })
	cp.CleanStart = false
	dev = dialRaw(t, g.addr, cp)
	dev.publish(7, 2, false, "telemetry/car-8", "second")
	select {
	case <-cc.appended:
	case <-time.After(10 * time.Second):
		t.Fatal("the publish never reached the core")
	}
	g.stop(t, cc.release)
	dev.close()
	if afterCrash != nil {
		afterCrash()
	}

	g = startGateway(t, cs, sessDir, nil)
	dev = dialRaw(t, g.addr, cp)
	dev.publish(7, 2, true, "telemetry/car-8", "second")
	rec := dev.expect(packets.PUBREC).Content.(*packets.Pubrec)
	require.Equal(t, uint16(7), rec.PacketID)
	require.Equal(t, byte(packets.PubrecSuccess), rec.ReasonCode)
	dev.publish(7, 2, true, "telemetry/car-8", "second") // again, before the PUBREL
	require.Equal(t, uint16(7), dev.expect(packets.PUBREC).Content.(*packets.Pubrec).PacketID)
	dev.ack(packets.PUBREL, 7)
	comp := dev.expect(packets.PUBCOMP).Content.(*packets.Pubcomp)
	require.Equal(t, byte(packets.PubcompSuccess), comp.ReasonCode)
	dev.close()
	g.stop(t, nil)
	require.Equal(t, []string{"first", "second"}, storedBodies(t, cs, "telemetry"), "each in the core once")
}

// A bridged QoS 2 publish answered PUBREC stays "taken" in the session
// log (its PUBREC is not written: Result.Findable). A client that resends
// the PUBLISH after the PUBREC and a restart — which it should not — is
// answered PUBREC again after a look in the core, and its PUBREL
// completes: the core holds the message once.
func TestQoS2ResendAfterPubrecAndRestartStoredOnce(t *testing.T) {
	cs, sessDir := embeddedCore(t.TempDir()), t.TempDir()
	cp := &packets.Connect{ClientID: "car-10", ProtocolName: "MQTT", ProtocolVersion: 5, KeepAlive: 30, CleanStart: true,
		Properties: &packets.Properties{SessionExpiryInterval: u32(300)}}
	g := startGateway(t, cs, sessDir, nil)
	dev := dialRaw(t, g.addr, cp)
	dev.publish(3, 2, false, "telemetry/car-10", "once")
	require.Equal(t, uint16(3), dev.expect(packets.PUBREC).Content.(*packets.Pubrec).PacketID)
	dev.close()
	g.stop(t, nil)

	g = startGateway(t, cs, sessDir, nil)
	cp.CleanStart = false
	dev = dialRaw(t, g.addr, cp)
	dev.publish(3, 2, true, "telemetry/car-10", "once")
	require.Equal(t, uint16(3), dev.expect(packets.PUBREC).Content.(*packets.Pubrec).PacketID)
	dev.ack(packets.PUBREL, 3)
	comp := dev.expect(packets.PUBCOMP).Content.(*packets.Pubcomp)
	require.Equal(t, byte(packets.PubcompSuccess), comp.ReasonCode)
	dev.close()
	g.stop(t, nil)
	require.Equal(t, []string{"once"}, storedBodies(t, cs, "telemetry"))
}

// raw is an MQTT 5 connection driven packet by packet (paho.golang's
// codec), for flows a client library completes on its own.
type raw struct {
	t    testing.TB
	conn net.Conn
}

func dialRaw(t testing.TB, addr string, cp *packets.Connect) *raw {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	r := &raw{t: t, conn: conn}
	pk := packets.NewControlPacket(packets.CONNECT)
	*pk.Content.(*packets.Connect) = *cp
	r.send(pk)
	ack := r.expect(packets.CONNACK).Content.(*packets.Connack)
	require.Equal(t, byte(0), ack.ReasonCode)
	return r
}

func (r *raw) close() { _ = r.conn.Close() }

func (r *raw) send(pk *packets.ControlPacket) {
	r.t.Helper()
	require.NoError(r.t, r.conn.SetWriteDeadline(time.Now().Add(5*time.Second)))
	_, err := pk.WriteTo(r.conn)
	require.NoError(r.t, err)
}

func (r *raw) expect(typ byte) *packets.ControlPacket {
	r.t.Helper()
	require.NoError(r.t, r.conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	pk, err := packets.ReadPacket(r.conn)
	require.NoError(r.t, err)
	require.Equal(r.t, typ, pk.Type, "got %s", pk.PacketType())
	return pk
}

func (r *raw) publish(pid uint16, qos byte, dup bool, topic, payload string) {
	r.t.Helper()
	pk := packets.NewControlPacket(packets.PUBLISH)
	p := pk.Content.(*packets.Publish)
	p.PacketID, p.QoS, p.Duplicate, p.Topic, p.Payload = pid, qos, dup, topic, []byte(payload)
	r.send(pk)
}

func (r *raw) ack(typ byte, pid uint16) {
	r.t.Helper()
	pk := packets.NewControlPacket(typ)
	switch c := pk.Content.(type) {
	case *packets.Pubrel:
		c.PacketID = pid
	case *packets.Pubrec:
		c.PacketID = pid
	}
	r.send(pk)
}

func u32(v uint32) *uint32 { return &v }

// A delayed QoS 2 publish ($delayed/{seconds}/{topic}) waits in the delay
// topic: a resend after the process died past its append is looked for
// there too, and not stored again.
func TestQoS2DelayedResendAfterCrashStoredOnce(t *testing.T) {
	cs, sessDir, delayDir := embeddedCore(t.TempDir()), t.TempDir(), t.TempDir()
	cp := &packets.Connect{ClientID: "car-6", ProtocolName: "MQTT", ProtocolVersion: 5, KeepAlive: 30, CleanStart: true,
		Properties: &packets.Properties{SessionExpiryInterval: u32(300)}}
	cc := &crashingCore{afterAppend: true, appended: make(chan struct{}, 1)}
	cc.armed.Store(true)
	g := startGatewayWith(t, cs, sessDir, delayDir, func(c bridge.Core) bridge.Core { cc.Core = c; return cc })
	dev := dialRaw(t, g.addr, cp)
	dev.publish(5, 2, false, "$delayed/600/telemetry/car-6", "later")
	select {
	case <-cc.appended:
	case <-time.After(10 * time.Second):
		t.Fatal("the publish never reached the core")
	}
	g.stop(t, cc.release)
	dev.close()

	g = startGatewayWith(t, cs, sessDir, delayDir, nil)
	cp.CleanStart = false
	dev = dialRaw(t, g.addr, cp)
	dev.publish(5, 2, true, "$delayed/600/telemetry/car-6", "later")
	rec := dev.expect(packets.PUBREC).Content.(*packets.Pubrec)
	require.Equal(t, byte(packets.PubrecSuccess), rec.ReasonCode)
	dev.ack(packets.PUBREL, 5)
	require.Equal(t, byte(packets.PubcompSuccess), dev.expect(packets.PUBCOMP).Content.(*packets.Pubcomp).ReasonCode)
	dev.close()
	g.stop(t, nil)
	require.Len(t, storedBodies(t, cs, delay.DelayTopic), 1, "the delayed message waits once")
}
