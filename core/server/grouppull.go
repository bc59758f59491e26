package server

import (
	"context"
	"time"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/wire"
)

// groupPull answers OpGroupPull. A pull that finds nothing and may wait is
// parked; a streaming one (r.Stream) goes on after each answer that moved
// it, parked again where that answer ended, until it has sent r.Max
// messages or r.Max answers (see wire.GroupPullReq). Each further answer
// takes an in-flight slot of its own, so the connection's bound on queued
// responses holds; when none is free the answer in hand is the stream's
// last, and the client opens another.
func (c *conn) groupPull(f wire.Frame, r wire.GroupPullReq) ([]byte, error) {
	svc, err := c.s.services(c.ctx, r.Group)
	if err != nil {
		return nil, err
	}
	s := &groupStream{pull: svc.Groups.Pull,
		req: group.PullRequest{Group: r.Group, ClientID: r.ClientID, Queue: group.QueueRef{Topic: r.Topic, Queue: r.Queue},
			Offset: r.Offset, Max: r.Max}}
	first, err := s.pull(c.ctx, s.req)
	if err != nil {
		return nil, err
	}
	moved := len(first.Messages) > 0 || (r.Offset >= 0 && first.NextOffset != r.Offset)
	stream := r.Stream && r.WaitMS > 0 && f.Flags&wire.FlagNoReply == 0
	if r.WaitMS <= 0 || moved && !stream {
		return encodeFirst(first)
	}
	s.left = r.Max
	if s.left <= 0 {
		s.left = group.DefaultPullMax
	}
	s.answers = s.left
	s.req.Offset, s.rng = first.NextOffset, first.Range
	p := &held{c: c, f: f, wait: c.waitFor(r.WaitMS), try: s.try}
	if stream {
		p.more = s.more
	}
	if heads, ok := c.s.opts.Broker.(core.QueueHeads); ok {
		// The coordinator reads the server's broker: its offsets are the
		// queue's own, so a queue that ends where the poll stands has
		// nothing for it.
		p.idle = func() bool {
			head, ok := heads.QueueHead(r.Topic, r.Queue)
			return ok && head <= s.req.Offset
		}
	}
	if moved {
		payload, err := encodeFirst(first)
		if err != nil {
			return nil, err
		}
		s.sent(first)
		if !s.goesOn() || !c.reserve() {
			return payload, nil
		}
		c.replyMore(f, payload, false)
	} else if first.Reset {
		s.reset, s.resetFrom = true, first.Offset // the answer that ends the wait says so
	}
	p.empty = s.empty()
	p.deadline = time.Now().Add(p.wait)
	c.s.hold.park(r.Topic, r.Group, p)
	return nil, errParked
}

// encodeFirst encodes a pull's first answer and gives its read's memory
// back.
func encodeFirst(first group.PullResult) ([]byte, error) {
	b, err := wire.EncodePull(pullAnswer(first, first.Reset, first.Offset))
	if first.Release != nil {
		first.Release()
	}
	return b, err
}

func pullAnswer(p group.PullResult, reset bool, start int64) wire.PullResult {
	return wire.PullResult{NextOffset: p.NextOffset, Offset: start, Range: p.Range, Reset: reset, Messages: p.Messages}
}

// groupStream is the state of a parked group pull: where its next answer
// starts and, for a stream, what it may still send. Only the goroutine
// holding the poll (the handler, then the holder's) touches it.
type groupStream struct {
	pull func(context.Context, group.PullRequest) (group.PullResult, error)
	req  group.PullRequest // Offset: where the next answer starts
	rng  core.QueueRange   // the queue's range at the last read

	left    int // messages a stream may still send
	answers int // answers it may still send
	// reset: a read that was not sent found the offset reset (retention
	// passed it); the next answer says so, and starts at resetFrom.
	reset     bool
	resetFrom int64
}

// try reads from where the poll stands; ok when that is an answer.
func (s *groupStream) try(ctx context.Context) ([]byte, bool, error) {
	req := s.req
	req.Max = s.left
	p, err := s.pull(ctx, req)
	if err != nil {
		return nil, false, err
	}
	if len(p.Messages) == 0 && p.NextOffset == s.req.Offset && !p.Reset {
		return nil, false, nil
	}
	start := p.Offset
	if s.reset && !p.Reset {
		start = s.resetFrom
	}
	ans := pullAnswer(p, p.Reset || s.reset, start)
	b, err := wire.AppendPull(answerBuf(wire.PullSize(ans)), ans)
	if p.Release != nil {
		p.Release() // the bodies are copied into b
	}
	if err != nil {
		return nil, false, err
	}
	s.reset = false
	s.sent(p)
	return b, true, nil
}

// sent records an answer that went (or goes) out.
func (s *groupStream) sent(p group.PullResult) {
	s.req.Offset, s.rng = p.NextOffset, p.Range
	s.left -= len(p.Messages)
	s.answers--
}

func (s *groupStream) goesOn() bool { return s.left > 0 && s.answers > 0 }

// more is asked after each answer of a stream: whether it goes on, its
// empty answer from where it now stands, and whether the queue already
// holds more than that answer took (a read stops at its byte bound too),
// so the poll is tried again at once instead of at the next arrival.
func (s *groupStream) more() (empty []byte, goesOn, again bool) {
	if !s.goesOn() {
		return nil, false, false
	}
	return s.empty(), true, s.req.Offset < s.rng.Max
}

// empty is the answer when the wait ends with nothing more.
func (s *groupStream) empty() []byte {
	start := s.req.Offset
	if s.reset {
		start = s.resetFrom
	}
	b, _ := wire.EncodePull(wire.PullResult{NextOffset: s.req.Offset, Offset: start, Range: s.rng, Reset: s.reset})
	return b
}
