package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/wire"
)

// A push consumer's long poll of a queue is a stream (wire.GroupPullReq
// Stream): the request stays open across its answers, the server sending
// each message as it arrives, up to the request's Max, and Pull takes the
// next answer from the stream while it is where the consumer asks to read.
// At one message per arrival — a consumer keeping up with a moderate rate
// — that is one request per Max messages instead of one per message: one
// read, one decode, one park and three goroutine hand-offs less per
// message on the server. The stream holds no more than one pull would
// (Max messages), and a consumer that asks for another offset (a reset, a
// smaller batch's remainder aside) abandons it and opens another.

// errStreamOverflow: the server sent more answers than the stream allows.
var errStreamOverflow = errors.New("client: pull stream sent more answers than it may")

type streamKey struct {
	group, clientID, topic string
	queue                  int
}

// pullStream is one open streaming pull. Only the worker that pulls its
// queue touches it, besides the reader's sends to answers.
type pullStream struct {
	s       *session
	id      uint64
	answers chan streamAnswer // at most Max answers, and the cancel's
	next    int64             // the offset the next answer starts at
	ended   bool              // its last answer was taken
	rest    *group.PullResult // what a smaller Max left of the last answer
}

type streamAnswer struct {
	res      result
	last     bool
	overflow bool
}

// Pull returns the queue's next messages, waiting up to req.Wait.
func (r *remoteGroups) Pull(ctx context.Context, req group.PullRequest) (group.PullResult, error) {
	if req.Wait <= 0 {
		return r.pullOnce(ctx, req)
	}
	k := streamKey{group: req.Group, clientID: req.ClientID, topic: req.Queue.Topic, queue: req.Queue.Queue}
	r.mu.Lock()
	st := r.streams[k]
	r.mu.Unlock()
	// take forgets a stream once its last answer is handed over, so a
	// stream still here is open, or has a part of its last answer left.
	if st != nil && st.next != req.Offset {
		r.closeStream(k)
		st = nil
	}
	if st == nil {
		var err error
		if st, err = r.openStream(ctx, k, req); err != nil {
			return group.PullResult{}, err
		}
	}
	res, err := r.take(ctx, k, st, req)
	if addr, moved := wire.MovedTo(err); moved && r.c.parent == nil {
		// The group is served by another node (route.go): stream from there.
		if _, ferr := r.c.follow(ctx, req.Group, addr); ferr != nil {
			return group.PullResult{}, fmt.Errorf("%w; following it: %w", err, ferr)
		}
		if st, err = r.openStream(ctx, k, req); err != nil {
			return group.PullResult{}, err
		}
		return r.take(ctx, k, st, req)
	}
	return res, err
}

func (r *remoteGroups) openStream(ctx context.Context, k streamKey, req group.PullRequest) (*pullStream, error) {
	max := req.Max
	if max <= 0 {
		max = group.DefaultPullMax
	}
	b, err := jsonBytes(wire.GroupPullReq{Group: req.Group, ClientID: req.ClientID, Topic: req.Queue.Topic, Queue: req.Queue.Queue,
		Offset: req.Offset, Max: req.Max, WaitMS: req.Wait.Milliseconds(), Stream: true})
	if err != nil {
		return nil, err
	}
	st := &pullStream{answers: make(chan streamAnswer, max+1), next: req.Offset}
	put := func(a streamAnswer) {
		select {
		case st.answers <- a:
		default: // a server that ignores Max: end the stream at the next take
			select {
			case st.answers <- streamAnswer{overflow: true}:
			default:
			}
		}
	}
	st.s, st.id, err = r.c.routeOf(req.Group).send(ctx, wire.OpGroupPull, b, 0,
		func(res result) { put(streamAnswer{res: res}) },
		func(res result) { put(streamAnswer{res: res, last: true}) })
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.streams[k] = st
	r.mu.Unlock()
	return st, nil
}

// take returns the stream's next answer, or the part of it req.Max allows.
func (r *remoteGroups) take(ctx context.Context, k streamKey, st *pullStream, req group.PullRequest) (group.PullResult, error) {
	if st.rest == nil {
		// The server answers by req.Wait at the latest (an empty last
		// answer); the request timeout on top is for a server that died.
		t := time.NewTimer(req.Wait + r.c.opts.RequestTimeout)
		var a streamAnswer
		select {
		case a = <-st.answers:
			t.Stop()
		case <-t.C:
			r.closeStream(k)
			return group.PullResult{}, fmt.Errorf("pull %s/%d: no answer within %v: %w", k.topic, k.queue, req.Wait+r.c.opts.RequestTimeout, context.DeadlineExceeded)
		case <-ctx.Done():
			t.Stop()
			return group.PullResult{}, ctx.Err()
		}
		if a.overflow {
			r.closeStream(k)
			return group.PullResult{}, errStreamOverflow
		}
		if a.last {
			st.ended = true
		}
		if a.res.err != nil {
			r.closeStream(k)
			return group.PullResult{}, a.res.err
		}
		res, err := wire.DecodePull(a.res.payload)
		if err != nil {
			r.closeStream(k)
			return group.PullResult{}, err
		}
		st.rest = &group.PullResult{Messages: res.Messages, Offset: res.Offset, NextOffset: res.NextOffset, Reset: res.Reset, Range: res.Range}
	}
	p := *st.rest
	st.rest = nil
	if req.Max > 0 && len(p.Messages) > req.Max {
		rest := p
		rest.Messages, rest.Reset = p.Messages[req.Max:], false
		rest.Offset = rest.Messages[0].QueueOffset
		p.Messages, p.NextOffset = p.Messages[:req.Max], rest.Offset
		st.rest = &rest
	}
	st.next = p.NextOffset
	if st.ended && st.rest == nil {
		r.closeStream(k)
	}
	return p, nil
}

// closeStream forgets the queue's stream, cancelling it if it is open (the
// server ends it at its credit or wait; its answers are dropped).
func (r *remoteGroups) closeStream(k streamKey) {
	r.mu.Lock()
	st := r.streams[k]
	delete(r.streams, k)
	r.mu.Unlock()
	if st != nil && !st.ended {
		st.s.cancelCall(st.id)
	}
}

// closeStreams closes every stream of a group member.
func (r *remoteGroups) closeStreams(group, clientID string) {
	r.mu.Lock()
	var ks []streamKey
	for k := range r.streams {
		if k.group == group && k.clientID == clientID {
			ks = append(ks, k)
		}
	}
	r.mu.Unlock()
	for _, k := range ks {
		r.closeStream(k)
	}
}
