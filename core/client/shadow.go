package client

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/ferrymq/ferrymq/core/shadow"
	"github.com/ferrymq/ferrymq/core/wire"
)

// Shadow returns the device's shadow (docs/commands.md, "Device
// shadows"); an error that errors.Is shadow.ErrNotFound when it has none.
func (c *Client) Shadow(ctx context.Context, clientID string) (*shadow.Document, error) {
	return c.shadowCall(ctx, wire.OpShadowGet, wire.ShadowReq{ClientID: clientID})
}

// UpdateShadow merges desired (a JSON object: a merge patch, where null
// removes a field; or null, which clears the section) into the device's
// desired state and returns the new document. version, when not 0, must
// be the shadow's current version: otherwise the error errors.Is
// shadow.ErrVersionConflict (read it again and retry). Too large a
// document is shadow.ErrTooLarge, bad JSON shadow.ErrBadRequest.
func (c *Client) UpdateShadow(ctx context.Context, clientID string, desired json.RawMessage, version int64) (*shadow.Document, error) {
	if desired == nil {
		desired = json.RawMessage("null")
	}
	if !json.Valid(desired) { // it could not even be sent
		return nil, fmt.Errorf("%w: desired is not JSON", shadow.ErrBadRequest)
	}
	return c.shadowCall(ctx, wire.OpShadowUpdate, wire.ShadowReq{ClientID: clientID, Desired: desired, Version: version})
}

// DeleteShadow deletes the device's shadow (version, when not 0, must be
// its current one) and returns the version the delete got.
func (c *Client) DeleteShadow(ctx context.Context, clientID string, version int64) (int64, error) {
	var out wire.ShadowDeleted
	err := c.callJSON(ctx, wire.OpShadowDelete, wire.ShadowReq{ClientID: clientID, Version: version}, &out)
	return out.Version, err
}

func (c *Client) shadowCall(ctx context.Context, op wire.Op, req wire.ShadowReq) (*shadow.Document, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	p, err := c.call(ctx, op, b)
	if err != nil {
		return nil, err
	}
	d, err := shadow.DecodeDocument(p)
	if err != nil {
		return nil, fmt.Errorf("%w: %s response: %w", wire.ErrBadPayload, op, err)
	}
	return d, nil
}
