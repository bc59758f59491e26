package client

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/consumer"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/retry"
	"github.com/ferrymq/ferrymq/core/wire"
)

func jsonBytes(v any) ([]byte, error) { return json.Marshal(v) }

// mustJSON marshals a request struct, which cannot fail.
func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// withWait gives a long poll a deadline of its wait plus the request timeout.
func withWait(ctx context.Context, c *Client, wait time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, wait+c.opts.RequestTimeout)
}

// NewPushConsumer returns a push consumer that runs the same runtime as an
// in-process one (core/consumer: clustering or broadcast, concurrent or
// orderly listeners, retries, commits), talking to the server's group
// coordinator over this client. opts.ClientID defaults to the client's.
// Close(ctx) on the consumer commits and leaves the group.
func (c *Client) NewPushConsumer(opts consumer.Options) (*consumer.PushConsumer, error) {
	if opts.ClientID == "" {
		opts.ClientID = c.opts.ClientID
	}
	return consumer.NewPushConsumer(&remoteGroups{c: c, streams: map[streamKey]*pullStream{}}, remoteRetry{c}, opts)
}

// remoteGroups implements consumer.Coordinator over the wire. Its long
// polls are streams (pullstream.go).
type remoteGroups struct {
	c *Client

	mu      sync.Mutex
	streams map[streamKey]*pullStream
}

func (r *remoteGroups) Heartbeat(ctx context.Context, req group.HeartbeatRequest) (group.Assignment, error) {
	w := wire.HeartbeatReq{Group: req.Group, ClientID: req.ClientID, Mode: string(req.Mode), From: string(req.From)}
	if !req.FromTime.IsZero() {
		w.FromTimeMS = req.FromTime.UnixMilli()
	}
	for _, s := range req.Subscriptions {
		w.Subscriptions = append(w.Subscriptions, wire.Subscription{Topic: s.Topic, Tags: s.Tags})
	}
	var a wire.Assignment
	if err := r.c.callShardJSON(ctx, req.Group, wire.OpHeartbeat, w, &a); err != nil {
		return group.Assignment{}, err
	}
	out := group.Assignment{Version: a.Version}
	for _, q := range a.Queues {
		out.Queues = append(out.Queues, group.QueueRef{Topic: q.Topic, Queue: q.Queue})
	}
	return out, nil
}

// pullOnce is a pull that is answered once (one that does not wait).
func (r *remoteGroups) pullOnce(ctx context.Context, req group.PullRequest) (group.PullResult, error) {
	b, err := jsonBytes(wire.GroupPullReq{Group: req.Group, ClientID: req.ClientID, Topic: req.Queue.Topic, Queue: req.Queue.Queue,
		Offset: req.Offset, Max: req.Max, WaitMS: req.Wait.Milliseconds()})
	if err != nil {
		return group.PullResult{}, err
	}
	ctx, cancel := withWait(ctx, r.c, req.Wait)
	defer cancel()
	p, err := r.c.callShard(ctx, req.Group, wire.OpGroupPull, b)
	if err != nil {
		return group.PullResult{}, err
	}
	res, err := wire.DecodePull(p)
	if err != nil {
		return group.PullResult{}, err
	}
	return group.PullResult{Messages: res.Messages, Offset: res.Offset, NextOffset: res.NextOffset, Reset: res.Reset, Range: res.Range}, nil
}

func (r *remoteGroups) Commit(ctx context.Context, g, clientID string, ref group.QueueRef, offset int64) error {
	return r.c.callShardJSON(ctx, g, wire.OpCommit, wire.CommitReq{Group: g, ClientID: clientID, Topic: ref.Topic, Queue: ref.Queue, Offset: offset}, nil)
}

func (r *remoteGroups) Release(ctx context.Context, g, clientID string, ref group.QueueRef) error {
	r.closeStream(streamKey{group: g, clientID: clientID, topic: ref.Topic, queue: ref.Queue})
	return r.c.callShardJSON(ctx, g, wire.OpRelease, wire.CommitReq{Group: g, ClientID: clientID, Topic: ref.Topic, Queue: ref.Queue}, nil)
}

