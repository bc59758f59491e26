package server

import (
	"context"
	"fmt"

	"github.com/ferrymq/ferrymq/core/shadow"
	"github.com/ferrymq/ferrymq/core/wire"
)

// Shadows is what serves device shadows over the wire (OpShadowGet,
// OpShadowUpdate, OpShadowDelete): *shadow.Service.
type Shadows interface {
	Get(ctx context.Context, id string) (*shadow.Document, error)
	Update(ctx context.Context, id string, u shadow.Update) (*shadow.Document, error)
	Delete(ctx context.Context, id string, version int64) (int64, error)
	Limits() shadow.Limits
	Refused(id string, section shadow.Section, err error)
}

// shadowOp serves the shadow ops: any node with Options.Shadows answers
// them (with the JetStream engine the bucket is shared, no shard moves).
func (c *conn) shadowOp(f wire.Frame) ([]byte, error) {
	sh := c.s.opts.Shadows
	if sh == nil {
		return nil, fmt.Errorf("device shadows: %w", wire.ErrNotEnabled)
	}
	var r wire.ShadowReq
	if err := decode(f, &r); err != nil {
		return nil, err
	}
	if r.Version < 0 {
		return nil, fmt.Errorf("%w: version %d: want ≥ 0", shadow.ErrBadRequest, r.Version)
	}
	switch f.Op {
	case wire.OpShadowGet:
		d, err := sh.Get(c.ctx, r.ClientID)
		if err != nil {
			return nil, err
		}
		return marshal(d)
	case wire.OpShadowUpdate:
		patch, err := shadow.DecodePatch(r.Desired, sh.Limits())
		if err != nil {
			sh.Refused(r.ClientID, shadow.Desired, err)
			return nil, fmt.Errorf("desired: %w", err)
		}
		d, err := sh.Update(c.ctx, r.ClientID, shadow.Update{Section: shadow.Desired, Patch: patch, Clear: patch == nil, Version: r.Version})
		if err != nil {
			return nil, err
		}
		return marshal(d)
	default: // OpShadowDelete
		v, err := sh.Delete(c.ctx, r.ClientID, r.Version)
		if err != nil {
			return nil, err
		}
		return marshal(wire.ShadowDeleted{Version: v})
	}
}
