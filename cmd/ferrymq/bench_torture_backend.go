package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/consumer"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/gateway/mqttbench"
)

// The backends of the torture run, each on its own connection to the core
// (as separate services would be): consumers of the device topic in every
// mode, a slow one, a command producer and the receipts reader.

const (
	tortureTopic    = "telemetry"
	commandsTopic   = "commands"
	receiptsTopic   = "device-receipts"
	tortureQueues   = 8
	backendMaxRetry = 500 * time.Millisecond
)

// consumerLog collects one consumer's deliveries.
type consumerLog struct {
	name      string
	orderly   bool
	mustCover bool

	mu         sync.Mutex
	deliveries []deliveryObs
	got        map[int]mqttbench.Seen // queue → offsets delivered
	other      int                    // deliveries from other topics (the group's retry topic)
}

func newConsumerLog(name string, orderly, mustCover bool) *consumerLog {
	return &consumerLog{name: name, orderly: orderly, mustCover: mustCover, got: map[int]mqttbench.Seen{}}
}

func (l *consumerLog) add(m *core.StoredMessage) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if m.Topic != tortureTopic {
		l.other++
		return
	}
	l.deliveries = append(l.deliveries, deliveryObs{Queue: m.Queue, Offset: m.QueueOffset, ID: m.ID.String()})
	got := l.got[m.Queue]
	got.Add(uint64(m.QueueOffset))
	l.got[m.Queue] = got
}

// missing counts offsets of ranges this consumer has not had.
func (l *consumerLog) missing(ranges []core.QueueRange) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var n int64
	for q, r := range ranges {
		got := l.got[q]
		for off := r.Min; off < r.Max; off++ {
			if !got.Has(uint64(off)) {
				n++
			}
		}
	}
	return n
}

func (l *consumerLog) obs() consumerObs {
	l.mu.Lock()
	defer l.mu.Unlock()
	return consumerObs{Name: l.name, Orderly: l.orderly, MustCover: l.mustCover, Deliveries: append([]deliveryObs(nil), l.deliveries...)}
}

func (l *consumerLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.deliveries)
}

type tortureBackends struct {
	addr     string
	log      zerolog.Logger
	devices  []*tortureDevice
	cmdEvery time.Duration
	slowWait time.Duration
	rng      *rand.Rand // the command loop's

	orderly, pop, slow *consumerLog
	bcast              []*consumerLog

	mu       sync.Mutex
	commands []commandObs
	receipts []receiptObs
	badRcpt  int

	clients   []*client.Client
	pushes    []*consumer.PushConsumer
	wg        sync.WaitGroup
	closeOnce sync.Once
}

func (b *tortureBackends) dial(ctx context.Context, name string) (*client.Client, error) {
	c, err := client.Dial(ctx, client.Options{Addr: b.addr, ClientID: "torture-" + name, MaxBackoff: backendMaxRetry,
		RequestTimeout: 10 * time.Second, Logger: &b.log})
	if err != nil {
		return nil, fmt.Errorf("backend %s: %w", name, err)
	}
	b.clients = append(b.clients, c)
	return c, nil
}

// createTopics creates the topics up front, so that every consumer starts
// at offset 0 of the device topic.
func createTopics(ctx context.Context, c *client.Client) error {
	for _, t := range []string{tortureTopic, commandsTopic, receiptsTopic} {
		if _, err := c.CreateTopic(ctx, t, tortureQueues); err != nil && !errors.Is(err, core.ErrTopicExists) {
			return fmt.Errorf("create topic %s: %w", t, err)
		}
	}
	return nil
}

