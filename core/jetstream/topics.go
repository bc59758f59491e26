package jetstream

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferrymq/ferrymq/core"
)

// Stream metadata keys: the topic's real name (tokens may be hashes), its
// queue count in force and creation time; a resized topic's epochs are
// metaEpochs (epochs.go).
const (
	metaTopic   = "ferrymq.topic"
	metaQueues  = "ferrymq.queues"
	metaCreated = "ferrymq.created"
)

// fenceKey is the bucket key holding the last sequence a deleted topic's
// stream reached; the topic's next incarnation starts after it, so queue
// offsets and message IDs are never reused.
func fenceKey(tok string) string { return "d." + tok }

func (e *Engine) checkName(name string) error {
	if strings.HasPrefix(name, "%") {
		return core.ValidateSystemTopic(name)
	}
	return core.ValidateTopic(name)
}

// topic returns the cached state of a topic, loading it from its stream
// or creating it (create: queues 0 means the default).
func (e *Engine) topic(ctx context.Context, name string, create bool) (*topicState, error) {
	e.mu.RLock()
	t := e.topics[name]
	e.mu.RUnlock()
	if t != nil {
		return t, nil
	}
	if err := e.checkName(name); err != nil {
		return nil, err
	}
	// One lookup per name at a time: a burst of first produces to a new
	// topic must not become a burst of stream API calls.
	e.mu.Lock()
	l := e.loading[name]
	if l == nil {
		l = &load{done: make(chan struct{})}
		e.loading[name] = l
		e.mu.Unlock()
		l.t, l.err = e.load(ctx, name, create)
		e.mu.Lock()
		delete(e.loading, name)
		e.mu.Unlock()
		close(l.done)
		return l.t, l.err
	}
	e.mu.Unlock()
	select {
	case <-l.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if errors.Is(l.err, core.ErrTopicNotFound) && create {
		return e.topic(ctx, name, create) // the first caller did not create it
	}
	return l.t, l.err
}

// load is one topic lookup in flight.
type load struct {
	done chan struct{}
	t    *topicState
	err  error
}

func (e *Engine) load(ctx context.Context, name string, create bool) (*topicState, error) {
	if !create {
		info, err := e.streamInfo(ctx, name)
		if err != nil {
			return nil, err
		}
		return e.cache(name, info)
	}
	// A producer's first message to a topic: a stream another node created
	// a moment ago may not answer until its leader is elected, so ask
	// again, with the creation budget.
	ctx, cancel := e.creationBudget(ctx)
	defer cancel()
	info, err := e.retryInfo(ctx, name, e.opts.Timeout, 100*time.Millisecond, func(err error) bool {
		return errors.Is(err, ErrUnavailable) && !errors.Is(err, core.ErrTopicNotFound)
	})
	if errors.Is(err, core.ErrTopicNotFound) {
		return e.create(ctx, name, e.opts.DefaultQueues)
	}
	if err != nil {
		return nil, err
	}
	return e.cache(name, info)
}

// creationBudget gives creating a topic (or waiting for one just created)
// a longer budget than one request, unless the caller set a deadline:
// creating a replicated stream includes electing its leader, which on a
// loaded cluster takes seconds.
func (e *Engine) creationBudget(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, 6*e.opts.Timeout)
}

// retryInfo asks for the stream of topic name until it answers, retry
// says an error is not worth another try, or ctx ends; each try gets at
// most per, and pause passes between tries.
func (e *Engine) retryInfo(ctx context.Context, name string, per, pause time.Duration, retry func(error) bool) (*jetstream.StreamInfo, error) {
	for {
		tctx, cancel := context.WithTimeout(ctx, per)
		info, err := e.streamInfo(tctx, name)
		cancel()
		if err == nil || !retry(err) || ctx.Err() != nil {
			return info, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(pause):
		}
	}
}

func (e *Engine) streamInfo(ctx context.Context, name string) (*jetstream.StreamInfo, error) {
	ctx, cancel := e.reqCtx(ctx)
	defer cancel()
	s, err := e.js.Stream(ctx, streamName(name))
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("%w: %s", core.ErrTopicNotFound, name)
	}
	if err != nil {
		return nil, e.unavailable(fmt.Sprintf("stream of topic %s", name), err)
	}
	return s.CachedInfo(), nil
}

