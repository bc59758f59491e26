package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/pop"
	"github.com/ferrymq/ferrymq/core/wire"
)

// produce appends on the reader goroutine, in arrival order, and answers
// from the engine's callback.
func (c *conn) produce(f wire.Frame) {
	msgs, err := wire.DecodeProduce(f.Payload)
	if err != nil {
		c.fail(f, err)
		return
	}
	rec := c.s.opts.Trace
	at := rec.ProduceStart(msgs)
	c.s.opts.Broker.ProduceAsync(msgs, func(res []core.SendResult, err error) {
		if err != nil {
			c.fail(f, err)
			return
		}
		rec.Produced(c.clientID, c.nc.RemoteAddr().String(), at, msgs, res)
		c.reply(f, wire.EncodeSendResults(res))
	})
}

func decode(f wire.Frame, v any) error {
	if err := json.Unmarshal(f.Payload, v); err != nil {
		return fmt.Errorf("%w: %s: %v", wire.ErrBadPayload, f.Op, err)
	}
	return nil
}

func (c *conn) waitFor(ms int64) time.Duration {
	return min(time.Duration(max(ms, 0))*time.Millisecond, c.s.opts.MaxWait)
}

// handle runs one request on a handler goroutine.
func (c *conn) handle(f wire.Frame) {
	payload, err := c.dispatch(f)
	switch {
	case err == errParked:
		// the holder answers
	case err != nil:
		c.fail(f, err)
	default:
		c.reply(f, payload)
	}
}

// errParked is returned by dispatch for a long poll handed to the holder.
var errParked = errors.New("parked")

func marshal(v any) ([]byte, error) { return json.Marshal(v) }

