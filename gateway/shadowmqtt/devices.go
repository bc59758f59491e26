package shadowmqtt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core/shadow"
	"github.com/ferrymq/ferrymq/gateway/engine"
)

// Prefix is the topic space of shadow requests and answers.
const Prefix = "$shadow/"

// Topics below Prefix: what devices publish, what they are sent.
const (
	opUpdate       = "update"
	opGet          = "get"
	suffixAccepted = "/accepted"
	suffixRejected = "/rejected"
	suffixDelta    = "/update/delta"
)

// Defaults of Options.
const (
	DefaultWorkers = 4
	DefaultBacklog = 10_000
	// requestTimeout bounds the service's work for one request.
	requestTimeout = 10 * time.Second
)

// Log field names, and the labels of ferrymq_shadow_mqtt_sends_total.
const (
	logComponent    = "component"
	logClient       = "client"
	logTopic        = "topic"
	labelKind       = "kind"
	labelOutcome    = "outcome"
	kindAnswer      = "answer"
	kindDelta       = "delta"
	kindConnectRead = "connect"
	outcomeSent     = "sent"
	outcomeDenied   = "denied"
	outcomeNotHere  = "not_here"
	outcomeDropped  = "dropped"
)

// Options configure Devices.
type Options struct {
	// Shadows serves the documents. Required.
	Shadows *shadow.Service
	// ACL, when set, must let a device read an answer's or a delta's topic
	// (CanRead) for it to be sent. Nil: every device reads its own.
	ACL engine.Authorizer
	// Workers read the shadows of devices that just connected (to send
	// their delta); default DefaultWorkers.
	Workers int
	// Backlog bounds the connects waiting for a worker; past it a device
	// gets no delta at that connect (counted). Default DefaultBacklog.
	Backlog int
	Logger  *zerolog.Logger
}

// Devices answers devices' shadow requests and sends deltas. It is a
// bridge.Interceptor and an engine.Presence (the bridge hands it the
// connections), and takes the engine through Attach.
type Devices struct {
	opts Options
	log  zerolog.Logger
	e    atomic.Pointer[engine.Engine]

	mu    sync.Mutex // guards conns
	conns map[string]*deviceConn

	connects chan string
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	started  atomic.Bool
	closed   atomic.Bool

	sends *prometheus.CounterVec
}

// New returns Devices over o.Shadows; Start it.
func New(o Options) (*Devices, error) {
	if o.Shadows == nil {
		return nil, errors.New("shadowmqtt: a shadow service is required")
	}
	if o.Workers == 0 {
		o.Workers = DefaultWorkers
	}
	if o.Backlog == 0 {
		o.Backlog = DefaultBacklog
	}
	if o.Workers < 1 || o.Backlog < 1 {
		return nil, fmt.Errorf("shadowmqtt: workers %d and backlog %d: want positive", o.Workers, o.Backlog)
	}
	if o.Logger == nil {
		l := zerolog.Nop()
		o.Logger = &l
	}
	d := &Devices{opts: o, log: o.Logger.With().Str(logComponent, "shadow-mqtt").Logger(), conns: map[string]*deviceConn{},
		connects: make(chan string, o.Backlog),
		sends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferrymq_shadow_mqtt_sends_total",
			Help: "Shadow answers and deltas for devices, by kind (answer, delta, connect: a delta at connect) and outcome (sent, denied by the ACL, not_here: not connected to this node, dropped: the connect backlog was full or the engine refused).",
		}, []string{labelKind, labelOutcome})}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	return d, nil
}

// Attach implements the gateway's attach: the engine answers go out on.
func (d *Devices) Attach(e *engine.Engine) { d.e.Store(e) }

// Start starts the connect workers and watches the service's changes.
func (d *Devices) Start() {
	if d.started.Swap(true) {
		return
	}
	for range d.opts.Workers {
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			d.work()
		}()
	}
	d.opts.Shadows.Watch(d.changed)
}

// Close stops the workers; Devices answers nothing after it.
func (d *Devices) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	d.cancel()
	d.wg.Wait()
	return nil
}

// Describe implements prometheus.Collector.
func (d *Devices) Describe(ch chan<- *prometheus.Desc) { d.sends.Describe(ch) }

// Collect implements prometheus.Collector.
func (d *Devices) Collect(ch chan<- prometheus.Metric) { d.sends.Collect(ch) }

// Prefix implements bridge.Interceptor.
func (d *Devices) Prefix() string { return Prefix }

