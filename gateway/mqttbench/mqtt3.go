package mqttbench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// MQTT 3.1.1 clients, with eclipse/paho.mqtt.golang.

// errClosed completes a message still in flight when its connection closes.
var errClosed = errors.New("connection closed before the acknowledgement")

// clientKeepAlive is the keepalive of pubsub clients.
const clientKeepAlive = 60 * time.Second

// disconnectQuiesce is how long (ms) a paho v3 client waits for work in
// progress when disconnecting.
const disconnectQuiesce = 100

func options3(o *Options, addr brokerAddr, id string, errs *errorSet) *mqtt.ClientOptions {
	return mqtt.NewClientOptions().
		AddBroker(addr.url).
		SetClientID(id).
		SetProtocolVersion(4). // 3.1.1
		SetCleanSession(!o.PersistentSession).
		SetAutoReconnect(false). // a lost connection shows in the counts
		SetConnectRetry(false).
		SetConnectTimeout(o.ConnectTimeout).
		SetWriteTimeout(o.ConnectTimeout).
		SetKeepAlive(clientKeepAlive).
		SetOrderMatters(true). // handlers run on the client's goroutine
		SetConnectionLostHandler(func(_ mqtt.Client, err error) {
			errs.add(fmt.Errorf("connection lost: %w", err))
		})
}

// connect3 connects c; a connect attempt is bounded by ConnectTimeout,
// so it is waited for even when ctx ends (to leave no goroutine behind).
func connect3(ctx context.Context, c mqtt.Client, id string) error {
	tok := c.Connect()
	tok.Wait()
	if err := tok.Error(); err != nil {
		return fmt.Errorf("connect %s: %w", id, err)
	}
	if err := ctx.Err(); err != nil {
		c.Disconnect(0)
		return err
	}
	return nil
}

// waitToken waits for tok or for timeout to pass.
func waitToken(tok mqtt.Token, timeout time.Duration) error {
	if !tok.WaitTimeout(timeout) {
		return fmt.Errorf("no answer within %v", timeout)
	}
	return tok.Error()
}

// pub3 is a publishing connection. Publish in paho v3 returns a token at
// once; one goroutine waits for the tokens in the order of sending and
// completes each message. Brokers acknowledge in the order of receipt (as
// clients must, [MQTT-4.6.0-2]); one that overtook an earlier one would be
// seen when the earlier one is, which can only lengthen its latency.
type pub3 struct {
	c       mqtt.Client
	topic   string
	qos     byte
	done    func(*outMsg, error)
	pending chan pending3 // to the acker; as many as messages in flight
	stop    chan struct{} // closed by close: fail what is still pending
	wg      sync.WaitGroup
}

type pending3 struct {
	tok mqtt.Token
	m   *outMsg
}

func dialPub3(ctx context.Context, o *Options, addr brokerAddr, id, topic string, done func(*outMsg, error), errs *errorSet) (publisher, error) {
	c := mqtt.NewClient(options3(o, addr, id, errs))
	if err := connect3(ctx, c, id); err != nil {
		return nil, err
	}
	p := &pub3{c: c, topic: topic, qos: o.QoS, done: done, pending: make(chan pending3, o.Inflight), stop: make(chan struct{})}
	p.wg.Go(p.ack)
	return p, nil
}

func (p *pub3) publish(m *outMsg) {
	// Never blocks: the caller has at most Inflight messages outstanding.
	p.pending <- pending3{tok: p.c.Publish(p.topic, p.qos, false, m.buf), m: m}
}

func (p *pub3) ack() {
	for pt := range p.pending {
		select {
		case <-pt.tok.Done():
			p.done(pt.m, pt.tok.Error())
		case <-p.stop:
			p.done(pt.m, errClosed)
		}
	}
}

func (p *pub3) close() {
	close(p.stop)
	close(p.pending)
	p.wg.Wait()
	p.c.Disconnect(disconnectQuiesce)
}

// sub3 is a subscribing connection.
type sub3 struct{ c mqtt.Client }

func dialSub3(ctx context.Context, o *Options, addr brokerAddr, id, filter string, tr *tracker, errs *errorSet) (subscriber, error) {
	c := mqtt.NewClient(options3(o, addr, id, errs))
	if err := connect3(ctx, c, id); err != nil {
		return nil, err
	}
	tok := c.Subscribe(filter, o.QoS, func(_ mqtt.Client, m mqtt.Message) {
		tr.observe(m.Payload(), time.Now().UnixNano())
	})
	err := waitToken(tok, o.ConnectTimeout)
	if err == nil {
		// A broker answers 0x80 for a refused subscription [MQTT-3.9.3-2].
		if code, ok := tok.(*mqtt.SubscribeToken).Result()[filter]; !ok || code > 2 {
			err = fmt.Errorf("refused (return code %#x)", code)
		}
	}
	if err != nil {
		c.Disconnect(0)
		return nil, fmt.Errorf("subscribe %s to %q: %w", id, filter, err)
	}
	return &sub3{c: c}, nil
}

func (s *sub3) close() { s.c.Disconnect(disconnectQuiesce) }
