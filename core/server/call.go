package server

import (
	"context"
	"fmt"
	"time"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/wire"
)

// Caller makes synchronous calls to devices (OpCall): the gateway's device
// calls. Its errors carry the wire codes (CodeNotConnected,
// CodeDeviceTimeout, CodeBadRequest) as *wire.Error.
type Caller interface {
	Call(ctx context.Context, clientID string, payload []byte, timeout time.Duration) (wire.CallResp, error)
}

// call answers OpCall from a goroutine of its own: a call waits for a
// device for up to a minute, and must not hold one of the connection's
// few handlers meanwhile.
func (c *conn) call(f wire.Frame) ([]byte, error) {
	calls := c.s.opts.Calls
	if calls == nil {
		return nil, fmt.Errorf("%w: device calls (no MQTT gateway here)", wire.ErrNotEnabled)
	}
	var r wire.CallReq
	if err := decode(f, &r); err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, core.ErrClosed
	}
	c.wg.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.wg.Done()
		a, err := calls.Call(c.ctx, r.ClientID, r.Payload, time.Duration(r.TimeoutMS)*time.Millisecond)
		if err != nil {
			c.fail(f, err)
			return
		}
		b, err := marshal(a)
		if err != nil {
			c.fail(f, err)
			return
		}
		c.reply(f, b)
	}()
	return nil, errParked
}
