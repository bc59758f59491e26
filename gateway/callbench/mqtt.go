package callbench

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// requestTopic is where device id gets its requests under TargetMQTT.
func requestTopic(id string) string { return "rpcbench/req/" + id }

// backend is one MQTT 5 client making calls under TargetMQTT.
type backend struct {
	c       *paho.Client
	name    string
	seq     atomic.Uint64
	mu      sync.Mutex
	waiting map[string]chan struct{} // by correlation data
}

// connectBackends connects o.Conns backends, each subscribed to its
// response topics.
func connectBackends(ctx context.Context, o Options) ([]*backend, error) {
	out := make([]*backend, 0, o.Conns)
	for i := range o.Conns {
		b := &backend{name: o.Prefix + "backend-" + strconv.Itoa(i), waiting: map[string]chan struct{}{}}
		conn, err := (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, "tcp", o.MQTT)
		if err != nil {
			return out, fmt.Errorf("callbench: backend: %w", err)
		}
		b.c = paho.NewClient(paho.ClientConfig{Conn: conn, OnPublishReceived: []func(paho.PublishReceived) (bool, error){
			func(r paho.PublishReceived) (bool, error) {
				if r.Packet.Properties != nil {
					b.mu.Lock()
					ch := b.waiting[string(r.Packet.Properties.CorrelationData)]
					delete(b.waiting, string(r.Packet.Properties.CorrelationData))
					b.mu.Unlock()
					if ch != nil {
						close(ch)
					}
				}
				return true, nil
			}}})
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		ca, err := b.c.Connect(cctx, &paho.Connect{ClientID: b.name, KeepAlive: 60, CleanStart: true})
		if err == nil && ca.ReasonCode != 0 {
			err = fmt.Errorf("CONNACK %#x", ca.ReasonCode)
		}
		if err == nil {
			_, err = b.c.Subscribe(cctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "rpcbench/resp/" + b.name + "/#", QoS: 1}}})
		}
		cancel()
		if err != nil {
			_ = conn.Close()
			return out, fmt.Errorf("callbench: backend %s: %w", b.name, err)
		}
		out = append(out, b)
	}
	return out, nil
}

// call publishes a request to dev and waits for the answer carrying its
// correlation data.
func (b *backend) call(ctx context.Context, dev string, payload []byte) error {
	n := strconv.FormatUint(b.seq.Add(1), 10)
	ch := make(chan struct{})
	b.mu.Lock()
	b.waiting[n] = ch
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		delete(b.waiting, n)
		b.mu.Unlock()
	}()
	if _, err := b.c.Publish(ctx, &paho.Publish{Topic: requestTopic(dev), QoS: 1, Payload: payload,
		Properties: &paho.PublishProperties{ResponseTopic: "rpcbench/resp/" + b.name + "/" + n, CorrelationData: []byte(n)}}); err != nil {
		return fmt.Errorf("callbench: request to %s: %w", dev, err)
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// closeBackends disconnects the backends.
func closeBackends(bs []*backend) {
	for _, b := range bs {
		_ = b.c.Disconnect(&paho.Disconnect{})
		<-b.c.Done()
	}
}