// start starts every backend; the goroutines end with ctx (loops) or at
// close (push consumers).
func (b *tortureBackends) start(ctx, load context.Context) error {
	b.orderly = newConsumerLog("clustering-orderly", true, true)
	b.pop = newConsumerLog("pop", false, true)
	b.slow = newConsumerLog("slow-clustering", false, false)
	b.bcast = []*consumerLog{newConsumerLog("broadcast-1", false, true), newConsumerLog("broadcast-2", false, true)}

	type push struct {
		name, grp string
		mode      group.Mode
		orderly   bool
		topic     string
		listener  consumer.Listener
	}
	record := func(l *consumerLog) consumer.Listener {
		return func(_ context.Context, m *core.StoredMessage) consumer.Result {
			l.add(m)
			return consumer.Success
		}
	}
	pushes := []push{
		{"orderly-1", "torture-orderly", group.Clustering, true, tortureTopic, record(b.orderly)},
		{"orderly-2", "torture-orderly", group.Clustering, true, tortureTopic, record(b.orderly)},
		{"bcast-1", "torture-bcast", group.Broadcast, false, tortureTopic, record(b.bcast[0])},
		{"bcast-2", "torture-bcast", group.Broadcast, false, tortureTopic, record(b.bcast[1])},
		{"slow-1", "torture-slow", group.Clustering, false, tortureTopic, func(lctx context.Context, m *core.StoredMessage) consumer.Result {
			if ctx.Err() != nil {
				return consumer.Success // closing: skip the backlog (the slow group is not checked)
			}
			pause(lctx, b.slowWait)
			b.slow.add(m)
			return consumer.Success
		}},
		{"receipts-1", "torture-receipts", group.Clustering, false, receiptsTopic, func(_ context.Context, m *core.StoredMessage) consumer.Result {
			b.addReceipt(m)
			return consumer.Success
		}},
	}
	for _, p := range pushes {
		c, err := b.dial(ctx, p.name)
		if err != nil {
			return err
		}
		opts := consumer.Options{Group: p.grp, ClientID: "torture-" + p.name, Mode: p.mode, From: group.FromEarliest,
			Subscriptions: []group.Subscription{{Topic: p.topic}}, Orderly: p.orderly, Listener: p.listener,
			PullBatch: 64, Logger: &b.log}
		if p.mode == group.Broadcast || p.name == "slow-1" {
			opts.ConsumeGoroutines = 1
		}
		pc, err := c.NewPushConsumer(opts)
		if err != nil {
			return fmt.Errorf("backend %s: %w", p.name, err)
		}
		if err := startPush(ctx, pc); err != nil {
			return fmt.Errorf("backend %s: %w", p.name, err)
		}
		b.pushes = append(b.pushes, pc)
	}

	pc, err := b.dial(ctx, "pop-1")
	if err != nil {
		return err
	}
	sc := pc.NewSimpleConsumer("torture-pop", tortureTopic)
	b.wg.Go(func() { b.popLoop(ctx, sc) })

	prod, err := b.dial(ctx, "commands")
	if err != nil {
		return err
	}
	b.wg.Go(func() { b.commandLoop(load, prod.NewProducer()) })
	return nil
}

// startPush joins the group, trying again while the server restarts.
func startPush(ctx context.Context, pc *consumer.PushConsumer) error {
	for {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := pc.Start(sctx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return err
		}
		pause(ctx, 200*time.Millisecond)
	}
}

func (b *tortureBackends) popLoop(ctx context.Context, sc *client.SimpleConsumer) {
	for ctx.Err() == nil {
		msgs, err := sc.Receive(ctx, 32, time.Second)
		if err != nil {
			pause(ctx, 100*time.Millisecond)
			continue
		}
		for _, m := range msgs {
			b.pop.add(m.StoredMessage)
			_ = sc.Ack(ctx, m.Handle) // a lost ack: delivered again (at least once)
		}
	}
}

// receiptJSON is a receipt as the bridge writes it (docs/sessions.md).
type receiptJSON struct {
	MessageID string `json:"message_id"`
	ClientID  string `json:"clientid"`
	Outcome   string `json:"outcome"`
	Reason    string `json:"reason"`
}

func (b *tortureBackends) addReceipt(m *core.StoredMessage) {
	var r receiptJSON
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := json.Unmarshal(m.Body, &r); err != nil {
		b.badRcpt++
		return
	}
	b.receipts = append(b.receipts, receiptObs{MessageID: r.MessageID, ClientID: r.ClientID, Outcome: r.Outcome, Reason: r.Reason})
}