func (c *conn) dispatch(f wire.Frame) ([]byte, error) {
	ctx := c.ctx
	o := &c.s.opts
	switch f.Op {
	case wire.OpPull:
		var r wire.PullReq
		if err := decode(f, &r); err != nil {
			return nil, err
		}
		// try reads; release gives the read's memory back once its answer
		// is encoded (core.ReadResult.Release).
		try := func(ctx context.Context, off int64) (res wire.PullResult, release func(), err error) {
			rr, err := o.Broker.Read(ctx, core.ReadRequest{Topic: r.Topic, Queue: r.Queue, Offset: off, MaxCount: r.Max, Tags: r.Tags})
			if err != nil {
				return wire.PullResult{}, nil, err
			}
			start := off
			if len(rr.Messages) > 0 {
				start = rr.Messages[0].QueueOffset
			}
			release = rr.Release
			if release == nil {
				release = func() {}
			}
			return wire.PullResult{NextOffset: rr.NextOffset, Offset: start, Range: rr.Range, Clamped: rr.Clamped, Messages: rr.Messages}, release, nil
		}
		first, release, err := try(ctx, r.Offset)
		if err != nil {
			return nil, err
		}
		if len(first.Messages) > 0 || first.NextOffset != r.Offset || r.WaitMS <= 0 {
			defer release()
			return wire.EncodePull(first)
		}
		empty, _ := wire.EncodePull(first)
		release()
		c.s.hold.park(r.Topic, "", &held{c: c, f: f, deadline: time.Now().Add(c.waitFor(r.WaitMS)), empty: empty,
			try: func(ctx context.Context) ([]byte, bool, error) {
				res, release, err := try(ctx, first.NextOffset)
				if err != nil {
					return nil, false, err
				}
				defer release()
				if len(res.Messages) == 0 && res.NextOffset == first.NextOffset {
					return nil, false, nil
				}
				res.Clamped = res.Clamped || first.Clamped
				b, err := wire.EncodePull(res)
				return b, err == nil, err
			}})
		return nil, errParked

	case wire.OpHeartbeat:
		var r wire.HeartbeatReq
		if err := decode(f, &r); err != nil {
			return nil, err
		}
		req := group.HeartbeatRequest{Group: r.Group, ClientID: r.ClientID, Mode: group.Mode(r.Mode), From: group.ConsumeFrom(r.From)}
		if r.FromTimeMS > 0 {
			req.FromTime = time.UnixMilli(r.FromTimeMS)
		}
		for _, s := range r.Subscriptions {
			req.Subscriptions = append(req.Subscriptions, group.Subscription{Topic: s.Topic, Tags: s.Tags})
		}
		svc, err := c.s.services(ctx, r.Group)
		if err != nil {
			return nil, err
		}
		a, err := svc.Groups.Heartbeat(ctx, req)
		if err != nil {
			return nil, err
		}
		out := wire.Assignment{Version: a.Version, Queues: []wire.QueueRef{}}
		for _, q := range a.Queues {
			out.Queues = append(out.Queues, wire.QueueRef{Topic: q.Topic, Queue: q.Queue})
		}
		return marshal(out)

	case wire.OpGroupPull:
		var r wire.GroupPullReq
		if err := decode(f, &r); err != nil {
			return nil, err
		}
		return c.groupPull(f, r)

	case wire.OpCommit, wire.OpRelease, wire.OpLeave:
		var r wire.CommitReq
		if err := decode(f, &r); err != nil {
			return nil, err
		}
		ref := group.QueueRef{Topic: r.Topic, Queue: r.Queue}
		svc, err := c.s.services(ctx, r.Group)
		if err != nil {
			return nil, err
		}
		switch f.Op {
		case wire.OpCommit:
			err = svc.Groups.Commit(ctx, r.Group, r.ClientID, ref, r.Offset)
		case wire.OpRelease:
			err = svc.Groups.Release(ctx, r.Group, r.ClientID, ref)
		default:
			err = svc.Groups.Leave(ctx, r.Group, r.ClientID)
		}
		return nil, err

	case wire.OpSendBack, wire.OpDeadLetter:
		var r wire.SendBackReq
		if err := decode(f, &r); err != nil {
			return nil, err
		}
		id, err := core.ParseMessageID(r.ID)
		if err != nil {
			return nil, err
		}
		svc, err := c.s.services(ctx, r.Group)
		if err != nil {
			return nil, err
		}
		m, err := o.Broker.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		if f.Op == wire.OpDeadLetter {
			m.ReconsumeCount = max(m.ReconsumeCount, r.Reconsume)
			return nil, svc.Retry.DeadLetter(ctx, r.Group, m, r.Reason)
		}
		out, err := svc.Retry.SendBack(ctx, r.Group, m, r.Reason)
		if err != nil {
			return nil, err
		}
		return marshal(wire.SendBackReply{Outcome: out.String()})

	case wire.OpPop:
		var r wire.PopReq
		if err := decode(f, &r); err != nil {
			return nil, err
		}
		req := pop.Request{Group: r.Group, Topic: r.Topic, Max: r.Max, Invisible: time.Duration(r.InvisibleMS) * time.Millisecond,
			Orderly: r.Orderly, Tags: r.Tags}
		encode := func(ps []pop.Popped) ([]byte, error) {
			out := make([]wire.Popped, len(ps))
			for i, p := range ps {
				out[i] = wire.Popped{Message: p.Message, Handle: p.Handle, Attempt: p.Attempt}
			}
			return wire.EncodePopped(out)
		}
		svc, err := c.s.services(ctx, r.Group)
		if err != nil {
			return nil, err
		}
		ps, err := svc.Pop.Pop(ctx, req)
		if err != nil {
			return nil, err
		}
		if len(ps) > 0 || r.WaitMS <= 0 {
			return encode(ps)
		}
		empty, _ := encode(nil)
		// A pop may be answered from the topic or the group's retry
		// topic: it waits for any arrival.
		c.s.hold.park("", "", &held{c: c, f: f, deadline: time.Now().Add(c.waitFor(r.WaitMS)), empty: empty,
			try: func(ctx context.Context) ([]byte, bool, error) {
				ps, err := svc.Pop.Pop(ctx, req)
				if err != nil || len(ps) == 0 {
					return nil, false, err
				}
				b, err := encode(ps)
				return b, err == nil, err
			}})
		return nil, errParked

	case wire.OpAck, wire.OpChangeInvis:
		var r wire.HandleReq
		if err := decode(f, &r); err != nil {
			return nil, err
		}
		grp, err := pop.GroupOf(r.Handle)
		if err != nil {
			return nil, err
		}
		svc, err := c.s.services(ctx, grp)
		if err != nil {
			return nil, err
		}
		if f.Op == wire.OpAck {
			return nil, svc.Pop.Ack(ctx, r.Handle)
		}
		h, err := svc.Pop.ChangeInvisibleTime(ctx, r.Handle, time.Duration(r.InvisibleMS)*time.Millisecond)
		if err != nil {
			return nil, err
		}
		return marshal(wire.HandleReq{Handle: h})

	case wire.OpLag:
		var r wire.LagReq
		if err := decode(f, &r); err != nil {
			return nil, err
		}
		svc, err := c.s.services(ctx, r.Group)
		if err != nil {
			return nil, err
		}
		lags, err := svc.Groups.Lag(ctx, r.Group, r.Member)
		if err != nil {
			return nil, err
		}
		out := make([]wire.QueueLag, 0, len(lags))
		for _, l := range lags {
			out = append(out, wire.QueueLag{Topic: l.Queue.Topic, Queue: l.Queue.Queue, Committed: l.Committed, Min: l.Range.Min,
				Max: l.Range.Max, Lag: l.Lag, LastConsumed: l.LastConsumed, Owner: l.Owner})
		}
		return marshal(out)

	case wire.OpReset:
		var r wire.ResetReq
		if err := decode(f, &r); err != nil {
			return nil, err
		}
		svc, err := c.s.services(ctx, r.Group)
		if err != nil {
			return nil, err
		}
		offs, err := svc.Groups.ResetOffsets(ctx, r.Group, r.Topic, group.ResetTarget{Time: r.Time, Latest: r.Latest})
		if err != nil {
			return nil, err
		}
		return marshal(wire.ResetReply{Offsets: offs})

	case wire.OpGroups:
		// The groups served here (in a cluster each node answers for its
		// own: the client asks every node, Client.Groups).
		out := []wire.GroupInfo{}
		svc := c.s.svc.Load()
		if svc == nil {
			return marshal(out)
		}
		for _, g := range svc.Groups.Groups() {
			gi := wire.GroupInfo{Group: g.Name, Mode: string(g.Mode), Members: []wire.MemberInfo{}}
			for _, m := range g.Members {
				mi := wire.MemberInfo{ClientID: m.ClientID, LastHeartbeat: m.LastHeartbeat, Queues: []wire.QueueRef{}}
				for _, q := range m.Queues {
					mi.Queues = append(mi.Queues, wire.QueueRef{Topic: q.Topic, Queue: q.Queue})
				}
				gi.Members = append(gi.Members, mi)
			}
			out = append(out, gi)
		}
		return marshal(out)

	case wire.OpTopicDelete:
		var r wire.TopicReq
		if err := decode(f, &r); err != nil {
			return nil, err
		}
		return nil, o.Broker.DeleteTopic(ctx, r.Name)

	case wire.OpTopicCreate, wire.OpTopicGet, wire.OpTopicResize:
		var r wire.TopicReq
		if err := decode(f, &r); err != nil {
			return nil, err
		}
		var info core.TopicInfo
		var err error
		switch f.Op {
		case wire.OpTopicCreate:
			info, err = o.Broker.CreateTopic(ctx, core.TopicConfig{Name: r.Name, Queues: r.Queues})
		case wire.OpTopicResize:
			info, err = o.Broker.ResizeTopic(ctx, r.Name, r.Queues)
		default:
			info, err = o.Broker.Topic(ctx, r.Name)
		}
		if err != nil {
			return nil, err
		}
		return marshal(topicInfo(ctx, o.Broker, info))

	case wire.OpCluster:
		if o.Cluster == nil {
			return marshal(wire.ClusterInfo{Nodes: []wire.NodeInfo{{Core: c.s.Addr().String(), Holder: true}}})
		}
		info, err := o.Cluster(ctx)
		if err != nil {
			return nil, err
		}
		return marshal(info)

	case wire.OpTopicList:
		list, err := o.Broker.Topics(ctx)
		if err != nil {
			return nil, err
		}
		out := make([]wire.TopicInfo, 0, len(list))
		for _, t := range list {
			out = append(out, topicInfo(ctx, o.Broker, t))
		}
		return marshal(out)

	case wire.OpGet:
		if len(f.Payload) != len(core.MessageID{}) {
			return nil, fmt.Errorf("%w: a message id is 16 bytes, got %d", wire.ErrBadPayload, len(f.Payload))
		}
		var id core.MessageID
		copy(id[:], f.Payload)
		m, err := o.Broker.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		return wire.EncodeStored([]*core.StoredMessage{m})

	case wire.OpFindByKey:
		var r wire.FindReq
		if err := decode(f, &r); err != nil {
			return nil, err
		}
		msgs, err := o.Broker.FindByKey(ctx, r.Topic, r.Key, core.KeyQuery{Begin: r.Begin, End: r.End, Max: r.Max})
		if err != nil {
			return nil, err
		}
		return wire.EncodeStored(msgs)

	case wire.OpCancelDelay, wire.OpListDelayed:
		return c.delayedOp(f)

	case wire.OpTrace, wire.OpQuery:
		return c.queryOp(f)

	case wire.OpTxnHalf, wire.OpTxnEnd, wire.OpTxnRegister, wire.OpTxnList:
		return c.txnOp(f)

	case wire.OpCall:
		return c.call(f)

	case wire.OpShadowGet, wire.OpShadowUpdate, wire.OpShadowDelete:
		return c.shadowOp(f)
	}
	return nil, &wire.Error{Code: wire.CodeUnknownOp, Message: "unknown op " + f.Op.String()}
}

// topicInfo describes t with each queue's message count (Backlog from its
// minimum; the span when that fails).
func topicInfo(ctx context.Context, b core.Broker, t core.TopicInfo) wire.TopicInfo {
	out := wire.TopicInfo{Name: t.Name, Queues: t.Queues, CreatedAt: t.CreatedAt, Ranges: []wire.QueueRange{}}
	for q, r := range t.Ranges {
		n, err := b.Backlog(ctx, t.Name, q, r.Min)
		if err != nil {
			n = max(r.Max-r.Min, 0)
		}
		out.Ranges = append(out.Ranges, wire.QueueRange{Min: r.Min, Max: r.Max, Messages: n})
	}
	for _, e := range t.Epochs {
		out.Epochs = append(out.Epochs, wire.Epoch{Queues: e.Queues, Begin: e.Begin, Started: e.Started})
	}
	return out
}
