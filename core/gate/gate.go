// Package gate applies the epoch barrier of resized topics (core.Gate) for
// a consumer of a core.Broker: it caches each topic's epochs and, per
// group, the queues whose barriers it has seen open, so a topic never
// resized costs a map lookup per read and a resized one a few committed
// offset lookups until its barriers open.
//
// A reader reads through Read, which asks Until, passes the answer as
// core.ReadRequest.Until and, when the engine knew of an epoch the gate did
// not (the topic was resized since), refreshes the topic's epochs and reads
// again behind them.
// A group whose offsets move back (a reset) must be forgotten (Forget):
// barriers seen open are only remembered while offsets move forward.
//
// A Gate is safe for concurrent use.
package gate

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/ferrymq/ferrymq/core"
)

// Gate holds a topic's messages of a new epoch back from a group until the
// group is done with the older queues those keys came from.
type Gate struct {
	b core.Broker

	mu     sync.Mutex
	epochs map[string][]core.Epoch
	open   map[openKey]int // barriers open up to this many epochs
}

type openKey struct {
	group, topic string
	queue        int
}

// New returns a Gate reading topics and committed offsets from b.
func New(b core.Broker) *Gate {
	return &Gate{b: b, epochs: map[string][]core.Epoch{}, open: map[openKey]int{}}
}

// Until returns how far group may read queue of topic: no message at or
// above it may be delivered (-1: no limit; a limit at or below the group's
// position means the queue waits). Group is the name offsets are committed
// under. start tells where the group would start a queue it never
// committed (nil: the oldest message).
func (g *Gate) Until(ctx context.Context, group, topic string, queue int, start func(queue int) (int64, error)) (int64, error) {
	until, _, err := g.until(ctx, group, topic, queue, start)
	return until, err
}

// until is Until, also returning how many epochs the limit was computed
// from: a read that reports more must be read again behind a new limit,
// however many epochs the gate knows of by then (another reader may have
// refreshed them in between).
func (g *Gate) until(ctx context.Context, group, topic string, queue int, start func(queue int) (int64, error)) (int64, int, error) {
	epochs, err := g.topicEpochs(ctx, topic)
	if err != nil || len(epochs) < 2 {
		return -1, len(epochs), err
	}
	k := openKey{group, topic, queue}
	g.mu.Lock()
	known := g.open[k]
	g.mu.Unlock()
	if known == len(epochs) {
		return -1, known, nil
	}
	if start == nil {
		start = func(int) (int64, error) { return 0, nil }
	}
	var ranges []core.QueueRange // read once, if needed
	until, err := core.Gate(epochs, queue, func(p int) (int64, error) {
		off, err := g.b.CommittedOffset(ctx, group, topic, p)
		if errors.Is(err, core.ErrNoCommittedOffset) {
			off, err = start(p)
		}
		if err != nil {
			return 0, err
		}
		// Messages retention removed are nothing to wait for.
		if ranges == nil {
			info, err := g.b.Topic(ctx, topic)
			if err != nil {
				return 0, err
			}
			ranges = info.Ranges
		}
		if p >= len(ranges) {
			return math.MaxInt64, nil // a retired queue that retention emptied: nothing to wait for
		}
		return max(off, ranges[p].Min), nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("gate %s/%d for %s: %w", topic, queue, group, err)
	}
	if until < 0 {
		g.mu.Lock()
		g.open[k] = len(epochs)
		g.mu.Unlock()
	}
	return until, len(epochs), nil
}

// Read reads req for group behind the topic's barriers. held is true, and
// nothing is read, when the queue's next messages wait at a barrier for
// the group's commits in other queues. start is as for Until.
func (g *Gate) Read(ctx context.Context, group string, req core.ReadRequest, start func(queue int) (int64, error)) (res core.ReadResult, held bool, err error) {
	for {
		until, seen, err := g.until(ctx, group, req.Topic, req.Queue, start)
		if err != nil {
			return core.ReadResult{}, false, err
		}
		if until >= 0 && req.Offset >= until {
			return core.ReadResult{NextOffset: req.Offset}, true, nil
		}
		req.Until = max(until, 0)
		res, err := g.b.Read(ctx, req)
		if err != nil {
			return res, false, err
		}
		if res.Epochs <= seen {
			return res, false, nil
		}
		// Resized since the limit was computed: read again behind the new
		// barriers. Compared with the epochs the limit saw, not with those
		// the gate knows now: another reader may have refreshed them
		// meanwhile, and this read was still made without their barriers.
		if res.Release != nil {
			res.Release() // read again: nobody sees these
		}
		if _, err := g.Stale(ctx, req.Topic, res.Epochs); err != nil {
			return core.ReadResult{}, false, err
		}
	}
}

// Stale reports whether a read that saw epochs epochs of topic was read
// with fewer in view; it then refreshes them, and the read must be done
// again with a new Until.
func (g *Gate) Stale(ctx context.Context, topic string, epochs int) (bool, error) {
	g.mu.Lock()
	have := len(g.epochs[topic])
	g.mu.Unlock()
	if epochs <= have {
		return false, nil
	}
	if err := g.refresh(ctx, topic); err != nil {
		return false, err
	}
	return true, nil
}

// Forget drops what is remembered of group's barriers on topic: its
// offsets there moved back. An empty group or topic stands for all.
func (g *Gate) Forget(group, topic string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for k := range g.open {
		if (topic == "" || k.topic == topic) && (group == "" || k.group == group) {
			delete(g.open, k)
		}
	}
}

// topicEpochs returns the topic's epochs as the gate knows them.
func (g *Gate) topicEpochs(ctx context.Context, topic string) ([]core.Epoch, error) {
	g.mu.Lock()
	e, ok := g.epochs[topic]
	g.mu.Unlock()
	if ok {
		return e, nil
	}
	if err := g.refresh(ctx, topic); err != nil {
		return nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.epochs[topic], nil
}

func (g *Gate) refresh(ctx context.Context, topic string) error {
	info, err := g.b.Topic(ctx, topic)
	if errors.Is(err, core.ErrTopicNotFound) {
		info, err = core.TopicInfo{}, nil // nothing to hold back; a read that finds it says so (Stale)
	}
	if err != nil {
		return fmt.Errorf("gate: epochs of %s: %w", topic, err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.epochs[topic] = info.Epochs
	return nil
}
