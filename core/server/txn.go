package server

import (
	"fmt"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/txn"
	"github.com/ferrymq/ferrymq/core/wire"
)

// maxPushes bounds check-backs queued to one connection; past it a check is
// refused and the transaction service tries another producer or later.
const maxPushes = 64

// CheckTransaction pushes a check-back to the producer on this connection
// (txn.Checker). It never blocks.
func (c *conn) CheckTransaction(half *core.StoredMessage) error {
	if c.ctx.Err() != nil {
		return fmt.Errorf("connection %s: %w", c.nc.RemoteAddr(), errConnGone)
	}
	p, err := wire.EncodeStored([]*core.StoredMessage{half})
	if err != nil {
		return err
	}
	select {
	case c.push <- wire.Frame{Op: wire.OpCheckTxn, Flags: wire.FlagPush, Payload: p}:
		return nil
	default:
		return fmt.Errorf("connection %s: %w", c.nc.RemoteAddr(), errPushQueueFull)
	}
}

// registerProducers makes this connection a check-back target for exactly
// groups (until it closes): groups not yet registered are added, and those
// registered before but not listed are dropped, so that a client whose
// transaction producer closed stops getting — and using up — the check-backs
// of its group while it stays connected.
func (c *conn) registerProducers(t *txn.Service, groups []string) error {
	if t == nil {
		return fmt.Errorf("transactions: %w", wire.ErrNotEnabled)
	}
	want := make(map[string]bool, len(groups))
	for _, g := range groups {
		if err := txn.ValidateGroup(g); err != nil {
			return err
		}
		want[g] = true
	}
	var drop []func()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return errConnGone
	}
	for g, unregister := range c.producerOf {
		if !want[g] {
			drop = append(drop, unregister)
			delete(c.producerOf, g)
		}
	}
	for g := range want {
		if _, ok := c.producerOf[g]; !ok {
			c.producerOf[g] = t.Register(g, c)
		}
	}
	c.mu.Unlock()
	for _, unregister := range drop {
		unregister()
	}
	return nil
}

// registered reports whether producer groups are registered here.
func (c *conn) registered() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.producerOf) > 0
}

// unregisterProducers ends every registration (at close).
func (c *conn) unregisterProducers() {
	c.mu.Lock()
	regs := c.producerOf
	c.producerOf = map[string]func(){}
	c.mu.Unlock()
	for _, unregister := range regs {
		unregister()
	}
}

func (c *conn) txnOp(f wire.Frame) ([]byte, error) {
	svc, err := c.s.services(c.ctx, "")
	if err != nil {
		return nil, err
	}
	t := svc.Txn
	if t == nil {
		return nil, fmt.Errorf("transactions: %w", wire.ErrNotEnabled)
	}
	switch f.Op {
	case wire.OpTxnHalf:
		group, m, err := wire.DecodeTxnHalf(f.Payload)
		if err != nil {
			return nil, err
		}
		res, err := t.SendHalf(c.ctx, group, m)
		if err != nil {
			return nil, err
		}
		return wire.EncodeSendResults([]core.SendResult{res}), nil

	case wire.OpTxnEnd:
		var r wire.TxnEndReq
		if err := decode(f, &r); err != nil {
			return nil, err
		}
		id, err := core.ParseMessageID(r.ID)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", wire.ErrBadPayload, err)
		}
		var a txn.Action
		switch r.Action {
		case wire.TxnCommit:
			a = txn.Commit
		case wire.TxnRollback:
			a = txn.Rollback
		case wire.TxnUnknown:
			a = txn.Unknown
		default:
			return nil, fmt.Errorf("%w: action %q: want commit, rollback or unknown", wire.ErrBadPayload, r.Action)
		}
		res, err := t.End(c.ctx, id, r.Group, a, r.FromCheck)
		if err != nil {
			return nil, err
		}
		if a != txn.Commit {
			return wire.EncodeSendResults(nil), nil
		}
		return wire.EncodeSendResults([]core.SendResult{res}), nil

	case wire.OpTxnRegister:
		var r wire.TxnRegisterReq
		if err := decode(f, &r); err != nil {
			return nil, err
		}
		return nil, c.registerProducers(t, r.Groups)

	case wire.OpTxnList:
		out := []wire.TxnPending{}
		for _, p := range t.Pending() {
			out = append(out, wire.TxnPending{ID: p.ID.String(), Group: p.Group, Topic: p.Topic,
				StoredAt: p.StoredAt, Checks: p.Checks, NextCheck: p.NextCheck})
		}
		return marshal(out)
	}
	return nil, &wire.Error{Code: wire.CodeUnknownOp, Message: "unknown op " + f.Op.String()}
}
