package server

import (
	"fmt"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/ferrymq/ferrymq/core/wire"
)

func (c *conn) delayedOp(f wire.Frame) ([]byte, error) {
	svc, err := c.s.services(c.ctx, "")
	if err != nil {
		return nil, err
	}
	d := svc.Delay
	if d == nil {
		return nil, fmt.Errorf("delayed delivery: %w", wire.ErrNotEnabled)
	}
	switch f.Op {
	case wire.OpCancelDelay:
		var r wire.DelayedReq
		if err := decode(f, &r); err != nil {
			return nil, err
		}
		id, err := core.ParseMessageID(r.ID)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", wire.ErrBadPayload, err)
		}
		p, err := d.Cancel(c.ctx, id)
		if err != nil {
			return nil, err
		}
		return marshal(wire.DelayedOf(p))

	case wire.OpListDelayed:
		var r wire.ListDelayedReq
		if err := decode(f, &r); err != nil {
			return nil, err
		}
		res, err := d.List(c.ctx, delay.ListRequest{Topic: r.Topic, Max: r.Max, Cursor: delay.Cursor{Level: r.Level, Offset: r.Offset}})
		if err != nil {
			return nil, err
		}
		out := wire.ListDelayedReply{Pending: []wire.Delayed{}, NextLevel: res.Next.Level, NextOffset: res.Next.Offset, Done: res.Done}
		for _, p := range res.Pending {
			out.Pending = append(out.Pending, wire.DelayedOf(p))
		}
		return marshal(out)
	}
	return nil, &wire.Error{Code: wire.CodeUnknownOp, Message: "unknown op " + f.Op.String()}
}
