package group

import (
	"slices"
	"sort"
	"strconv"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/trace"
)

// maxTracedPerQueue bounds the traced messages a Coordinator remembers as
// delivered but not yet committed, per queue and offset group (the group, or
// group@member in broadcast mode). Beyond it the oldest are forgotten: their
// committed hop is not recorded.
const maxTracedPerQueue = 4096

// Attribute names of the hops the Coordinator records.
const (
	attrGroup     = "group"
	attrMember    = "member"
	attrTopic     = "topic"
	attrQueue     = "queue"
	attrOffset    = "offset"
	attrMode      = "mode"
	attrAttempt   = "attempt"
	attrCommitted = "committed"
)

// tracedMsg is a traced message delivered and not yet committed.
type tracedMsg struct {
	offset int64
	id     core.MessageID // the ID it is traced under (trace.IDOf)
}

// tracedKey names the messages of one queue delivered under one offset group.
type tracedKey struct {
	key string // offsetGroup
	ref QueueRef
}

// tracedQueue holds the traced messages delivered from one queue and not
// yet committed past, in increasing offset order, at most limit of them
// (adding to a full one drops the oldest). A delivery at or below the
// newest remembered offset means the position moved back (a reset, a new
// lease holder starting from the committed offset): the remembered messages
// from that offset on are replaced. Not safe for concurrent use: the
// Coordinator guards it with its mu.
type tracedQueue struct {
	msgs  []tracedMsg // msgs[head:] are remembered
	head  int
	limit int
}

func newTracedQueue(limit int) *tracedQueue { return &tracedQueue{limit: limit} }

// len is the number of remembered messages.
func (q *tracedQueue) len() int { return len(q.msgs) - q.head }

// add remembers m.
func (q *tracedQueue) add(m tracedMsg) {
	live := q.msgs[q.head:]
	if n := len(live); n > 0 && live[n-1].offset >= m.offset {
		i := sort.Search(n, func(i int) bool { return live[i].offset >= m.offset })
		q.msgs = q.msgs[:q.head+i]
	}
	if q.len() >= q.limit {
		q.head++
	}
	q.msgs = append(q.msgs, m)
	q.compact()
}

// take forgets and returns the remembered messages below offset.
func (q *tracedQueue) take(offset int64) []tracedMsg {
	live := q.msgs[q.head:]
	i := sort.Search(len(live), func(i int) bool { return live[i].offset >= offset })
	if i == 0 {
		return nil
	}
	out := slices.Clone(live[:i])
	q.head += i
	q.compact()
	return out
}

// compact moves the remembered messages to the front once the forgotten
// ones take half the slice, so its capacity stays within twice the limit.
func (q *tracedQueue) compact() {
	switch {
	case q.head == len(q.msgs):
		q.msgs, q.head = q.msgs[:0], 0
	case q.head > 0 && 2*q.head >= len(q.msgs):
		n := copy(q.msgs, q.msgs[q.head:])
		q.msgs, q.head = q.msgs[:n], 0
	}
}

// rememberLocked keeps msgs, delivered from ref under offset group key,
// until a commit passes them.
func (g *groupState) rememberLocked(key string, ref QueueRef, msgs []tracedMsg) {
	if g.traced == nil {
		g.traced = map[tracedKey]*tracedQueue{}
	}
	k := tracedKey{key, ref}
	q := g.traced[k]
	if q == nil {
		q = newTracedQueue(maxTracedPerQueue)
		g.traced[k] = q
	}
	for _, m := range msgs {
		q.add(m)
	}
}

// committedLocked forgets and returns the messages of ref delivered under
// key below offset.
func (g *groupState) committedLocked(key string, ref QueueRef, offset int64) []tracedMsg {
	k := tracedKey{key, ref}
	q := g.traced[k]
	if q == nil {
		return nil
	}
	out := q.take(offset)
	if q.len() == 0 {
		delete(g.traced, k)
	}
	return out
}

// forgetTopicLocked drops what is remembered for topic (every queue and member).
func (g *groupState) forgetTopicLocked(topic string) {
	for k := range g.traced {
		if k.ref.Topic == topic {
			delete(g.traced, k)
		}
	}
}

// forgetMemberLocked drops what a broadcast member that left was delivered
// (in clustering mode the group's queues carry on with another member).
func (g *groupState) forgetMemberLocked(clientID string) {
	if g.mode != Broadcast || len(g.traced) == 0 {
		return
	}
	key := offsetGroup(g, clientID)
	for k := range g.traced {
		if k.key == key {
			delete(g.traced, k)
		}
	}
}

// traceDelivered records the delivered hop of the traced messages a pull
// returns and remembers them for their committed hop. It takes c.mu only
// when there is something to remember.
func (c *Coordinator) traceDelivered(req PullRequest, key string, mode Mode, msgs []*core.StoredMessage) {
	rec := c.opts.Trace
	if rec == nil || len(msgs) == 0 {
		return
	}
	var traced []tracedMsg
	for _, m := range msgs {
		if !rec.Enabled(trace.TopicOf(m)) {
			continue
		}
		id := trace.IDOf(m)
		traced = append(traced, tracedMsg{offset: m.QueueOffset, id: id})
		rec.Record(trace.Event{ID: id, Hop: trace.HopDelivered, Actor: req.Group + "/" + req.ClientID, Attrs: map[string]string{
			attrGroup: req.Group, attrMember: req.ClientID, attrTopic: req.Queue.Topic, attrQueue: strconv.Itoa(req.Queue.Queue),
			attrOffset: strconv.FormatInt(m.QueueOffset, 10), attrMode: string(mode), attrAttempt: strconv.Itoa(m.ReconsumeCount + 1),
		}})
	}
	if len(traced) == 0 {
		return
	}
	c.mu.Lock()
	if g := c.groups[req.Group]; g != nil {
		g.rememberLocked(key, req.Queue, traced)
	}
	c.mu.Unlock()
}

// traceCommitted records the committed hop of the remembered messages of
// ref below offset, and forgets them.
func (c *Coordinator) traceCommitted(group, clientID, key string, ref QueueRef, offset int64) {
	c.mu.Lock()
	var done []tracedMsg
	if g := c.groups[group]; g != nil {
		done = g.committedLocked(key, ref, offset)
	}
	c.mu.Unlock()
	rec := c.opts.Trace
	for _, m := range done {
		rec.Record(trace.Event{ID: m.id, Hop: trace.HopCommitted, Actor: group + "/" + clientID, Attrs: map[string]string{
			attrGroup: group, attrMember: clientID, attrTopic: ref.Topic, attrQueue: strconv.Itoa(ref.Queue),
			attrOffset: strconv.FormatInt(m.offset, 10), attrCommitted: strconv.FormatInt(offset, 10),
		}})
	}
}