// parseTopic splits "$shadow/<id>/<op>".
func parseTopic(topic string) (id, op string, ok bool) {
	rest, ok := strings.CutPrefix(topic, Prefix)
	if !ok {
		return "", "", false
	}
	i := strings.LastIndexByte(rest, '/')
	if i <= 0 {
		return "", "", false
	}
	id, op = rest[:i], rest[i+1:]
	return id, op, op == opUpdate || op == opGet
}

// Intercept implements bridge.Interceptor: a device's request.
func (d *Devices) Intercept(c *engine.Client, m *engine.Message) engine.Result {
	id, op, ok := parseTopic(m.Topic)
	switch {
	case !ok:
		return engine.Result{Code: engine.TopicNameInvalid, Reason: "a device publishes $shadow/<its client ID>/update or /get"}
	case id != c.ID():
		return engine.Result{Code: engine.NotAuthorized, Reason: "a device may use only its own shadow"}
	case d.closed.Load():
		return engine.Result{Code: engine.ServerUnavailable, Reason: "shutting down"}
	}
	ctx, cancel := context.WithTimeout(d.ctx, requestTimeout)
	defer cancel()
	qos := min(m.QoS, 1)
	base := Prefix + id + "/" + op
	svc := d.opts.Shadows
	if op == opGet {
		token := tokenOf(m.Payload)
		doc, err := svc.Get(ctx, id)
		if err != nil {
			d.answer(c, base+suffixRejected, qos, rejection(err, token))
			return engine.Result{}
		}
		d.answer(c, base+suffixAccepted, qos, accepted{Document: doc, ClientToken: token})
		return engine.Result{}
	}
	u, err := shadow.DecodeRequest(m.Payload, shadow.Reported, svc.Limits())
	if err != nil {
		svc.Refused(id, shadow.Reported, err)
		d.answer(c, base+suffixRejected, qos, rejection(err, tokenOf(m.Payload)))
		return engine.Result{}
	}
	doc, err := svc.Update(ctx, id, u)
	if err != nil {
		d.answer(c, base+suffixRejected, qos, rejection(err, u.ClientToken))
		return engine.Result{}
	}
	d.answer(c, base+suffixAccepted, qos, accepted{Document: doc, ClientToken: u.ClientToken})
	return engine.Result{}
}

// accepted is an accepted answer: the document, and the request's token.
type accepted struct {
	*shadow.Document
	ClientToken string `json:"client_token,omitempty"`
}

// Rejected is a rejected answer's payload.
type Rejected struct {
	// Code is HTTP-like: 400 bad request, 404 no shadow, 409 version
	// conflict, 413 too large, 500 internal, 503 try again.
	Code        int    `json:"code"`
	Message     string `json:"message"`
	ClientToken string `json:"client_token,omitempty"`
}

// Delta is the payload of $shadow/<id>/update/delta.
type Delta struct {
	State     map[string]any `json:"state"`
	Version   int64          `json:"version"`
	Timestamp int64          `json:"timestamp"`
}

// CodeOf is the Rejected code of a service error.
func CodeOf(err error) int {
	switch {
	case errors.Is(err, shadow.ErrBadRequest):
		return 400
	case errors.Is(err, shadow.ErrNotFound):
		return 404
	case errors.Is(err, shadow.ErrVersionConflict):
		return 409
	case errors.Is(err, shadow.ErrTooLarge):
		return 413
	case errors.Is(err, shadow.ErrBusy), errors.Is(err, shadow.ErrClosed), errors.Is(err, context.DeadlineExceeded):
		return 503
	default:
		return 500
	}
}

func rejection(err error, token string) Rejected {
	return Rejected{Code: CodeOf(err), Message: err.Error(), ClientToken: token}
}

// tokenOf digs the client_token out of a request that did not decode,
// when it can.
func tokenOf(b []byte) string {
	var r struct {
		ClientToken string `json:"client_token"`
	}
	if json.Unmarshal(b, &r) != nil || len(r.ClientToken) > shadow.MaxClientToken {
		return ""
	}
	return r.ClientToken
}

// answer sends v to c's device on topic.
func (d *Devices) answer(c *engine.Client, topic string, qos byte, v any) {
	d.send(kindAnswer, c, topic, qos, v)
}