// info reads a topic's stream state afresh (first and last sequence) and
// learns its epochs; the layout returned is the stream's.
func (e *Engine) info(ctx context.Context, t *topicState) (*jetstream.StreamInfo, *layout, error) {
	info, err := e.streamInfo(ctx, t.name)
	if errors.Is(err, core.ErrTopicNotFound) {
		e.forget(t)
		return nil, nil, err
	}
	if err != nil {
		return nil, nil, err
	}
	if !sameIncarnation(t, info) {
		e.forget(t)
		return nil, nil, fmt.Errorf("%w: %s was deleted", core.ErrTopicNotFound, t.name)
	}
	lay, err := e.parseLayout(info)
	if err != nil {
		return nil, nil, err
	}
	e.learn(t, lay)
	return info, lay, nil
}

// parseLayout reads the epochs in a topic stream's metadata.
func (e *Engine) parseLayout(info *jetstream.StreamInfo) (*layout, error) {
	created, _ := time.Parse(time.RFC3339Nano, info.Config.Metadata[metaCreated])
	lay, err := parseLayout(info.Config.Metadata, created)
	if err != nil {
		return nil, fmt.Errorf("%w: stream %s: %w", core.ErrCorrupt, info.Config.Name, err)
	}
	return lay, nil
}

func sameIncarnation(t *topicState, info *jetstream.StreamInfo) bool {
	c, _ := time.Parse(time.RFC3339Nano, info.Config.Metadata[metaCreated])
	return c.Equal(t.created)
}

func (e *Engine) cache(name string, info *jetstream.StreamInfo) (*topicState, error) {
	md := info.Config.Metadata
	if md[metaTopic] != name {
		return nil, fmt.Errorf("%w: stream %s holds topic %q, not %q", core.ErrCorrupt, info.Config.Name, md[metaTopic], name)
	}
	created, err := time.Parse(time.RFC3339Nano, md[metaCreated])
	if err != nil {
		return nil, fmt.Errorf("%w: stream %s: created %q", core.ErrCorrupt, info.Config.Name, md[metaCreated])
	}
	lay, err := e.parseLayout(info)
	if err != nil {
		return nil, err
	}
	t := &topicState{name: name, tok: token(name), stream: info.Config.Name, created: created}
	t.lay.Store(lay)
	t.pub = lay
	e.mu.Lock()
	old := e.topics[name]
	if old == nil || !old.created.Equal(created) {
		e.topics[name] = t
		e.byHash[topicHash(name)] = name
		old = t
	}
	e.mu.Unlock()
	e.learn(old, lay)
	return old, nil
}

func (e *Engine) forget(t *topicState) {
	e.mu.Lock()
	if e.topics[t.name] == t {
		delete(e.topics, t.name)
	}
	e.mu.Unlock()
}

func (e *Engine) create(ctx context.Context, name string, queues int) (*topicState, error) {
	tok := token(name)
	first := uint64(0)
	ctx, cancel := e.creationBudget(ctx)
	defer cancel()
	if ent, err := e.meta.Get(ctx, fenceKey(tok)); err == nil {
		last, perr := strconv.ParseUint(string(ent.Value()), 10, 64)
		if perr != nil {
			return nil, fmt.Errorf("%w: fence of topic %s: %q", core.ErrCorrupt, name, ent.Value())
		}
		first = last + 1
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, e.unavailable("fence of topic "+name, err)
	}
	cfg := jetstream.StreamConfig{
		Name:        streamName(name),
		Description: "ferrymq topic " + name,
		Subjects:    []string{topicSubjects(tok)},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    e.opts.Replicas,
		MaxAge:      e.opts.MaxAge,
		MaxBytes:    orUnlimited(e.opts.MaxBytes),
		MaxMsgSize:  int32(e.maxMsg),
		Discard:     jetstream.DiscardOld,
		AllowDirect: true,
		Duplicates:  time.Second, // no Nats-Msg-Id is sent; keep the window small
		FirstSeq:    first,
		Metadata: map[string]string{
			metaTopic:   name,
			metaQueues:  strconv.Itoa(queues),
			metaCreated: time.Now().UTC().Format(time.RFC3339Nano),
		},
	}
	s, err := e.js.CreateStream(ctx, cfg)
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return e.createdElsewhere(ctx, name)
	}
	if err != nil {
		return nil, e.unavailable("create topic "+name, err)
	}
	e.log.Info().Str("topic", name).Int("queues", queues).Int("replicas", e.opts.Replicas).Msg("topic created")
	return e.cache(name, s.CachedInfo())
}

