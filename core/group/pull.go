package group

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/ferrymq/ferrymq/core"
)

// DefaultPullMax is how many messages a pull with no Max returns at most.
const DefaultPullMax = 32

// barrierPoll is how often a pull held at an epoch barrier looks again.
const barrierPoll = 20 * time.Millisecond

// PullRequest asks for messages of one queue.
type PullRequest struct {
	Group, ClientID string
	Queue           QueueRef
	// Offset is where the member's own position is; -1 asks the
	// coordinator to start from the group's committed offset (or the
	// group's start position if it never committed).
	Offset int64
	// Max bounds the number of messages (0 means DefaultPullMax).
	Max int
	// Wait bounds a long poll: with nothing to return, Pull waits up to
	// Wait for messages to arrive. 0 returns at once.
	Wait time.Duration
}

// PullResult is what Pull found.
type PullResult struct {
	Messages []*core.StoredMessage
	// Offset is where this pull started reading (after any reset or
	// clamping); NextOffset is where the next pull should start.
	Offset, NextOffset int64
	// Reset is true when the group's offset for this queue was reset (or the
	// member asked with -1) and the member must drop its own position and
	// continue from NextOffset.
	Reset bool
	Range core.QueueRange
	// Release is the read's (core.ReadResult.Release): a caller done with
	// every byte of the messages' bodies may call it; nil when there is
	// nothing to give back.
	Release func()
}

// Pull returns messages of a queue the member may consume: in clustering
// mode, one assigned to it, whose lease it holds or takes now.
func (c *Coordinator) Pull(ctx context.Context, req PullRequest) (PullResult, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return PullResult{}, ErrClosed
	}
	g, m, err := c.memberLocked(req.Group, req.ClientID)
	if err != nil {
		c.mu.Unlock()
		return PullResult{}, err
	}
	ref := req.Queue
	tags, ok := m.tagsFor(ref.Topic, g)
	if !ok {
		c.mu.Unlock()
		return PullResult{}, fmt.Errorf("%w: %s does not subscribe to %s", ErrNotSubscribed, m.id, ref.Topic)
	}
	now := c.opts.Now()
	if g.mode == Clustering {
		if err := c.acquireLocked(g, m, ref, now); err != nil {
			c.mu.Unlock()
			return PullResult{}, err
		}
	}
	reset := req.Offset < 0
	if gen := g.resetGen[ref]; m.resetSeen[ref] != gen {
		m.resetSeen[ref] = gen
		reset = true
	}
	from, fromTime, mode := m.from, m.fromTime, g.mode
	key := offsetGroup(g, m.id)
	c.mu.Unlock()

	offset := req.Offset
	if reset {
		offset, err = c.startOffset(ctx, key, ref, from, fromTime)
		if err != nil {
			return PullResult{}, err
		}
	}
	maxN := req.Max
	if maxN <= 0 {
		maxN = DefaultPullMax
	}
	deadline := time.Now().Add(req.Wait)
	start := func(q int) (int64, error) {
		return c.startOffset(ctx, key, QueueRef{ref.Topic, q}, from, fromTime)
	}
	for {
		arrived := c.b.Arrivals(ref.Topic) // taken before the read, so no arrival is missed
		res, held, err := c.gate.Read(ctx, key, core.ReadRequest{Topic: ref.Topic, Queue: ref.Queue, Offset: offset, MaxCount: maxN, Tags: tags, Reader: key}, start)
		if errors.Is(err, core.ErrTopicNotFound) {
			res, err = core.ReadResult{NextOffset: offset}, nil
		}
		if err != nil {
			return PullResult{}, fmt.Errorf("pull %s: %w", ref, err)
		}
		if held {
			// The queue's next messages are of an epoch whose keys still
			// have older messages in other queues: wait for the group to
			// commit those (commits do not signal arrivals: look again
			// every barrierPoll).
			wait := time.Until(deadline)
			if wait <= 0 {
				return PullResult{Offset: offset, NextOffset: offset, Reset: reset}, nil
			}
			t := time.NewTimer(min(wait, barrierPoll))
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return PullResult{Offset: offset, NextOffset: offset, Reset: reset}, nil
			}
			continue
		}
		start := offset
		if res.Clamped {
			start = res.NextOffset - int64(len(res.Messages))
			if len(res.Messages) > 0 {
				start = res.Messages[0].QueueOffset
			}
			reset = reset || len(res.Messages) == 0
		}
		out := PullResult{Messages: res.Messages, Offset: start, NextOffset: res.NextOffset, Reset: reset, Range: res.Range, Release: res.Release}
		wait := time.Until(deadline)
		if len(res.Messages) > 0 || res.NextOffset != offset || wait <= 0 {
			c.traceDelivered(req, key, mode, out.Messages)
			return out, nil
		}
		t := time.NewTimer(wait)
		select {
		case <-arrived:
			t.Stop()
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return out, nil
		}
	}
}

