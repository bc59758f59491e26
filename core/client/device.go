package client

import (
	"context"
	"fmt"
	"time"

	"github.com/ferrymq/ferrymq/core/wire"
)

// Limits of a device call's timeout, as the server enforces them.
const (
	MinCallTimeout     = time.Second
	MaxCallTimeout     = time.Minute
	DefaultCallTimeout = 5 * time.Second
	// callSlack is how much longer than the device's timeout the client
	// waits for the server's answer (the network, the hop between nodes).
	callSlack = 3 * time.Second
)

// Call sends payload to the MQTT device clientID and returns its answer
// (docs/commands.md). The device has until ctx's deadline to answer
// (1–60 s, to a tenth of a second; DefaultCallTimeout when ctx has none).
// Errors:
// wire.ErrDeviceNotConnected at once when no gateway node has the device
// connected, wire.ErrDeviceTimeout when it did not answer in time. A call
// is never sent twice: a lost connection fails it, whether or not the
// device got it.
func (c *Client) Call(ctx context.Context, clientID string, payload []byte) (wire.CallResp, error) {
	timeout := DefaultCallTimeout
	if d, ok := ctx.Deadline(); ok {
		timeout = time.Until(d).Round(100 * time.Millisecond) // a deadline just set says 5 s, not 4.9999 s
	}
	if timeout < MinCallTimeout || timeout > MaxCallTimeout {
		return wire.CallResp{}, fmt.Errorf("%w: a call's timeout (its context's deadline) must be %v–%v, not %v",
			wire.ErrBadPayload, MinCallTimeout, MaxCallTimeout, timeout)
	}
	// The server says when the device's time is up; the request waits a
	// little longer for that answer, unless the caller gives up first.
	wait, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout+callSlack)
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		if ctx.Err() == context.Canceled {
			cancel()
		}
	})
	defer stop()
	var out wire.CallResp
	err := c.callJSON(wait, wire.OpCall, wire.CallReq{ClientID: clientID, Payload: payload, TimeoutMS: timeout.Milliseconds()}, &out)
	if err != nil {
		return wire.CallResp{}, fmt.Errorf("call %q: %w", clientID, err)
	}
	return out, nil
}