// createdElsewhere loads a topic whose stream another node created first.
// In a cluster the stream may still be unknown to the server answering
// stream info for a moment after the meta leader refused our create, so
// "not found" is asked again until ctx ends: it must not reach a producer
// whose topic is being auto-created.
func (e *Engine) createdElsewhere(ctx context.Context, name string) (*topicState, error) {
	// Every error is worth another try here; one slow answer must not use
	// the whole deadline.
	info, err := e.retryInfo(ctx, name, time.Second, 50*time.Millisecond, func(error) bool { return true })
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, core.ErrTopicNotFound) {
			return nil, e.unavailable("stream of topic "+name+" created by another node", ctx.Err())
		}
		return nil, err
	}
	return e.cache(name, info)
}

func orUnlimited(n int64) int64 {
	if n <= 0 {
		return -1
	}
	return n
}

// CreateTopic implements core.Broker.
func (e *Engine) CreateTopic(ctx context.Context, cfg core.TopicConfig) (core.TopicInfo, error) {
	if e.closed.Load() {
		return core.TopicInfo{}, core.ErrClosed
	}
	if err := e.readOnly(cfg.Name, "create "+cfg.Name); err != nil {
		return core.TopicInfo{}, err
	}
	if err := e.checkName(cfg.Name); err != nil {
		return core.TopicInfo{}, err
	}
	n := cfg.Queues
	if n == 0 {
		n = e.opts.DefaultQueues
	}
	if err := core.ValidateQueueCount(n); err != nil {
		return core.TopicInfo{}, err
	}
	t, err := e.topic(ctx, cfg.Name, false)
	if errors.Is(err, core.ErrTopicNotFound) {
		t, err = e.create(ctx, cfg.Name, n)
	}
	if err != nil {
		return core.TopicInfo{}, err
	}
	info, err := e.Topic(ctx, t.name)
	if err != nil {
		return core.TopicInfo{}, err
	}
	if info.Queues != n {
		return core.TopicInfo{}, fmt.Errorf("%w: %s has %d queues, not %d", core.ErrTopicExists, t.name, info.Queues, n)
	}
	return info, nil
}

// Topic implements core.Broker. Offsets are stream sequences (minus one),
// shared by the topic's queues, so every queue reports the stream's range;
// Backlog counts one queue's messages exactly.
func (e *Engine) Topic(ctx context.Context, name string) (core.TopicInfo, error) {
	if e.closed.Load() {
		return core.TopicInfo{}, core.ErrClosed
	}
	t, err := e.topic(ctx, name, false)
	if err != nil {
		return core.TopicInfo{}, err
	}
	info, lay, err := e.info(ctx, t)
	if err != nil {
		return core.TopicInfo{}, err
	}
	return topicInfo(t, info, lay), nil
}

// topicInfo describes t as its stream's info and layout show it: every
// queue slot that can still hold a message has the stream's range (the
// queues share its sequence); epochs are the committed ones.
func topicInfo(t *topicState, info *jetstream.StreamInfo, lay *layout) core.TopicInfo {
	r := streamRange(info)
	n := lay.liveQueues(firstSeq(info))
	out := core.TopicInfo{Name: t.name, Queues: lay.queues(), CreatedAt: t.created, Ranges: make([]core.QueueRange, n),
		Epochs: lay.coreEpochs()}
	for q := range out.Ranges {
		out.Ranges[q] = r
	}
	return out
}

