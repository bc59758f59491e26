// Package devicesim is a simulated device for trying ferrymq by hand and
// for scripts: one MQTT 5 client (paho.golang) that answers the
// synchronous calls made to it (docs/commands.md) and logs every message
// it receives. `ferrymq device` runs it.
package devicesim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// Options configure a Device.
type Options struct {
	// Addr is the gateway's MQTT TCP address.
	Addr string
	// ClientID is the device's client ID; Username and Password its
	// credentials, if the gateway asks for them.
	ClientID string
	Username string
	Password string
	// Answer is the answer to every call: "{payload}" in it is replaced by
	// the request's payload. Default "done: {payload}".
	Answer string
	// Subscribe lists filters to subscribe to besides the calls.
	Subscribe []string
	// AnswerAll answers every publish that carries a Response Topic (MQTT
	// 5 request/response through any broker), not only ferrymq's calls.
	AnswerAll bool
	// KeepAlive is the MQTT keep alive in seconds; default 30.
	KeepAlive uint16
	// Log receives one line per message received and per call answered.
	Log io.Writer
}

// Device is a connected simulated device.
type Device struct {
	o         Options
	c         *paho.Client
	mu        sync.Mutex // orders answering.Add against Close
	closing   bool
	answering sync.WaitGroup
}

// ErrRefused is returned by Connect when the gateway refuses the CONNECT.
var ErrRefused = errors.New("devicesim: connection refused")

// Connect connects the device.
func Connect(ctx context.Context, o Options) (*Device, error) {
	if o.Answer == "" {
		o.Answer = "done: {payload}"
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.KeepAlive == 0 {
		o.KeepAlive = 30
	}
	conn, err := (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, "tcp", o.Addr)
	if err != nil {
		return nil, fmt.Errorf("devicesim: %w", err)
	}
	d := &Device{o: o}
	d.c = paho.NewClient(paho.ClientConfig{Conn: conn, OnPublishReceived: []func(paho.PublishReceived) (bool, error){d.received}})
	cp := &paho.Connect{ClientID: o.ClientID, KeepAlive: o.KeepAlive, CleanStart: true}
	if o.Username != "" {
		cp.Username, cp.UsernameFlag = o.Username, true
	}
	if o.Password != "" {
		cp.Password, cp.PasswordFlag = []byte(o.Password), true
	}
	ca, err := d.c.Connect(ctx, cp)
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("devicesim: connect %s: %w", o.ClientID, err)
	}
	if ca.ReasonCode != 0 {
		_ = conn.Close()
		return nil, fmt.Errorf("%w: reason code %#x", ErrRefused, ca.ReasonCode)
	}
	for _, f := range o.Subscribe {
		if _, err := d.c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: f, QoS: 1}}}); err != nil {
			_ = d.Close()
			return nil, fmt.Errorf("devicesim: subscribe %q: %w", f, err)
		}
	}
	return d, nil
}

// received logs a message and answers it when it is a call.
func (d *Device) received(r paho.PublishReceived) (bool, error) {
	p := r.Packet
	if d.o.Log != io.Discard {
		fmt.Fprintf(d.o.Log, "%s %s\n", p.Topic, p.Payload)
	}
	if p.Properties == nil || p.Properties.ResponseTopic == "" || (!d.o.AnswerAll && !strings.HasPrefix(p.Topic, "$rpc/")) {
		return true, nil
	}
	d.mu.Lock()
	if d.closing {
		d.mu.Unlock()
		return true, nil
	}
	d.answering.Add(1)
	d.mu.Unlock()
	answer := strings.ReplaceAll(d.o.Answer, "{payload}", string(p.Payload))
	go func() { // not on paho's reading goroutine: the publish waits for its PUBACK
		defer d.answering.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := d.c.Publish(ctx, &paho.Publish{Topic: p.Properties.ResponseTopic, QoS: 1, Payload: []byte(answer),
			Properties: &paho.PublishProperties{CorrelationData: p.Properties.CorrelationData}})
		if err != nil {
			fmt.Fprintf(d.o.Log, "answer to %s failed: %v\n", p.Topic, err)
			return
		}
		if d.o.Log != io.Discard {
			fmt.Fprintf(d.o.Log, "answered %s: %s\n", p.Properties.ResponseTopic, answer)
		}
	}()
	return true, nil
}

// Done is closed when the connection ends.
func (d *Device) Done() <-chan struct{} { return d.c.Done() }

// Close disconnects the device once its answers are out.
func (d *Device) Close() error {
	d.mu.Lock()
	d.closing = true
	d.mu.Unlock()
	d.answering.Wait()
	err := d.c.Disconnect(&paho.Disconnect{})
	<-d.c.Done()
	return err
}