// startOffset is where a member starts a queue: the committed offset, else
// the group's start position (fromTime: FromTimestamp's).
func (c *Coordinator) startOffset(ctx context.Context, key string, ref QueueRef, from ConsumeFrom, fromTime time.Time) (int64, error) {
	off, err := c.b.CommittedOffset(ctx, key, ref.Topic, ref.Queue)
	if err == nil {
		return off, nil
	}
	if !errors.Is(err, core.ErrNoCommittedOffset) {
		return 0, err
	}
	info, err := c.b.Topic(ctx, ref.Topic)
	if errors.Is(err, core.ErrTopicNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if ref.Queue < 0 || ref.Queue >= len(info.Ranges) {
		return 0, fmt.Errorf("%w: %s", core.ErrQueueNotFound, ref)
	}
	switch from {
	case FromLatest:
		return info.Ranges[ref.Queue].Max, nil
	case FromTimestamp:
		off, err := c.b.OffsetAt(ctx, ref.Topic, ref.Queue, fromTime)
		if err != nil {
			return 0, fmt.Errorf("start %s at %s: %w", ref, fromTime.Format(time.RFC3339Nano), err)
		}
		return off, nil
	}
	return info.Ranges[ref.Queue].Min, nil
}

func (c *Coordinator) memberLocked(group, clientID string) (*groupState, *member, error) {
	g := c.groups[group]
	if g == nil || g.members[clientID] == nil {
		return nil, nil, fmt.Errorf("%w: %s in %s", ErrUnknownMember, clientID, group)
	}
	return g, g.members[clientID], nil
}

// tagsFor returns the member's tag filter for topic; ok is false if it does
// not subscribe to it.
func (m *member) tagsFor(topic string, g *groupState) ([]string, bool) {
	if g.mode == Clustering && topic == RetryTopic(g.name) {
		return nil, true
	}
	for _, s := range m.subs {
		if s.Topic == topic {
			return s.Tags, true
		}
	}
	return nil, false
}

// acquireLocked makes sure m holds the lease of ref, taking it if the queue
// is assigned to m and free.
func (c *Coordinator) acquireLocked(g *groupState, m *member, ref QueueRef, now time.Time) error {
	l := g.leases[ref]
	if l != nil && l.owner == m.id {
		if l.revokedAt.IsZero() {
			l.expires = now.Add(c.opts.HeartbeatTimeout)
			return nil
		}
		return fmt.Errorf("%w: %s was reassigned; finish, commit and release it", ErrNotAssigned, ref)
	}
	if !slices.Contains(g.assign[m.id], ref) {
		return fmt.Errorf("%w: %s", ErrNotAssigned, ref)
	}
	if l != nil {
		if now.Before(l.expires) {
			return fmt.Errorf("%w: %s held by %s", ErrQueueBusy, ref, l.owner)
		}
		c.logLeaseLocked(LeaseEvent{Time: now, Group: g.name, Queue: ref, Client: l.owner, Kind: LeaseExpired})
	}
	g.leases[ref] = &lease{owner: m.id, expires: now.Add(c.opts.HeartbeatTimeout)}
	c.logLeaseLocked(LeaseEvent{Time: now, Group: g.name, Queue: ref, Client: m.id, Kind: LeaseAcquired})
	return nil
}

// offsetGroup is the name offsets are committed under: the group, or in
// broadcast mode the group and member, each member having its own progress.
func offsetGroup(g *groupState, clientID string) string {
	if g.mode == Broadcast {
		return g.name + "@" + clientID
	}
	return g.name
}

// Commit records the member's progress in a queue: offset is the next
// message it wants. In clustering mode only the lease holder may commit.
func (c *Coordinator) Commit(ctx context.Context, group, clientID string, ref QueueRef, offset int64) error {
	c.mu.Lock()
	g, m, err := c.memberLocked(group, clientID)
	if err != nil {
		c.mu.Unlock()
		return err
	}
	if g.mode == Clustering {
		l := g.leases[ref]
		if l == nil || l.owner != m.id || !c.opts.Now().Before(l.expires) {
			c.mu.Unlock()
			return fmt.Errorf("%w: %s does not hold the lease of %s", ErrNotAssigned, clientID, ref)
		}
	}
	key := offsetGroup(g, clientID)
	g.lastCommit[ref] = c.opts.Now()
	traced := len(g.traced) > 0
	c.mu.Unlock()
	if err := c.b.CommitOffset(ctx, key, ref.Topic, ref.Queue, offset); err != nil {
		return fmt.Errorf("commit %s for %s: %w", ref, group, err)
	}
	if traced {
		c.traceCommitted(group, clientID, key, ref, offset)
	}
	return nil
}

// ResetTarget says where ResetOffsets moves a group.
type ResetTarget struct {
	// Time, when set, moves to the first message stored at or after it.
	Time time.Time
	// Latest moves to the end (skip the backlog); otherwise, with no Time,
	// to the earliest retained message.
	Latest bool
}

// ResetOffsets moves the group's committed offsets on every queue of topic
// and tells the members holding those queues to continue from there. In
// broadcast mode it moves the offsets of the members that are live now.
// It returns the new offset of each queue.
func (c *Coordinator) ResetOffsets(ctx context.Context, group, topic string, to ResetTarget) ([]int64, error) {
	if err := validateID("group", group); err != nil {
		return nil, err
	}
	info, err := c.b.Topic(ctx, topic)
	if err != nil {
		return nil, err
	}
	offs := make([]int64, len(info.Ranges))
	for q := range offs {
		switch {
		case !to.Time.IsZero():
			offs[q], err = c.b.OffsetAt(ctx, topic, q, to.Time)
			if err != nil {
				return nil, err
			}
		case to.Latest:
			offs[q] = info.Ranges[q].Max
		default:
			offs[q] = info.Ranges[q].Min
		}
	}
	c.mu.Lock()
	keys := []string{group}
	g := c.groups[group]
	if g != nil && g.mode == Broadcast {
		keys = keys[:0]
		for id := range g.members {
			keys = append(keys, offsetGroup(g, id))
		}
	}
	c.mu.Unlock()
	for _, key := range keys {
		for q, off := range offs {
			if err := c.b.CommitOffset(ctx, key, topic, q, off); err != nil {
				return nil, err
			}
		}
	}
	c.mu.Lock()
	if g := c.groups[group]; g != nil {
		for q := range offs {
			g.resetGen[QueueRef{topic, q}]++
		}
		g.forgetTopicLocked(topic) // delivered again from the new offsets if need be
	}
	c.mu.Unlock()
	c.gate.Forget("", topic) // offsets moved back: barriers seen open must be looked at again
	c.log.Info().Str("group", group).Str("topic", topic).Time("to_time", to.Time).Bool("latest", to.Latest).Msg("offsets reset")
	return offs, nil
}

// QueueLag is a group's progress on one queue.
type QueueLag struct {
	Queue QueueRef
	// Committed is the committed offset, -1 if the group never committed.
	Committed int64
	Range     core.QueueRange
	// Lag is how many messages are not yet committed.
	Lag          int64
	LastConsumed time.Time
	// Owner is the member holding the queue's lease (clustering).
	Owner string
}

// Lag reports the group's progress on every queue of the topics its live
// members subscribe to (and its retry topic). In broadcast mode the offsets
// are those of member (empty: the group's own, which broadcast groups do not
// use).
func (c *Coordinator) Lag(ctx context.Context, group, member string) ([]QueueLag, error) {
	c.mu.Lock()
	g := c.groups[group]
	if g == nil {
		c.mu.Unlock()
		return nil, fmt.Errorf("%w: no live members in %s", ErrUnknownMember, group)
	}
	topics := map[string]bool{}
	for _, m := range g.members {
		for _, s := range m.subs {
			topics[s.Topic] = true
		}
	}
	if g.mode == Clustering {
		topics[RetryTopic(group)] = true
	}
	key := group
	if member != "" {
		key = offsetGroup(g, member)
	}
	owners := map[QueueRef]string{}
	for ref, l := range g.leases {
		owners[ref] = l.owner
	}
	last := map[QueueRef]time.Time{}
	for ref, t := range g.lastCommit {
		last[ref] = t
	}
	c.mu.Unlock()

	names := make([]string, 0, len(topics))
	for t := range topics {
		names = append(names, t)
	}
	sort.Strings(names)
	var out []QueueLag
	for _, t := range names {
		info, err := c.b.Topic(ctx, t)
		if errors.Is(err, core.ErrTopicNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for q, r := range info.Ranges {
			ref := QueueRef{t, q}
			ql := QueueLag{Queue: ref, Committed: -1, Range: r, LastConsumed: last[ref], Owner: owners[ref]}
			off, err := c.b.CommittedOffset(ctx, key, t, q)
			switch {
			case err == nil:
				ql.Committed = off
			case errors.Is(err, core.ErrNoCommittedOffset):
				off = r.Min
			default:
				return nil, err
			}
			if ql.Lag, err = c.b.Backlog(ctx, t, q, off); err != nil {
				return nil, err
			}
			out = append(out, ql)
		}
	}
	return out, nil
}

// LeaseKind is what happened to a lease.
type LeaseKind string

const (
	LeaseAcquired LeaseKind = "acquired"
	LeaseReleased LeaseKind = "released"
	LeaseExpired  LeaseKind = "expired"
)

// LeaseEvent is one entry of the lease log, kept so that operators (and
// tests) can check that no queue was ever held by two members at once.
type LeaseEvent struct {
	Time   time.Time
	Group  string
	Queue  QueueRef
	Client string
	Kind   LeaseKind
}

func (c *Coordinator) logLeaseLocked(e LeaseEvent) {
	if len(c.events) == 0 {
		return
	}
	c.events[c.evNext] = e
	c.evNext = (c.evNext + 1) % len(c.events)
	if c.evNext == 0 {
		c.evFull = true
	}
}

// LeaseLog returns the lease events still in the log, oldest first.
func (c *Coordinator) LeaseLog() []LeaseEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.evFull {
		return slices.Clone(c.events[:c.evNext])
	}
	return append(slices.Clone(c.events[c.evNext:]), c.events[:c.evNext]...)
}

// CheckLeaseLog replays lease events and reports the first time a queue was
// acquired while another member still held it. Operators and tests use it
// to verify the one-holder guarantee.
func CheckLeaseLog(events []LeaseEvent) error {
	type key struct {
		group string
		ref   QueueRef
	}
	holder := map[key]string{}
	for _, e := range events {
		k := key{e.Group, e.Queue}
		switch e.Kind {
		case LeaseAcquired:
			if h, ok := holder[k]; ok && h != e.Client {
				return fmt.Errorf("%s: %s acquired %s while %s held it", e.Time.Format(time.RFC3339Nano), e.Client, e.Queue, h)
			}
			holder[k] = e.Client
		case LeaseReleased, LeaseExpired:
			if holder[k] == e.Client {
				delete(holder, k)
			}
		}
	}
	return nil
}
