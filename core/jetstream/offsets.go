package jetstream

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferrymq/ferrymq/core"
)

// Committed offsets live in the engine's bucket under
// "o.<tok(topic)>.<tok(group)>.<queue>" with the value
// "<topic created, unix ns>:<offset>": an offset committed to a deleted
// topic's predecessor is not the new topic's.
func offsetKey(topicTok, groupTok string, queue int) string {
	return "o." + topicTok + "." + groupTok + "." + strconv.Itoa(queue)
}

// CommitOffset implements core.Broker.
func (e *Engine) CommitOffset(ctx context.Context, group, topic string, queue int, offset int64) error {
	if e.closed.Load() {
		return core.ErrClosed
	}
	t, err := e.queueTopic(ctx, topic, queue)
	if err != nil {
		return err
	}
	if group == "" || offset < 0 {
		return fmt.Errorf("%w: commit of group %q offset %d", core.ErrInvalidMessage, group, offset)
	}
	ctx, cancel := e.reqCtx(ctx)
	defer cancel()
	v := strconv.FormatInt(t.created.UnixNano(), 10) + ":" + strconv.FormatInt(offset, 10)
	if _, err := e.meta.Put(ctx, offsetKey(t.tok, token(group), queue), []byte(v)); err != nil {
		return e.unavailable("commit offset", err)
	}
	return nil
}

// CommittedOffset implements core.Broker.
func (e *Engine) CommittedOffset(ctx context.Context, group, topic string, queue int) (int64, error) {
	if e.closed.Load() {
		return 0, core.ErrClosed
	}
	t, err := e.queueTopic(ctx, topic, queue)
	if errors.Is(err, core.ErrTopicNotFound) {
		return 0, core.ErrNoCommittedOffset // gone with its topic, or never
	}
	if err != nil {
		return 0, err
	}
	ctx, cancel := e.reqCtx(ctx)
	defer cancel()
	ent, err := e.meta.Get(ctx, offsetKey(t.tok, token(group), queue))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, core.ErrNoCommittedOffset
	}
	if err != nil {
		return 0, e.unavailable("committed offset", err)
	}
	created, off, err := parseOffset(ent.Value())
	if err != nil {
		return 0, fmt.Errorf("%w: committed offset of %s/%s/%d: %w", core.ErrCorrupt, group, topic, queue, err)
	}
	if created != t.created.UnixNano() {
		return 0, core.ErrNoCommittedOffset
	}
	return off, nil
}

func parseOffset(v []byte) (created, off int64, err error) {
	a, b, ok := strings.Cut(string(v), ":")
	if !ok {
		return 0, 0, fmt.Errorf("value %q is not created:offset", v)
	}
	if created, err = strconv.ParseInt(a, 10, 64); err != nil {
		return 0, 0, fmt.Errorf("value %q: %w", v, err)
	}
	if off, err = strconv.ParseInt(b, 10, 64); err != nil || off < 0 {
		return 0, 0, fmt.Errorf("value %q: bad offset", v)
	}
	return created, off, nil
}

// queueTopic returns the topic of a queue that can hold messages: one the
// current epoch writes to, or one an earlier epoch wrote to whose messages
// are not all gone (as far as the cached range tells).
func (e *Engine) queueTopic(ctx context.Context, topic string, queue int) (*topicState, error) {
	t, err := e.topic(ctx, topic, false)
	if err != nil {
		return nil, err
	}
	lay := t.lay.Load()
	n := lay.maxQueues()
	if c := t.rng.Load(); c != nil {
		n = lay.liveQueues(uint64(c.r.Min) + 1)
	}
	if queue < 0 || queue >= n {
		return nil, fmt.Errorf("%w: %s has %d queues, not %d", core.ErrQueueNotFound, topic, n, queue)
	}
	return t, nil
}

// purgeOffsets deletes a deleted topic's committed offsets (best effort:
// those left behind are ignored by incarnation anyway).
func (e *Engine) purgeOffsets(ctx context.Context, t *topicState) {
	l, err := e.meta.ListKeysFiltered(ctx, "o."+t.tok+".>")
	if err != nil {
		e.log.Warn().Err(err).Str("topic", t.name).Msg("offsets of deleted topic not listed")
		return
	}
	defer func() { _ = l.Stop() }()
	for k := range l.Keys() {
		if err := e.meta.Purge(ctx, k); err != nil {
			e.log.Warn().Err(err).Str("key", k).Msg("offset of deleted topic not purged")
		}
	}
}

// Shared returns the value every node agrees on for name, kept in the
// engine's bucket: the first caller's value (from gen) is stored, later
// callers on any node get it. Used for a generated API token, which every
// node must accept because the core services move between them.
func (e *Engine) Shared(ctx context.Context, name string, gen func() (string, error)) (string, error) {
	ctx, cancel := e.reqCtx(ctx)
	defer cancel()
	key := "shared." + token(name)
	for {
		if ent, err := e.meta.Get(ctx, key); err == nil {
			return string(ent.Value()), nil
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return "", e.unavailable("shared "+name, err)
		}
		v, err := gen()
		if err != nil {
			return "", err
		}
		if _, err := e.meta.Create(ctx, key, []byte(v)); err == nil {
			return v, nil
		} else if !errors.Is(err, jetstream.ErrKeyExists) {
			return "", e.unavailable("shared "+name, err)
		}
		// another node was first: read its value
	}
}

// SetNodeInfo records what node advertises (for discovery: its core
// address) in the engine's bucket, replacing what it recorded before.
// Entries of nodes that are gone stay: readers keep only those of nodes
// alive (their liveness leases).
func (e *Engine) SetNodeInfo(ctx context.Context, node string, info []byte) error {
	ctx, cancel := e.reqCtx(ctx)
	defer cancel()
	if _, err := e.meta.Put(ctx, "nodeinfo."+token(node), info); err != nil {
		return e.unavailable("node info", err)
	}
	return nil
}

// NodeInfos returns what each node recorded with SetNodeInfo.
func (e *Engine) NodeInfos(ctx context.Context) ([][]byte, error) {
	ctx, cancel := e.reqCtx(ctx)
	defer cancel()
	vals, err := values(ctx, e.meta, "nodeinfo.*", func(string) bool { return true })
	if err != nil {
		return nil, e.unavailable("list node infos", err)
	}
	return slices.Collect(maps.Values(vals)), nil
}
