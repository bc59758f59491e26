package client

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/trace"
	"github.com/ferrymq/ferrymq/core/wire"
)

// CreateTopic creates a topic (or returns it if it exists with the same
// queue count).
func (c *Client) CreateTopic(ctx context.Context, name string, queues int) (wire.TopicInfo, error) {
	var out wire.TopicInfo
	err := c.callJSON(ctx, wire.OpTopicCreate, wire.TopicReq{Name: name, Queues: queues}, &out)
	return out, err
}

// ResizeTopic changes a topic's queue count while it is in use
// (core.Broker.ResizeTopic): every key keeps its order for every group.
func (c *Client) ResizeTopic(ctx context.Context, name string, queues int) (wire.TopicInfo, error) {
	var out wire.TopicInfo
	err := c.callJSON(ctx, wire.OpTopicResize, wire.TopicReq{Name: name, Queues: queues}, &out)
	return out, err
}

// Topic describes a topic.
func (c *Client) Topic(ctx context.Context, name string) (wire.TopicInfo, error) {
	var out wire.TopicInfo
	err := c.callJSON(ctx, wire.OpTopicGet, wire.TopicReq{Name: name}, &out)
	return out, err
}

// Topics lists topics.
func (c *Client) Topics(ctx context.Context) ([]wire.TopicInfo, error) {
	var out []wire.TopicInfo
	err := c.callJSON(ctx, wire.OpTopicList, struct{}{}, &out)
	return out, err
}

// Groups lists groups with live members. Each node answers for the groups
// it serves; in a cluster (discovery names groups on other nodes) every
// node is asked, each group listed once — from the node discovery names
// for it while one moves.
func (c *Client) Groups(ctx context.Context) ([]wire.GroupInfo, error) {
	var own []wire.GroupInfo
	if err := c.callJSON(ctx, wire.OpGroups, struct{}{}, &own); err != nil {
		return nil, err
	}
	info, err := c.Cluster(ctx)
	if err != nil || len(info.Groups) == 0 || len(info.Nodes) < 2 {
		return own, nil //nolint:nilerr // a server without discovery serves every group itself
	}
	seen := map[string]bool{}
	var out []wire.GroupInfo
	// add lists the groups of gs that node serves ("": every one not
	// listed yet).
	add := func(node string, gs []wire.GroupInfo) {
		for _, g := range gs {
			if holder, ok := info.Groups[g.Group]; (!ok || holder == node || node == "") && !seen[g.Group] {
				seen[g.Group] = true
				out = append(out, g)
			}
		}
	}
	for _, n := range info.Nodes {
		if n.Core == "" || c.ownAddr(n.Core) {
			continue
		}
		peer, err := c.peer(ctx, n.Core)
		if err != nil {
			return nil, fmt.Errorf("groups of node %s: %w", n.Name, err)
		}
		var gs []wire.GroupInfo
		if err := peer.callJSON(ctx, wire.OpGroups, struct{}{}, &gs); err != nil {
			return nil, fmt.Errorf("groups of node %s: %w", n.Name, err)
		}
		add(n.Name, gs)
	}
	add("", own) // the node asked: what the others did not list
	slices.SortFunc(out, func(a, b wire.GroupInfo) int { return strings.Compare(a.Group, b.Group) })
	return out, nil
}

// Lag reports a group's progress per queue (member: a broadcast member's
// own progress; empty otherwise).
func (c *Client) Lag(ctx context.Context, group, member string) ([]wire.QueueLag, error) {
	var out []wire.QueueLag
	err := c.callShardJSON(ctx, group, wire.OpLag, wire.LagReq{Group: group, Member: member}, &out)
	return out, err
}

// ResetOffsets moves a group's offsets on topic to the first message at or
// after t (zero: the earliest, or the latest if latest is set).
func (c *Client) ResetOffsets(ctx context.Context, group, topic string, t time.Time, latest bool) ([]int64, error) {
	var out wire.ResetReply
	err := c.callShardJSON(ctx, group, wire.OpReset, wire.ResetReq{Group: group, Topic: topic, Time: t, Latest: latest}, &out)
	return out.Offsets, err
}

