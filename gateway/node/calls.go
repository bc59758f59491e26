package node

import (
	"context"
	"errors"
	"time"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/wire"
	"github.com/ferrymq/ferrymq/gateway/rpc"
)

// deviceCalls serves OpCall on the core port with the node's device calls.
type deviceCalls struct{ n *Node }

// Call implements server.Caller.
func (d deviceCalls) Call(ctx context.Context, clientID string, payload []byte, timeout time.Duration) (wire.CallResp, error) {
	svc := d.n.rpc
	if svc == nil {
		return wire.CallResp{}, wire.ErrNotEnabled
	}
	a, err := svc.Call(ctx, clientID, payload, timeout)
	if err != nil {
		return wire.CallResp{}, callError(err)
	}
	return wire.CallResp{ID: a.ID.String(), Payload: a.Payload, Node: a.Node, TookMS: float64(a.Took.Microseconds()) / 1e3}, nil
}

// callError gives a call's error its wire code.
func callError(err error) error {
	code := wire.Code(0)
	switch {
	case errors.Is(err, rpc.ErrNotConnected):
		code = wire.CodeNotConnected
	case errors.Is(err, rpc.ErrTimeout):
		code = wire.CodeDeviceTimeout
	case errors.Is(err, rpc.ErrBadRequest):
		code = wire.CodeBadRequest
	case errors.Is(err, rpc.ErrClosed):
		return errors.Join(err, core.ErrClosed) // CodeShuttingDown
	default:
		return err
	}
	return &wire.Error{Code: code, Message: err.Error()}
}
