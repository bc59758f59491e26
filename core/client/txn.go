package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/txn"
	"github.com/ferrymq/ferrymq/core/wire"
)

// TxnAction is a producer's answer for a transaction.
type TxnAction int

const (
	// Commit makes the half message visible in its topic.
	Commit TxnAction = iota + 1
	// Rollback discards it.
	Rollback
	// Unknown leaves it pending: the server checks back later.
	Unknown
)

func (a TxnAction) wire() string {
	switch a {
	case Commit:
		return wire.TxnCommit
	case Rollback:
		return wire.TxnRollback
	default:
		return wire.TxnUnknown
	}
}

func (a TxnAction) String() string { return a.wire() }

// ErrProducerExists is returned by NewTransactionProducer for a group that
// already has a transaction producer on this client.
var ErrProducerExists = errors.New("client: transaction producer exists for this group")

// CheckFunc answers a check-back: the server holds half, unresolved past
// its first check time, and asks what became of the local transaction.
// It runs on the producer's own goroutine, one check at a time.
type CheckFunc func(ctx context.Context, half *core.StoredMessage) TxnAction

// TransactionProducer sends transactional messages for one producer group:
// a half message, invisible to consumers, then a commit or rollback. While
// it is open the client announces the group to the server (also after a
// reconnect), so the server's check-backs for half messages of the group —
// including those sent before a crash of another producer of the group —
// arrive at its CheckFunc.
type TransactionProducer struct {
	c     *Client
	group string
	check CheckFunc

	checks chan *core.StoredMessage
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

// maxQueuedChecks bounds check-backs waiting for CheckFunc; beyond it they
// are dropped (the server checks again later).
const maxQueuedChecks = 256

// NewTransactionProducer returns a transaction producer for group whose
// check-backs go to check (required). Close it to stop.
func (c *Client) NewTransactionProducer(ctx context.Context, group string, check CheckFunc) (*TransactionProducer, error) {
	if err := txn.ValidateGroup(group); err != nil {
		return nil, err
	}
	if check == nil {
		return nil, errors.New("client: a transaction producer needs a check function")
	}
	p := &TransactionProducer{c: c, group: group, check: check, checks: make(chan *core.StoredMessage, maxQueuedChecks)}
	p.ctx, p.cancel = context.WithCancel(c.ctx)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		p.cancel()
		return nil, ErrClosed
	}
	if _, ok := c.txnProducers[group]; ok {
		c.mu.Unlock()
		p.cancel()
		return nil, fmt.Errorf("%w: %s", ErrProducerExists, group)
	}
	c.txnProducers[group] = p
	c.mu.Unlock()
	// Announce the group on the current connection; later ones announce
	// it in their hello.
	if err := c.announce(ctx); err != nil {
		p.remove()
		p.cancel()
		return nil, fmt.Errorf("register producer group %s: %w", group, err)
	}
	p.wg.Go(p.run)
	return p, nil
}

// Group is the producer group.
func (p *TransactionProducer) Group() string { return p.group }

// SendHalf stores m as a half message, invisible to consumers until Commit.
// The result names the real topic, with queue and queue offset -1.
func (p *TransactionProducer) SendHalf(ctx context.Context, m *core.Message) (core.SendResult, error) {
	b, err := wire.EncodeTxnHalf(p.group, m)
	if err != nil {
		return core.SendResult{}, err
	}
	out, err := p.c.callShard(ctx, shardServices, wire.OpTxnHalf, b)
	if err != nil {
		return core.SendResult{}, err
	}
	res, err := wire.DecodeSendResults(out)
	if err != nil {
		return core.SendResult{}, err
	}
	if len(res) != 1 {
		return core.SendResult{}, fmt.Errorf("%w: %d results for one half message", wire.ErrBadPayload, len(res))
	}
	res[0].Topic = m.Topic
	return res[0], nil
}

// Commit makes the half message id visible in its topic and returns where
// it was stored (ID, queue, offset; Topic is left empty — Send fills it in).
func (p *TransactionProducer) Commit(ctx context.Context, id core.MessageID) (core.SendResult, error) {
	return p.end(ctx, id, Commit, false)
}

// Rollback discards the half message id.
func (p *TransactionProducer) Rollback(ctx context.Context, id core.MessageID) error {
	_, err := p.end(ctx, id, Rollback, false)
	return err
}

func (p *TransactionProducer) end(ctx context.Context, id core.MessageID, a TxnAction, fromCheck bool) (core.SendResult, error) {
	out, err := p.c.callShard(ctx, shardServices, wire.OpTxnEnd, mustJSON(wire.TxnEndReq{ID: id.String(), Group: p.group, Action: a.wire(), FromCheck: fromCheck}))
	if err != nil {
		return core.SendResult{}, err
	}
	res, err := wire.DecodeSendResults(out)
	if err != nil || len(res) == 0 {
		return core.SendResult{}, err
	}
	return res[0], nil
}

