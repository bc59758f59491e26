package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// jetStreamTarget drives NATS JetStream with the same load, for comparison:
// a stream named --topic (file storage, one replica, subjects <topic>.*);
// producers publish asynchronously with the same in-flight bound; consumers
// share one durable pull consumer with explicit acks and ack every message.
// Durability is the server's (sync_interval in its config).
type jetStreamTarget struct {
	o            *benchOptions
	durable      string
	subjects     []string
	subjectIndex map[string]int
	body         []byte
}

func newJetStreamTarget(o *benchOptions) *jetStreamTarget {
	t := &jetStreamTarget{o: o, durable: fmt.Sprintf("bench-%d", time.Now().UnixNano()), body: make([]byte, o.size)}
	r := rand.New(rand.NewPCG(1, 2))
	for i := range t.body {
		t.body[i] = byte(r.UintN(256))
	}
	if o.keys == 0 {
		t.subjects = []string{o.topic + ".x"}
	} else {
		for i := range o.keys {
			t.subjects = append(t.subjects, fmt.Sprintf("%s.key-%d", o.topic, i))
		}
	}
	t.subjectIndex = make(map[string]int, len(t.subjects))
	for i, s := range t.subjects {
		t.subjectIndex[s] = i
	}
	return t
}

func (t *jetStreamTarget) connect(name string, opts ...jetstream.JetStreamOpt) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect("nats://"+t.o.server, nats.Name(name))
	if err != nil {
		return nil, nil, fmt.Errorf("connect %s: %w", t.o.server, err)
	}
	js, err := jetstream.New(nc, opts...)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// recreateStream starts every produce run on an empty stream.
func (t *jetStreamTarget) recreateStream(ctx context.Context) error {
	nc, js, err := t.connect("bench-admin")
	if err != nil {
		return err
	}
	defer nc.Close()
	if err := js.DeleteStream(ctx, t.o.topic); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("delete stream %s: %w", t.o.topic, err)
	}
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: t.o.topic, Subjects: []string{t.o.topic + ".*"},
		Storage: jetstream.FileStorage, Replicas: 1})
	if err != nil {
		return fmt.Errorf("create stream %s: %w", t.o.topic, err)
	}
	return nil
}

func (t *jetStreamTarget) prepareProduce(ctx context.Context) error { return t.recreateStream(ctx) }
func (t *jetStreamTarget) prepareFill(ctx context.Context) error    { return t.recreateStream(ctx) }

// durables are the run's durable consumers: one shared by every
// receiver, or with --ordered one per receiver, each filtered to its share
// of the subjects (subject k goes to receiver k mod consumers), so that a
// subject's messages are handled one after another by one receiver — the
// JetStream way of ordered consumption with parallelism.
func (t *jetStreamTarget) durables() []jetstream.ConsumerConfig {
	base := jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy}
	if !t.o.ordered {
		base.Durable = t.durable
		return []jetstream.ConsumerConfig{base}
	}
	n := min(t.o.consumers, len(t.subjects))
	cs := make([]jetstream.ConsumerConfig, n)
	for i := range cs {
		cs[i] = base
		cs[i].Durable = fmt.Sprintf("%s-%d", t.durable, i)
		for k := i; k < len(t.subjects); k += n {
			cs[i].FilterSubjects = append(cs[i].FilterSubjects, t.subjects[k])
		}
	}
	return cs
}

// prepareConsume creates the run's durable consumers, from the start of
// the stream.
func (t *jetStreamTarget) prepareConsume(ctx context.Context) error {
	nc, js, err := t.connect("bench-admin")
	if err != nil {
		return err
	}
	defer nc.Close()
	for _, c := range t.durables() {
		if _, err := js.CreateConsumer(ctx, t.o.topic, c); err != nil {
			return fmt.Errorf("create consumer %s: %w", c.Durable, err)
		}
	}
	return nil
}

func (t *jetStreamTarget) finishConsume(ctx context.Context) error {
	nc, js, err := t.connect("bench-admin")
	if err != nil {
		return err
	}
	defer nc.Close()
	var errs []error
	for _, c := range t.durables() {
		errs = append(errs, js.DeleteConsumer(ctx, t.o.topic, c.Durable))
	}
	return errors.Join(errs...)
}

// jsSender publishes asynchronously; the acknowledgement handlers find a
// message's done function by its *nats.Msg, which the library hands back.
type jsSender struct {
	nc       *nats.Conn
	js       jetstream.JetStream
	subjects []string
	body     []byte

	mu      sync.Mutex
	pending map[*nats.Msg]func(error)
}

func (t *jetStreamTarget) newSender(_ context.Context, i int) (benchSender, error) {
	s := &jsSender{subjects: t.subjects, body: t.body, pending: make(map[*nats.Msg]func(error), t.o.pipeline)}
	var err error
	s.nc, s.js, err = t.connect(fmt.Sprintf("bench-p%d", i),
		jetstream.WithPublishAsyncMaxPending(t.o.pipeline),
		jetstream.WithPublishAsyncTimeout(30*time.Second),
		jetstream.WithPublishAsyncAckHandler(func(_ jetstream.JetStream, m *nats.Msg, _ *jetstream.PubAck) { s.finish(m, nil) }),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) { s.finish(m, err) }))
	if err != nil {
		return nil, err
	}
	return s, nil
}

func (s *jsSender) send(_ context.Context, seq int64, done func(error)) {
	m := &nats.Msg{Subject: s.subjects[seq%int64(len(s.subjects))], Data: s.body}
	s.mu.Lock()
	s.pending[m] = done
	s.mu.Unlock()
	if _, err := s.js.PublishMsgAsync(m); err != nil {
		s.finish(m, err)
	}
}

// finish calls m's done function once (an error may be reported both by
// PublishMsgAsync and the handler).
func (s *jsSender) finish(m *nats.Msg, err error) {
	s.mu.Lock()
	done := s.pending[m]
	delete(s.pending, m)
	s.mu.Unlock()
	if done != nil {
		done(err)
	}
}

func (s *jsSender) close() error {
	s.nc.Close()
	return nil
}

type jsReceiver struct {
	nc *nats.Conn
	cc jetstream.ConsumeContext
}

func (t *jetStreamTarget) newReceiver(ctx context.Context, i int, onMsg func(part int, pos uint64)) (benchReceiver, error) {
	nc, js, err := t.connect(fmt.Sprintf("bench-c%d", i))
	if err != nil {
		return nil, err
	}
	ds := t.durables()
	durable := ds[i%len(ds)].Durable
	cons, err := js.Consumer(ctx, t.o.topic, durable)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("consumer %s: %w", durable, err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		var seq uint64
		if md, err := m.Metadata(); err == nil {
			seq = md.Sequence.Stream
		}
		if m.Ack() == nil {
			onMsg(t.subjectIndex[m.Subject()], seq)
		}
	})
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &jsReceiver{nc: nc, cc: cc}, nil
}

func (r *jsReceiver) close(context.Context) error {
	r.cc.Stop()
	err := r.nc.Flush() // the last acks
	r.nc.Close()
	return err
}