func (r *remoteGroups) Leave(ctx context.Context, g, clientID string) error {
	r.closeStreams(g, clientID)
	return r.c.callShardJSON(ctx, g, wire.OpLeave, wire.CommitReq{Group: g, ClientID: clientID}, nil)
}

// remoteRetry implements consumer.Retrier over the wire.
type remoteRetry struct{ c *Client }

func (r remoteRetry) SendBack(ctx context.Context, g string, m *core.StoredMessage, reason string) (retry.Outcome, error) {
	var out wire.SendBackReply
	if err := r.c.callShardJSON(ctx, g, wire.OpSendBack, wire.SendBackReq{Group: g, ID: m.ID.String(), Reason: reason}, &out); err != nil {
		return 0, err
	}
	if out.Outcome == retry.DeadLettered.String() {
		return retry.DeadLettered, nil
	}
	return retry.Scheduled, nil
}

func (r remoteRetry) DeadLetter(ctx context.Context, g string, m *core.StoredMessage, reason string) error {
	return r.c.callShardJSON(ctx, g, wire.OpDeadLetter, wire.SendBackReq{Group: g, ID: m.ID.String(), Reason: reason, Reconsume: m.ReconsumeCount}, nil)
}

// SimpleConsumer consumes by POP: the server picks the messages, each
// comes with a receipt handle and stays invisible to others until it is
// acknowledged or its invisible time runs out.
type SimpleConsumer struct {
	c     *Client
	group string
	topic string
	// Invisible is the invisible time of received messages; 0 means the
	// server's default (60 s).
	Invisible time.Duration
	// Orderly keeps each queue's order (one message of a queue at a time).
	Orderly bool
	Tags    []string
}

// NewSimpleConsumer returns a POP consumer of topic for group.
func (c *Client) NewSimpleConsumer(group, topic string) *SimpleConsumer {
	return &SimpleConsumer{c: c, group: group, topic: topic}
}

// Received is a popped message.
type Received struct {
	*core.StoredMessage
	Handle  string
	Attempt int
}

// Receive pops up to max messages, waiting up to wait for some to arrive.
func (s *SimpleConsumer) Receive(ctx context.Context, max int, wait time.Duration) ([]Received, error) {
	b, err := jsonBytes(wire.PopReq{Group: s.group, Topic: s.topic, Max: max, InvisibleMS: s.Invisible.Milliseconds(),
		WaitMS: wait.Milliseconds(), Orderly: s.Orderly, Tags: s.Tags})
	if err != nil {
		return nil, err
	}
	ctx, cancel := withWait(ctx, s.c, wait)
	defer cancel()
	p, err := s.c.callShard(ctx, s.group, wire.OpPop, b)
	if err != nil {
		return nil, err
	}
	ps, err := wire.DecodePopped(p)
	if err != nil {
		return nil, err
	}
	out := make([]Received, len(ps))
	for i, p := range ps {
		out[i] = Received{StoredMessage: p.Message, Handle: p.Handle, Attempt: p.Attempt}
	}
	return out, nil
}

// Ack marks a received message consumed.
func (s *SimpleConsumer) Ack(ctx context.Context, handle string) error {
	return s.c.callShardJSON(ctx, s.group, wire.OpAck, wire.HandleReq{Handle: handle}, nil)
}

// ChangeInvisibleTime gives a received message d more invisible time from
// now and returns its new handle (the old one stops working).
func (s *SimpleConsumer) ChangeInvisibleTime(ctx context.Context, handle string, d time.Duration) (string, error) {
	var out wire.HandleReq
	err := s.c.callShardJSON(ctx, s.group, wire.OpChangeInvis, wire.HandleReq{Handle: handle, InvisibleMS: d.Milliseconds()}, &out)
	return out.Handle, err
}