// Send runs a whole transaction: it stores m as a half message, runs
// execute (the local transaction, e.g. the database write) and commits or
// rolls back as execute answers. On Unknown the half message stays pending
// and the check function decides later. The result is the committed
// message's, and the action taken.
func (p *TransactionProducer) Send(ctx context.Context, m *core.Message, execute func(ctx context.Context, half core.SendResult) TxnAction) (core.SendResult, TxnAction, error) {
	half, err := p.SendHalf(ctx, m)
	if err != nil {
		return core.SendResult{}, 0, err
	}
	a := execute(ctx, half)
	switch a {
	case Commit:
		res, err := p.Commit(ctx, half.ID)
		if err == nil {
			res.Topic = m.Topic
		}
		return res, a, err
	case Rollback:
		return half, a, p.Rollback(ctx, half.ID)
	default:
		return half, Unknown, nil
	}
}

// Close stops answering check-backs for the group and waits for the check
// in progress; the group is withdrawn from the server in the background.
// The server keeps the group's half messages and asks another producer, or
// this one again once it is back.
func (p *TransactionProducer) Close() error {
	p.once.Do(func() {
		p.remove()
		p.cancel()
		p.wg.Wait()
		// Withdraw the group, or the server would go on pushing its
		// check-backs here, where they are dropped yet count as checks.
		p.c.announceLater()
	})
	return nil
}

func (p *TransactionProducer) remove() {
	p.c.mu.Lock()
	if p.c.txnProducers[p.group] == p {
		delete(p.c.txnProducers, p.group)
	}
	p.c.mu.Unlock()
}

// offer queues a check-back; it never blocks.
func (p *TransactionProducer) offer(half *core.StoredMessage) {
	select {
	case p.checks <- half:
	default:
		p.c.log.Warn().Str("group", p.group).Str("id", half.ID.String()).Msg("check-back dropped: too many queued")
	}
}

func (p *TransactionProducer) run() {
	for {
		select {
		case <-p.ctx.Done():
			return
		case half := <-p.checks:
			a := p.check(p.ctx, half)
			if a != Commit && a != Rollback {
				a = Unknown
			}
			if _, err := p.end(p.ctx, half.ID, a, true); err != nil && p.ctx.Err() == nil && !errors.Is(err, txn.ErrResolved) {
				p.c.log.Warn().Err(err).Str("group", p.group).Str("id", half.ID.String()).Str("action", a.String()).Msg("answer check-back")
			}
		}
	}
}

// onCheck routes a check-back push to the producer of its group.
func (c *Client) onCheck(f wire.Frame) {
	msgs, err := wire.DecodeStored(f.Payload)
	if err != nil || len(msgs) != 1 {
		c.log.Warn().Err(err).Msg("malformed check-back push")
		return
	}
	half := msgs[0]
	half.Body = slices.Clone(half.Body) // the frame's buffer is not ours to keep
	group := half.Properties[txn.PropGroup]
	c.mu.Lock()
	p := c.txnProducers[group]
	c.mu.Unlock()
	if p == nil {
		// The server's list of this connection's groups is stale (an
		// announcement was lost with a connection): correct it, so that
		// further checks go to a producer of the group.
		c.log.Warn().Str("group", group).Str("id", half.ID.String()).Msg("check-back for a group without producer")
		c.announceLater()
		return
	}
	p.offer(half)
}

// announceLater runs announce in the background, until the client closes;
// a connection made meanwhile announces the groups in its hello anyway.
func (c *Client) announceLater() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed { // and under mu: Close waits for wg only after closed is set
		return
	}
	c.wg.Go(func() {
		if err := c.announce(c.ctx); err != nil && c.ctx.Err() == nil {
			c.log.Warn().Err(err).Msg("announce producer groups")
		}
	})
}

// announce makes the server's set of producer groups for this connection
// the open producers' groups (OpTxnRegister replaces the set). The server
// handles requests concurrently, so an announcement may overtake an older
// one; each is checked against the groups when its answer comes and sent
// again if they changed meanwhile, so the last one the server applies is
// current.
//
// Where another node serves the transactions (wire.CodeMoved), the
// announcement goes to the peer connected to it (route.go), whose hello
// carried the groups already; every peer is told of a change, and one
// whose node does not serve transactions ignores it.
func (c *Client) announce(ctx context.Context) error {
	root := c.root()
	for {
		groups := root.producerGroups()
		err := c.callJSON(ctx, wire.OpTxnRegister, wire.TxnRegisterReq{Groups: groups}, nil)
		if addr, moved := wire.MovedTo(err); moved {
			if c.parent != nil {
				return nil
			}
			peer, err := c.follow(ctx, shardServices, addr)
			if err != nil {
				return err
			}
			if peer == c {
				return err
			}
			return peer.announce(ctx)
		}
		if err != nil {
			return err
		}
		if slices.Equal(groups, root.producerGroups()) {
			break
		}
	}
	if c.parent == nil {
		c.eachPeer(func(p *Client) { p.announceLater() })
	}
	return nil
}

// producerGroups lists the groups to announce in a hello.
func (c *Client) producerGroups() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.txnProducers))
	for g := range c.txnProducers {
		out = append(out, g)
	}
	slices.Sort(out)
	return out
}
