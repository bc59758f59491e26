package jetstream_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/jetstream"
	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
)

// resizeWait bounds every wait of the resize tests.
const resizeWait = 30 * time.Second

// openNode opens an engine as one ferrymq node would: its own connection
// to the given servers.
func openNode(t *testing.T, urls []string, replicas int) *jetstream.Engine {
	t.Helper()
	e, err := jetstream.Open(t.Context(), jetstream.Options{URLs: urls, Replicas: replicas, DefaultQueues: 8, Timeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// producer publishes keyed messages to topic through one engine, pipelined
// (window calls in flight), until stopped. Bodies are "<id>/<key>/<n>",
// n counting per key from 0.
type producer struct {
	id    int
	e     *jetstream.Engine
	topic string

	acked  atomic.Int64
	failed atomic.Int64

	mu      sync.Mutex
	results map[string]core.SendResult // by body
	slowest time.Duration
	lat     []time.Duration
	errs    []error
}

func (p *producer) run(stop <-chan struct{}, window int) {
	sem := make(chan struct{}, window)
	var wg sync.WaitGroup
	next := map[string]int{}
	for i := 0; ; i++ {
		select {
		case <-stop:
			wg.Wait()
			return
		case sem <- struct{}{}:
		}
		key := "dev-" + strconv.Itoa(i%40)
		body := fmt.Sprintf("%d/%s/%d", p.id, key, next[key])
		next[key]++
		start := time.Now()
		wg.Add(1)
		p.e.ProduceAsync([]*core.Message{{Topic: p.topic, ShardingKey: key, Body: []byte(body)}}, func(res []core.SendResult, err error) {
			defer wg.Done()
			defer func() { <-sem }()
			took := time.Since(start)
			p.mu.Lock()
			defer p.mu.Unlock()
			p.lat = append(p.lat, took)
			p.slowest = max(p.slowest, took)
			if err != nil {
				p.failed.Add(1)
				p.errs = append(p.errs, err)
				return
			}
			p.results[body] = res[0]
			p.acked.Add(1)
		})
	}
}

// quantile is the latency below which the share q of the produces took.
func (p *producer) quantile(q float64) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := slices.Clone(p.lat)
	slices.Sort(l)
	if len(l) == 0 {
		return 0
	}
	return l[int(float64(len(l)-1)*q)]
}

// TestResizeWhileProducing: two nodes (engines on their own connections)
// produce keyed messages without pause while one of them resizes the
// topic 8 → 16 → 4. Nothing fails; the node that did not resize publishes
// with its stale count, is refused by the fence and publishes again; every
// message is stored once, where its SendResult said; the epochs are exact:
// every message of a queue below the queue's Begin of an epoch was routed
// with an older count, every one at or above it with that epoch's count
// (so per epoch each key is in one queue), and every message after the
// largest Begin of an epoch — after the whole stream's boundary — too; and
// each node's messages of a key are stored in the order it produced them.
func TestResizeWhileProducing(t *testing.T) {
	t.Run("single-server", func(t *testing.T) {
		s := natstest.RunServer(t, natstest.SyncAlways())
		resizeWhileProducing(t, []string{s.URL}, func(string) []string { return []string{s.URL} }, 1)
	})
	t.Run("cluster", func(t *testing.T) {
		c := natstest.RunCluster(t, 3, natstest.SyncAlways())
		urls := strings.Split(c.URLs(), ",")
		// The stale node talks to a server that does not lead the stream,
		// so its stale publishes are forwarded to the leader.
		notLeader := func(stream string) []string {
			l := c.WaitStreamLeader(t, stream, resizeWait)
			return []string{urls[(l+1)%len(urls)]}
		}
		resizeWhileProducing(t, urls[:1], notLeader, 3)
	})
}

func resizeWhileProducing(t *testing.T, resizerURLs []string, staleURLs func(stream string) []string, replicas int) {
	ctx := t.Context()
	const topic = "elastic"
	a := openNode(t, resizerURLs, replicas)
	_, err := a.CreateTopic(ctx, core.TopicConfig{Name: topic, Queues: 8})
	require.NoError(t, err)
	b := openNode(t, staleURLs("FMQ_"+topic), replicas)

	producers := []*producer{
		{id: 0, e: a, topic: topic, results: map[string]core.SendResult{}},
		{id: 1, e: b, topic: topic, results: map[string]core.SendResult{}},
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, p := range producers {
		wg.Go(func() { p.run(stop, 32) })
	}
	stopped := false
	stopAll := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	t.Cleanup(stopAll)
	// waitMore waits until every producer has n more acknowledgements.
	waitMore := func(n int64) {
		t.Helper()
		var want []int64
		for _, p := range producers {
			want = append(want, p.acked.Load()+n)
		}
		require.Eventually(t, func() bool {
			for i, p := range producers {
				if p.acked.Load() < want[i] || p.failed.Load() > 0 {
					return p.failed.Load() > 0
				}
			}
			return true
		}, resizeWait, 5*time.Millisecond)
	}

	waitMore(150)
	for _, n := range []int{16, 4} {
		start := time.Now()
		info, err := a.ResizeTopic(ctx, topic, n)
		require.NoError(t, err)
		t.Logf("resize to %d took %v", n, time.Since(start))
		require.Equal(t, n, info.Queues)
		waitMore(150)
	}
	stopAll()
	for _, p := range producers {
		p50, p99 := p.quantile(0.5), p.quantile(0.99)
		p.mu.Lock()
		require.Empty(t, p.errs, "producer %d", p.id)
		t.Logf("producer %d: %d acknowledged; produce p50 %v, p99 %v, slowest %v", p.id, len(p.results), p50, p99, p.slowest)
		p.mu.Unlock()
	}
	t.Logf("published again after a fence: resizer %d, stale node %d", jetstream.Republished(a), jetstream.Republished(b))
	require.Positive(t, jetstream.Republished(b), "the stale node was never fenced: the test did not test the fence")

	for _, e := range []*jetstream.Engine{a, b} {
		info, err := e.Topic(ctx, topic)
		require.NoError(t, err)
		require.Equal(t, 4, info.Queues)
		require.Len(t, info.Ranges, 16)
		require.Len(t, info.Epochs, 3)
		for k, want := range []int{8, 16, 4} {
			require.Equal(t, want, info.Epochs[k].Queues)
		}
		require.Nil(t, info.Epochs[0].Begin)
		require.Len(t, info.Epochs[1].Begin, 16)
		require.Len(t, info.Epochs[2].Begin, 16)
	}
	info, err := a.Topic(ctx, topic)
	require.NoError(t, err)
	want := 0
	for _, p := range producers {
		want += len(p.results)
	}
	var stored []*core.StoredMessage
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var err error
		stored, err = readAllQueues(ctx, b, topic, len(info.Epochs))
		require.NoError(c, err)
		require.Len(c, stored, want) // a replica may trail a moment
	}, resizeWait, 20*time.Millisecond)
	checkEpochs(t, info, stored)

	byBody := map[string]*core.StoredMessage{}
	for _, m := range stored {
		require.NotContains(t, byBody, string(m.Body), "stored twice")
		byBody[string(m.Body)] = m
	}
	for _, p := range producers {
		for body, res := range p.results {
			m := byBody[body]
			require.NotNil(t, m, "acknowledged %s not stored", body)
			require.Equal(t, res.Queue, m.Queue, body)
			require.Equal(t, res.QueueOffset, m.QueueOffset, body)
			require.Equal(t, res.ID, m.ID, body)
		}
	}
	// Each node's messages of a key in the order it produced them.
	slices.SortFunc(stored, func(x, y *core.StoredMessage) int { return int(x.CommitLogOffset - y.CommitLogOffset) })
	next := map[string]int{}
	for _, m := range stored {
		parts := strings.Split(string(m.Body), "/")
		n, _ := strconv.Atoi(parts[2])
		k := parts[0] + "/" + parts[1]
		require.Equal(t, next[k], n, "%s stored out of order", m.Body)
		next[k]++
	}

	checkUntil(t, a, topic, info)
}

// readAllQueues reads every queue slot of topic from its first offset,
// checking that each read knew every epoch.
func readAllQueues(ctx context.Context, b core.Broker, topic string, epochs int) ([]*core.StoredMessage, error) {
	info, err := b.Topic(ctx, topic)
	if err != nil {
		return nil, err
	}
	var out []*core.StoredMessage
	for q := range info.Ranges {
		for off := info.Ranges[q].Min; ; {
			res, err := b.Read(ctx, core.ReadRequest{Topic: topic, Queue: q, Offset: off, MaxCount: 100})
			if err != nil {
				return nil, err
			}
			if res.Epochs != epochs {
				return nil, fmt.Errorf("read of queue %d knew %d epochs, want %d", q, res.Epochs, epochs)
			}
			out = append(out, res.Messages...)
			if res.NextOffset == off {
				break
			}
			off = res.NextOffset
		}
	}
	return out, nil
}

// checkEpochs checks that every message was routed with the queue count of
// its epoch, found both by its queue's Begin and by the whole stream's
// boundary (the largest Begin), and that each key is in one queue per
// epoch.
func checkEpochs(t *testing.T, info core.TopicInfo, msgs []*core.StoredMessage) {
	t.Helper()
	queuesOf := map[[2]string]map[int]bool{}
	perEpoch := make([]int, len(info.Epochs))
	for _, m := range msgs {
		byQueue, byStream := 0, 0
		for k := 1; k < len(info.Epochs); k++ {
			b := info.Epochs[k].Begin
			if m.Queue < len(b) && m.QueueOffset >= b[m.Queue] {
				byQueue = k
			}
			if m.QueueOffset >= slices.Max(b) {
				byStream = k
			}
		}
		require.Equal(t, byQueue, byStream, "%s at %d/%d: epoch by its queue's boundary and by the stream's", m.Body, m.Queue, m.QueueOffset)
		n := info.Epochs[byQueue].Queues
		require.Equal(t, core.QueueFor(m.ShardingKey, n), m.Queue, "%s at offset %d: epoch %d has %d queues", m.Body, m.QueueOffset, byQueue, n)
		k := [2]string{m.ShardingKey, strconv.Itoa(byQueue)}
		if queuesOf[k] == nil {
			queuesOf[k] = map[int]bool{}
		}
		queuesOf[k][m.Queue] = true
		perEpoch[byQueue]++
	}
	for k, qs := range queuesOf {
		require.Len(t, qs, 1, "key %s in epoch %s", k[0], k[1])
	}
	for k, n := range perEpoch {
		require.Positive(t, n, "no message in epoch %d", k)
	}
}

// checkUntil reads each queue that has messages before epoch 1 with Until
// at its Begin: nothing at or above it, and NextOffset ends exactly there.
func checkUntil(t *testing.T, b core.Broker, topic string, info core.TopicInfo) {
	t.Helper()
	ctx := t.Context()
	begin := info.Epochs[1].Begin
	checked := 0
	for q := range info.Epochs[0].Queues {
		until := begin[q]
		if until <= info.Ranges[q].Min {
			continue
		}
		off := info.Ranges[q].Min
		for {
			res, err := b.Read(ctx, core.ReadRequest{Topic: topic, Queue: q, Offset: off, Until: until, MaxCount: 7})
			require.NoError(t, err)
			for _, m := range res.Messages {
				require.Less(t, m.QueueOffset, until)
			}
			require.LessOrEqual(t, res.NextOffset, until)
			if res.NextOffset == off {
				break
			}
			off = res.NextOffset
		}
		require.Equal(t, until, off, "queue %d: reading with Until stopped short of it", q)
		checked++
	}
	require.Positive(t, checked)
}

// TestResizeRules: what ResizeTopic refuses, that the same count changes
// nothing, that CreateTopic compares with the count in force, and that the
// queues a shrink retired are still read, counted and committed to.
func TestResizeRules(t *testing.T) {
	ctx := t.Context()
	s := natstest.RunServer(t, natstest.SyncAlways())
	e := openEngine(t, s.URL)
	_, err := e.CreateTopic(ctx, core.TopicConfig{Name: "t", Queues: 8})
	require.NoError(t, err)

	_, err = e.ResizeTopic(ctx, "%DLQ%g", 4)
	require.ErrorIs(t, err, core.ErrInvalidTopic)
	for _, n := range []int{0, -1, core.MaxQueues + 1} {
		_, err = e.ResizeTopic(ctx, "t", n)
		require.ErrorIs(t, err, core.ErrInvalidTopic, "%d queues", n)
	}
	_, err = e.ResizeTopic(ctx, "nope", 4)
	require.ErrorIs(t, err, core.ErrTopicNotFound)

	info, err := e.ResizeTopic(ctx, "t", 8)
	require.NoError(t, err)
	require.Len(t, info.Epochs, 1, "the same count began an epoch")
	require.Nil(t, info.Epochs[0].Begin)

	var sent []core.SendResult
	for i := range 64 {
		res, err := e.Produce(ctx, &core.Message{Topic: "t", ShardingKey: "k" + strconv.Itoa(i), Body: []byte("old")})
		require.NoError(t, err)
		sent = append(sent, res)
	}
	info, err = e.ResizeTopic(ctx, "t", 2)
	require.NoError(t, err)
	require.Equal(t, 2, info.Queues)
	require.Len(t, info.Ranges, 8)
	require.Len(t, info.Epochs, 2)
	// Begin is each queue's next offset: one past its last message.
	want := make([]int64, 8)
	for _, r := range sent {
		want[r.Queue] = max(want[r.Queue], r.QueueOffset+1)
	}
	require.Equal(t, want, info.Epochs[1].Begin)
	again, err := e.ResizeTopic(ctx, "t", 2)
	require.NoError(t, err)
	require.Len(t, again.Epochs, 2)

	_, err = e.CreateTopic(ctx, core.TopicConfig{Name: "t", Queues: 8})
	require.ErrorIs(t, err, core.ErrTopicExists)
	_, err = e.CreateTopic(ctx, core.TopicConfig{Name: "t", Queues: 2})
	require.NoError(t, err)

	res, err := e.Produce(ctx, &core.Message{Topic: "t", ShardingKey: "k1", Body: []byte("new")})
	require.NoError(t, err)
	require.Equal(t, core.QueueFor("k1", 2), res.Queue)
	for q := range 8 {
		var n int
		for _, r := range sent {
			if r.Queue == q {
				n++
			}
		}
		if q == res.Queue {
			n++
		}
		got, err := e.Backlog(ctx, "t", q, 0)
		require.NoError(t, err)
		require.EqualValues(t, n, got, "queue %d", q)
		rd, err := e.Read(ctx, core.ReadRequest{Topic: "t", Queue: q, MaxCount: 100})
		require.NoError(t, err)
		require.Len(t, rd.Messages, n, "queue %d", q)
		require.Equal(t, 2, rd.Epochs)
		require.NoError(t, e.CommitOffset(ctx, "g", "t", q, rd.NextOffset))
		off, err := e.CommittedOffset(ctx, "g", "t", q)
		require.NoError(t, err)
		require.Equal(t, rd.NextOffset, off)
		if n > 0 {
			at, err := e.OffsetAt(ctx, "t", q, time.Time{})
			require.NoError(t, err)
			require.Equal(t, rd.Messages[0].QueueOffset, at, "queue %d", q)
		}
		for _, m := range rd.Messages {
			got, err := e.Get(ctx, m.ID)
			require.NoError(t, err)
			require.Equal(t, m.Body, got.Body)
			require.Equal(t, q, got.Queue)
		}
	}
	_, err = e.Read(ctx, core.ReadRequest{Topic: "t", Queue: 8})
	require.ErrorIs(t, err, core.ErrQueueNotFound)
	_, err = e.Backlog(ctx, "t", 8, 0)
	require.ErrorIs(t, err, core.ErrQueueNotFound)
}

// TestResizeConcurrent: two nodes resize the same topic at once; the
// resize lock makes one wait for the other, and both land, one epoch
// each, in one consistent history that both nodes and a node opened
// afterwards read.
func TestResizeConcurrent(t *testing.T) {
	ctx := t.Context()
	s := natstest.RunServer(t, natstest.SyncAlways())
	a, b := openEngine(t, s.URL), openEngine(t, s.URL)
	_, err := a.CreateTopic(ctx, core.TopicConfig{Name: "t", Queues: 8})
	require.NoError(t, err)
	_, err = b.Produce(ctx, &core.Message{Topic: "t", ShardingKey: "k", Body: []byte("x")})
	require.NoError(t, err)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, e := range []*jetstream.Engine{a, b} {
		wg.Go(func() { _, errs[i] = e.ResizeTopic(ctx, "t", 12+4*i) })
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	c := openEngine(t, s.URL)
	var first core.TopicInfo
	for i, e := range []*jetstream.Engine{a, b, c} {
		info, err := e.Topic(ctx, "t")
		require.NoError(t, err)
		require.Len(t, info.Epochs, 3)
		counts := []int{info.Epochs[1].Queues, info.Epochs[2].Queues}
		sort.Ints(counts)
		require.Equal(t, []int{12, 16}, counts)
		require.Equal(t, info.Epochs[2].Queues, info.Queues)
		if i == 0 {
			first = info
		} else {
			require.Equal(t, first.Epochs, info.Epochs)
		}
	}
}

func republished(e *jetstream.Engine) int64 { return jetstream.Republished(e) }

// TestResizeRetiredQueuesLeaveWithTheirMessages: once retention has
// removed every message of the epochs that wrote to the queues a shrink
// retired, those queues leave Ranges; the epochs stay in the history.
func TestResizeRetiredQueuesLeaveWithTheirMessages(t *testing.T) {
	ctx := t.Context()
	s := natstest.RunServer(t, natstest.SyncAlways())
	e, err := jetstream.Open(ctx, jetstream.Options{URLs: []string{s.URL}, MaxBytes: 64 << 10, Timeout: 2 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	_, err = e.CreateTopic(ctx, core.TopicConfig{Name: "t", Queues: 8})
	require.NoError(t, err)
	body := make([]byte, 1<<10)
	produce := func(n int) {
		t.Helper()
		for i := range n {
			_, err := e.Produce(ctx, &core.Message{Topic: "t", ShardingKey: "k" + strconv.Itoa(i), Body: body})
			require.NoError(t, err)
		}
	}
	produce(16)
	info, err := e.ResizeTopic(ctx, "t", 2)
	require.NoError(t, err)
	require.Len(t, info.Ranges, 8)
	produce(16)
	info, err = e.Topic(ctx, "t")
	require.NoError(t, err)
	require.Len(t, info.Ranges, 8, "the retired queues still hold messages")
	produce(120) // twice the stream's bytes
	info, err = e.Topic(ctx, "t")
	require.NoError(t, err)
	require.Len(t, info.Ranges, 2, "the retired queues are empty")
	require.Len(t, info.Epochs, 2)
	for q := range 2 {
		res, err := e.Read(ctx, core.ReadRequest{Topic: "t", Queue: q, Offset: info.Ranges[q].Min, MaxCount: 1000})
		require.NoError(t, err)
		for _, m := range res.Messages {
			require.GreaterOrEqual(t, m.QueueOffset, info.Epochs[1].Begin[q])
		}
	}
}

// TestResizeThenDeleteAndCreateAgain: a topic resized, then deleted and
// created again, takes its predecessor's first-epoch subjects again; the
// fences both nodes keep for the predecessor's ended epoch must not answer
// what the new stream stores: every produce succeeds, once.
func TestResizeThenDeleteAndCreateAgain(t *testing.T) {
	ctx := t.Context()
	s := natstest.RunServer(t, natstest.SyncAlways())
	a, b := openEngine(t, s.URL), openEngine(t, s.URL)
	_, err := a.CreateTopic(ctx, core.TopicConfig{Name: "t", Queues: 8})
	require.NoError(t, err)
	_, err = a.ResizeTopic(ctx, "t", 4)
	require.NoError(t, err)
	info, err := b.Topic(ctx, "t") // b learns the epochs, and fences epoch 0
	require.NoError(t, err)
	require.Len(t, info.Epochs, 2)
	require.NoError(t, a.DeleteTopic(ctx, "t"))

	for i := range 50 {
		_, err := a.Produce(ctx, &core.Message{Topic: "t", ShardingKey: "k" + strconv.Itoa(i), Body: []byte(strconv.Itoa(i))})
		require.NoError(t, err, "produce %d", i)
	}
	info, err = a.Topic(ctx, "t")
	require.NoError(t, err)
	require.Len(t, info.Epochs, 1)
	require.Equal(t, 4, info.Queues, "created again with the default count")
	msgs, err := readAllQueues(ctx, a, "t", 1)
	require.NoError(t, err)
	require.Len(t, msgs, 50, "every produce stored once")
	require.Zero(t, republished(a))
}

// TestResizeToAndFromMaxQueues: the largest count and back to one; the
// boundaries of 1,024 queues are read in chunks and fit the metadata.
func TestResizeToAndFromMaxQueues(t *testing.T) {
	ctx := t.Context()
	s := natstest.RunServer(t)
	e := openEngine(t, s.URL)
	_, err := e.CreateTopic(ctx, core.TopicConfig{Name: "t", Queues: 1})
	require.NoError(t, err)
	var last [2]core.SendResult
	for i, n := range []int{core.MaxQueues, 1} {
		for k := range 50 {
			res, err := e.Produce(ctx, &core.Message{Topic: "t", ShardingKey: "k" + strconv.Itoa(k), Body: []byte("x")})
			require.NoError(t, err)
			last[i] = res
		}
		info, err := e.ResizeTopic(ctx, "t", n)
		require.NoError(t, err)
		require.Equal(t, n, info.Queues)
		require.Len(t, info.Epochs[i+1].Begin, core.MaxQueues)
		require.Equal(t, last[i].QueueOffset+1, info.Epochs[i+1].Begin[last[i].Queue])
	}
	info, err := e.Topic(ctx, "t")
	require.NoError(t, err)
	require.Len(t, info.Ranges, core.MaxQueues)
}