// commandLoop produces a point-to-point command every cmdEvery to a random
// device that has connected once: a quarter with a short TTL (0.3–2 s), half
// of those to a device that sleeps (offline) if there is one; some at QoS 2.
func (b *tortureBackends) commandLoop(ctx context.Context, p *client.Producer) {
	var n int64
	for ctx.Err() == nil {
		pause(ctx, b.cmdEvery)
		if ctx.Err() != nil {
			return
		}
		var up, asleep []*tortureDevice
		now := time.Now().UnixNano()
		for _, d := range b.devices {
			d.connMu.Lock()
			if d.everUp {
				up = append(up, d)
				if d.sleepUntil.Load() > now {
					asleep = append(asleep, d)
				}
			}
			d.connMu.Unlock()
		}
		if len(up) == 0 {
			continue
		}
		d := up[b.rng.IntN(len(up))]
		var ttl time.Duration
		if b.rng.IntN(4) == 0 {
			ttl = time.Duration(300+b.rng.IntN(1700)) * time.Millisecond
			if len(asleep) > 0 && b.rng.IntN(2) == 0 {
				d = asleep[b.rng.IntN(len(asleep))] // likely to expire
			}
		}
		n++
		cmd := commandObs{N: n, Device: d.id, TTL: ttl}
		props := map[string]string{"mqtt.clientid": d.id, "mqtt.topic": "devices/" + d.id + "/cmd"}
		if ttl > 0 {
			props["mqtt.ttl"] = ttl.String()
		}
		if b.rng.IntN(6) == 0 {
			props["mqtt.qos"] = "2"
		}
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		res, err := p.Send(sctx, &core.Message{Topic: commandsTopic, ShardingKey: d.id, Properties: props, Body: []byte(commandPayload(n, d.id))})
		cancel()
		if err == nil {
			cmd.Acked, cmd.AckedAt, cmd.ID = true, time.Now(), res.ID.String()
		}
		b.mu.Lock()
		b.commands = append(b.commands, cmd)
		b.mu.Unlock()
	}
}

func (b *tortureBackends) snapshot() (cmds []commandObs, rcpts []receiptObs) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]commandObs(nil), b.commands...), append([]receiptObs(nil), b.receipts...)
}

func (b *tortureBackends) badReceipts() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.badRcpt
}

func (b *tortureBackends) mustCover() []*consumerLog {
	return append([]*consumerLog{b.orderly, b.pop}, b.bcast...)
}

func (b *tortureBackends) consumers() []consumerObs {
	var out []consumerObs
	for _, l := range append(b.mustCover(), b.slow) {
		out = append(out, l.obs())
	}
	return out
}

// close stops the consumers (committing what they did), waits for the
// loops (their context must have ended) and closes the connections; safe
// to call twice.
func (b *tortureBackends) close() {
	b.closeOnce.Do(func() {
		var wg sync.WaitGroup
		for _, pc := range b.pushes {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = pc.Close(ctx)
			})
		}
		wg.Wait()
		b.wg.Wait()
		for _, c := range b.clients {
			_ = c.Close()
		}
	})
}

// readStored reads every message of the device topic, queue by queue.
func readStored(ctx context.Context, c *client.Client) ([]storedObs, error) {
	info, err := c.Topic(ctx, tortureTopic)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", tortureTopic, err)
	}
	var out []storedObs
	for q := range len(info.Ranges) { // retired queues of a resized topic too
		off := info.Ranges[q].Min
		for {
			res, err := c.Pull(ctx, tortureTopic, q, off, 512, 0)
			if err != nil {
				return nil, fmt.Errorf("read %s queue %d at %d: %w", tortureTopic, q, off, err)
			}
			for _, m := range res.Messages {
				s := storedObs{Queue: m.Queue, Offset: m.QueueOffset, ID: m.ID.String(), Key: m.ShardingKey}
				if dev, seq, qos, att, ok := parseTorturePayload(m.Body); ok {
					s.Device, s.Seq, s.QoS, s.Attempt = dev, seq, qos, att
				} else {
					s.Raw = fmt.Sprintf("props %v, %d bytes: %q", m.Properties, len(m.Body), m.Body[:min(len(m.Body), 80)])
				}
				out = append(out, s)
			}
			if len(res.Messages) == 0 || res.NextOffset <= off {
				break
			}
			off = res.NextOffset
		}
	}
	sortStored(out)
	return out, nil
}

// topicRanges are the device topic's queue ranges now.
func topicRanges(ctx context.Context, c *client.Client) ([]core.QueueRange, error) {
	info, err := c.Topic(ctx, tortureTopic)
	if err != nil {
		return nil, err
	}
	out := make([]core.QueueRange, len(info.Ranges))
	for i, r := range info.Ranges {
		out[i] = core.QueueRange{Min: r.Min, Max: r.Max}
	}
	return out, nil
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
