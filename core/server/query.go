package server

import (
	"fmt"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/query"
	"github.com/ferrymq/ferrymq/core/trace"
	"github.com/ferrymq/ferrymq/core/wire"
)

// queryOp answers OpTrace and OpQuery.
func (c *conn) queryOp(f wire.Frame) ([]byte, error) {
	b := c.s.opts.Broker
	switch f.Op {
	case wire.OpTrace:
		var r wire.TraceReq
		if err := decode(f, &r); err != nil {
			return nil, err
		}
		id, err := core.ParseMessageID(r.ID)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", wire.ErrBadPayload, err)
		}
		hops, err := trace.Lookup(c.ctx, b, id, r.Max)
		if err != nil {
			return nil, err
		}
		if hops == nil {
			hops = []trace.Event{}
		}
		return marshal(hops)

	case wire.OpQuery:
		var r wire.QueryReq
		if err := decode(f, &r); err != nil {
			return nil, err
		}
		res, err := query.Run(c.ctx, b, query.Request{Topic: r.Topic, Key: r.Key, ClientID: r.ClientID,
			Begin: r.Begin, End: r.End, Max: r.Max, Cursor: r.Cursor})
		if err != nil {
			return nil, err
		}
		return wire.EncodeQuery(res.Next, res.Messages)
	}
	return nil, &wire.Error{Code: wire.CodeUnknownOp, Message: "unknown op " + f.Op.String()}
}