// Get returns the message with the given ID.
func (c *Client) Get(ctx context.Context, id core.MessageID) (*core.StoredMessage, error) {
	b, err := c.call(ctx, wire.OpGet, id[:])
	if err != nil {
		return nil, err
	}
	msgs, err := wire.DecodeStored(b)
	if err != nil {
		return nil, err
	}
	if len(msgs) != 1 {
		return nil, core.ErrMessageNotFound
	}
	return msgs[0], nil
}

// FindByKey returns messages of topic with the given key.
func (c *Client) FindByKey(ctx context.Context, topic, key string, q core.KeyQuery) ([]*core.StoredMessage, error) {
	b, err := jsonBytes(wire.FindReq{Topic: topic, Key: key, Max: q.Max, Begin: q.Begin, End: q.End})
	if err != nil {
		return nil, err
	}
	p, err := c.call(ctx, wire.OpFindByKey, b)
	if err != nil {
		return nil, err
	}
	return wire.DecodeStored(p)
}

// Pull reads a queue without a group, waiting up to wait for messages.
func (c *Client) Pull(ctx context.Context, topic string, queue int, offset int64, max int, wait time.Duration) (wire.PullResult, error) {
	b, err := jsonBytes(wire.PullReq{Topic: topic, Queue: queue, Offset: offset, Max: max, WaitMS: wait.Milliseconds()})
	if err != nil {
		return wire.PullResult{}, err
	}
	ctx, cancel := withWait(ctx, c, wait)
	defer cancel()
	p, err := c.call(ctx, wire.OpPull, b)
	if err != nil {
		return wire.PullResult{}, err
	}
	return wire.DecodePull(p)
}

// CancelDelayed cancels a delayed message by the ID its producer got. The
// server refuses an unknown ID (core.ErrMessageNotFound), one that was not
// delayed (delay.ErrNotDelayed), one already due (delay.ErrAlreadyDue) or
// cancelled (delay.ErrAlreadyCancelled).
func (c *Client) CancelDelayed(ctx context.Context, id core.MessageID) (wire.Delayed, error) {
	var out wire.Delayed
	err := c.callShardJSON(ctx, shardServices, wire.OpCancelDelay, wire.DelayedReq{ID: id.String()}, &out)
	return out, err
}

// ListDelayed returns one page of pending delayed messages; continue with
// the reply's NextLevel and NextOffset until Done.
func (c *Client) ListDelayed(ctx context.Context, req wire.ListDelayedReq) (wire.ListDelayedReply, error) {
	var out wire.ListDelayedReply
	err := c.callShardJSON(ctx, shardServices, wire.OpListDelayed, req, &out)
	return out, err
}

// PendingTransactions lists the server's unresolved half messages.
func (c *Client) PendingTransactions(ctx context.Context) ([]wire.TxnPending, error) {
	var out []wire.TxnPending
	err := c.callShardJSON(ctx, shardServices, wire.OpTxnList, struct{}{}, &out)
	return out, err
}

// Trace returns the recorded hops of message id, in time order (empty when
// its topic was not traced).
func (c *Client) Trace(ctx context.Context, id core.MessageID) ([]trace.Event, error) {
	var out []trace.Event
	err := c.callJSON(ctx, wire.OpTrace, wire.TraceReq{ID: id.String()}, &out)
	return out, err
}

// Query returns one page of messages by key, MQTT client or store time;
// pass next back in req.Cursor for the following page (empty: no more).
func (c *Client) Query(ctx context.Context, req wire.QueryReq) (msgs []*core.StoredMessage, next string, err error) {
	b, err := jsonBytes(req)
	if err != nil {
		return nil, "", err
	}
	p, err := c.call(ctx, wire.OpQuery, b)
	if err != nil {
		return nil, "", err
	}
	next, msgs, err = wire.DecodeQuery(p)
	return msgs, next, err
}

// DeleteTopic deletes a user topic: its queues and committed offsets go,
// its messages are never served again.
func (c *Client) DeleteTopic(ctx context.Context, name string) error {
	return c.callJSON(ctx, wire.OpTopicDelete, wire.TopicReq{Name: name}, nil)
}

// Cluster asks the server for the nodes of its cluster and their core
// addresses (discovery; a lone server names itself).
func (c *Client) Cluster(ctx context.Context) (wire.ClusterInfo, error) {
	var out wire.ClusterInfo
	err := c.callJSON(ctx, wire.OpCluster, struct{}{}, &out)
	return out, err
}