// firstSeq is the sequence of a stream's oldest message, or the next
// sequence when it holds none.
func firstSeq(info *jetstream.StreamInfo) uint64 {
	if info.State.Msgs == 0 {
		return max(info.State.LastSeq+1, info.Config.FirstSeq, info.State.FirstSeq)
	}
	return info.State.FirstSeq
}

// streamRange is the offsets a stream holds: message offset = sequence − 1.
func streamRange(info *jetstream.StreamInfo) core.QueueRange {
	st := info.State
	last := int64(st.LastSeq)
	if st.Msgs == 0 {
		// Empty (new, purged, or a successor of a deleted topic whose
		// FirstSeq is past the fence): nothing below the next sequence.
		next := max(last, int64(info.Config.FirstSeq)-1, int64(st.FirstSeq)-1, 0)
		return core.QueueRange{Min: next, Max: next}
	}
	return core.QueueRange{Min: max(int64(st.FirstSeq)-1, 0), Max: last}
}

// Topics implements core.Broker.
func (e *Engine) Topics(ctx context.Context) ([]core.TopicInfo, error) {
	if e.closed.Load() {
		return nil, core.ErrClosed
	}
	ctx, cancel := e.reqCtx(ctx)
	defer cancel()
	l := e.js.ListStreams(ctx, jetstream.WithStreamListSubject(subjectPrefix+">"))
	var out []core.TopicInfo
	for info := range l.Info() {
		name := info.Config.Metadata[metaTopic]
		if name == "" || !strings.HasPrefix(info.Config.Name, streamPrefix) || info.Config.Name == keysStream {
			continue
		}
		t, err := e.cache(name, info)
		if err != nil {
			e.log.Warn().Err(err).Str("stream", info.Config.Name).Msg("stream skipped")
			continue
		}
		lay, _ := e.parseLayout(info) // cache parsed it
		out = append(out, topicInfo(t, info, lay))
	}
	if err := l.Err(); err != nil {
		return nil, e.unavailable("list topics", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// DeleteTopic implements core.Broker: the stream goes, with the topic's
// index keys and committed offsets; a fence in the bucket makes the next
// topic of that name start after the last sequence this one used.
func (e *Engine) DeleteTopic(ctx context.Context, name string) error {
	if e.closed.Load() {
		return core.ErrClosed
	}
	if err := e.readOnly(name, "delete "+name); err != nil {
		return err
	}
	if err := core.ValidateTopic(name); err != nil {
		return err
	}
	t, err := e.topic(ctx, name, false)
	if err != nil {
		return err
	}
	info, _, err := e.info(ctx, t)
	if err != nil {
		return err
	}
	ctx, cancel := e.reqCtx(ctx)
	defer cancel()
	// Fence first: if deleting fails half way, the fence only wastes numbers.
	last := max(info.State.LastSeq, info.Config.FirstSeq)
	if _, err := e.meta.Put(ctx, fenceKey(t.tok), []byte(strconv.FormatUint(last, 10))); err != nil {
		return e.unavailable("fence topic "+name, err)
	}
	if err := e.js.DeleteStream(ctx, t.stream); err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			e.forget(t)
			return fmt.Errorf("%w: %s", core.ErrTopicNotFound, name)
		}
		return e.unavailable("delete topic "+name, err)
	}
	e.forget(t)
	if ks, err := e.js.Stream(ctx, keysStream); err == nil {
		if err := ks.Purge(ctx, jetstream.WithPurgeSubject(keysPrefix+t.tok+".>")); err != nil {
			e.log.Warn().Err(err).Str("topic", name).Msg("index keys of deleted topic not purged")
		}
	}
	e.purgeOffsets(ctx, t)
	e.log.Info().Str("topic", name).Uint64("fence", last).Msg("topic deleted")
	return nil
}

func (e *Engine) reqCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, e.opts.Timeout)
}

// unavailable wraps a failed JetStream call; context errors pass as they are.
func (e *Engine) unavailable(what string, err error) error {
	if errors.Is(err, context.Canceled) {
		return fmt.Errorf("jetstream: %s: %w", what, err)
	}
	return fmt.Errorf("%w: %s: %w", ErrUnavailable, what, err)
}
