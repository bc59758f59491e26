package mqttbench

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// MQTT 5 clients, with eclipse/paho.golang's paho.Client (not autopaho:
// a benchmark should not hide a lost connection behind a reconnect).

// packetTimeout bounds the wait for a PUBACK/PUBCOMP of one message.
const packetTimeout = time.Minute

// sessionExpiry keeps a persistent session for an hour [MQTT-3.1.2-23].
const sessionExpiry = 3600

// dial5 opens the network connection paho.golang runs on.
func dial5(ctx context.Context, addr brokerAddr, timeout time.Duration) (net.Conn, error) {
	if addr.scheme == "ws" {
		// paho v3's websocket adapter is a net.Conn; writes from several
		// goroutines need the lock paho.golang asks for.
		conn, err := mqtt.NewWebsocket(addr.url, nil, timeout, nil, nil)
		if err != nil {
			return nil, err
		}
		return packets.NewThreadSafeConn(conn), nil
	}
	d := net.Dialer{Timeout: timeout}
	return d.DialContext(ctx, "tcp", addr.hostport)
}

// conn5 is a paho.golang client and whether we are closing it: paho
// reports errors of the connection even after a Disconnect of ours.
type conn5 struct {
	c       *paho.Client
	closing atomic.Bool
}

// connect5 dials and connects a paho.golang client configured by cfg.
func connect5(ctx context.Context, o *Options, addr brokerAddr, cfg paho.ClientConfig, errs *errorSet) (*conn5, error) {
	ctx, cancel := context.WithTimeout(ctx, o.ConnectTimeout)
	defer cancel()
	conn, err := dial5(ctx, addr, o.ConnectTimeout)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", cfg.ClientID, err)
	}
	cfg.Conn = conn
	cfg.PacketTimeout = packetTimeout
	cc := &conn5{}
	cfg.OnClientError = func(err error) {
		if !cc.closing.Load() {
			errs.add(fmt.Errorf("client error: %w", err))
		}
	}
	cfg.OnServerDisconnect = func(d *paho.Disconnect) {
		errs.add(fmt.Errorf("disconnected by the server: reason code %#x", d.ReasonCode))
	}
	c := paho.NewClient(cfg)
	cc.c = c
	cp := &paho.Connect{ClientID: cfg.ClientID, KeepAlive: uint16(clientKeepAlive / time.Second), CleanStart: !o.PersistentSession}
	if o.PersistentSession {
		expiry := uint32(sessionExpiry)
		cp.Properties = &paho.ConnectProperties{SessionExpiryInterval: &expiry}
	}
	ca, err := c.Connect(ctx, cp)
	if err == nil && ca.ReasonCode >= 0x80 {
		err = fmt.Errorf("refused (reason code %#x)", ca.ReasonCode)
		cc.closing.Store(true)
		_ = c.Disconnect(&paho.Disconnect{})
	}
	if err != nil {
		cc.closing.Store(true)
		_ = conn.Close()
		return nil, fmt.Errorf("connect %s: %w", cfg.ClientID, err)
	}
	return cc, nil
}

// close disconnects and waits until the client's goroutines have ended.
func (cc *conn5) close() {
	cc.closing.Store(true)
	_ = cc.c.Disconnect(&paho.Disconnect{ReasonCode: 0})
	<-cc.c.Done()
}

// pub5 is a publishing connection. Publish in paho.golang blocks until
// the acknowledgement, so Inflight goroutines publish side by side (one
// at QoS 0, where Publish returns once written).
type pub5 struct {
	c      *conn5
	topic  string
	qos    byte
	done   func(*outMsg, error)
	jobs   chan *outMsg
	ctx    context.Context // ends when close is called
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func dialPub5(ctx context.Context, o *Options, addr brokerAddr, id, topic string, done func(*outMsg, error), errs *errorSet) (publisher, error) {
	c, err := connect5(ctx, o, addr, paho.ClientConfig{ClientID: id}, errs)
	if err != nil {
		return nil, err
	}
	p := &pub5{c: c, topic: topic, qos: o.QoS, done: done, jobs: make(chan *outMsg, o.Inflight)}
	// ctx only bounds dialling; close cancels the publishes in flight.
	p.ctx, p.cancel = context.WithCancel(context.WithoutCancel(ctx))
	workers := o.Inflight
	if o.QoS == 0 {
		workers = 1
	}
	for range workers {
		p.wg.Go(p.work)
	}
	return p, nil
}

func (p *pub5) work() {
	for m := range p.jobs {
		_, err := p.c.c.Publish(p.ctx, &paho.Publish{Topic: p.topic, QoS: p.qos, Payload: m.buf})
		p.done(m, err)
	}
}

func (p *pub5) publish(m *outMsg) {
	p.jobs <- m // never blocks: at most Inflight outstanding
}

func (p *pub5) close() {
	p.cancel() // fail what is still waiting for an acknowledgement
	close(p.jobs)
	p.wg.Wait()
	p.c.close()
}

// sub5 is a subscribing connection.
type sub5 struct{ c *conn5 }

func dialSub5(ctx context.Context, o *Options, addr brokerAddr, id, filter string, tr *tracker, errs *errorSet) (subscriber, error) {
	onPublish := func(pr paho.PublishReceived) (bool, error) {
		tr.observe(pr.Packet.Payload, time.Now().UnixNano())
		return true, nil
	}
	c, err := connect5(ctx, o, addr, paho.ClientConfig{ClientID: id, OnPublishReceived: []func(paho.PublishReceived) (bool, error){onPublish}}, errs)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, o.ConnectTimeout)
	defer cancel()
	sa, err := c.c.Subscribe(sctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: o.QoS}}})
	if err == nil && (len(sa.Reasons) != 1 || sa.Reasons[0] >= 0x80) {
		err = fmt.Errorf("refused (reason codes %v)", sa.Reasons)
	}
	if err != nil {
		c.close()
		return nil, fmt.Errorf("subscribe %s to %q: %w", id, filter, err)
	}
	return &sub5{c: c}, nil
}

func (s *sub5) close() { s.c.close() }