// send sends v as JSON to c's client on topic, if the ACL lets it read it.
func (d *Devices) send(kind string, c *engine.Client, topic string, qos byte, v any) {
	e := d.e.Load()
	if e == nil {
		d.sends.WithLabelValues(kind, outcomeDropped).Inc()
		return
	}
	if acl := d.opts.ACL; acl != nil && !acl.CanRead(c, c.ID(), c.Username(), topic) {
		d.sends.WithLabelValues(kind, outcomeDenied).Inc()
		d.log.Debug().Str(logClient, c.ID()).Str(logTopic, topic).Msg("shadow message not sent: the ACL does not let the device read it")
		return
	}
	body, err := json.Marshal(v)
	if err != nil {
		d.sends.WithLabelValues(kind, outcomeDropped).Inc()
		return
	}
	if err := e.Send(c.ID(), &engine.Message{Topic: topic, Payload: body, QoS: qos}); err != nil {
		d.sends.WithLabelValues(kind, outcomeDropped).Inc()
		d.log.Debug().Err(err).Str(logClient, c.ID()).Str(logTopic, topic).Msg("shadow message not sent")
		return
	}
	d.sends.WithLabelValues(kind, outcomeSent).Inc()
}

// deviceConn is a device connected here.
type deviceConn struct {
	c *engine.Client
	// sentDelta is the version of the last delta sent on this connection
	// (guarded by Devices.mu): a change may be heard twice (the JetStream
	// bucket's record, then its mark), and a delta is sent once.
	sentDelta int64
}

// Connected implements engine.Presence: the device's delta, if any, is
// read and sent by a worker (after the CONNACK: the engine holds what is
// sent to a connection until then).
func (d *Devices) Connected(c *engine.Client, _ bool, _ *engine.Client) {
	d.mu.Lock()
	d.conns[c.ID()] = &deviceConn{c: c}
	d.mu.Unlock()
	if !d.started.Load() || d.closed.Load() {
		return
	}
	select {
	case d.connects <- c.ID():
	default:
		d.sends.WithLabelValues(kindConnectRead, outcomeDropped).Inc()
	}
}

// Disconnected implements engine.Presence.
func (d *Devices) Disconnected(c *engine.Client, _ string, _ error, _ bool) {
	d.mu.Lock()
	if dc := d.conns[c.ID()]; dc != nil && dc.c == c {
		delete(d.conns, c.ID())
	}
	d.mu.Unlock()
}

// deltaConn is the device's connection here if it has not been sent the
// delta of version or a later one (and it then counts as sent); nil
// otherwise.
func (d *Devices) deltaConn(id string, version int64) *engine.Client {
	d.mu.Lock()
	defer d.mu.Unlock()
	dc := d.conns[id]
	if dc == nil || dc.sentDelta >= version {
		return nil
	}
	dc.sentDelta = version
	return dc.c
}

// work sends the delta of devices that connected.
func (d *Devices) work() {
	for {
		select {
		case <-d.ctx.Done():
			return
		case id := <-d.connects:
			d.deltaAtConnect(id)
		}
	}
}

func (d *Devices) deltaAtConnect(id string) {
	ctx, cancel := context.WithTimeout(d.ctx, requestTimeout)
	defer cancel()
	doc, err := d.opts.Shadows.Get(ctx, id)
	if err != nil {
		if !errors.Is(err, shadow.ErrNotFound) && !errors.Is(err, shadow.ErrBadRequest) {
			d.log.Warn().Err(err).Str(logClient, id).Msg("shadow not read at connect: no delta sent")
		}
		return
	}
	if doc.State.Delta == nil {
		return
	}
	c := d.deltaConn(id, doc.Version)
	if c == nil {
		d.sends.WithLabelValues(kindConnectRead, outcomeNotHere).Inc()
		return
	}
	d.send(kindConnectRead, c, Prefix+id+suffixDelta, 1, deltaOf(doc))
}

func deltaOf(doc *shadow.Document) Delta {
	return Delta{State: doc.State.Delta, Version: doc.Version, Timestamp: doc.Timestamp}
}

// changed hears every accepted change (with the JetStream engine, every
// node's): a change of desired that leaves a delta goes to the device if
// it is connected here.
func (d *Devices) changed(ev *shadow.Event) {
	if d.closed.Load() || ev.Op != shadow.OpUpdate || ev.Section != shadow.Desired || ev.Shadow == nil || ev.Shadow.State.Delta == nil {
		return
	}
	c := d.deltaConn(ev.ClientID, ev.Version)
	if c == nil {
		return
	}
	d.send(kindDelta, c, Prefix+ev.ClientID+suffixDelta, 1, deltaOf(ev.Shadow))
}
