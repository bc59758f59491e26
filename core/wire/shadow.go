package wire

import "encoding/json"

// ShadowReq names a device's shadow (OpShadowGet, OpShadowDelete) or
// changes its desired section (OpShadowUpdate): Desired is a JSON merge
// patch (an object; null clears the section). Version, when not 0, must
// be the shadow's current version (CodeVersionConflict otherwise).
type ShadowReq struct {
	ClientID string          `json:"client_id"`
	Desired  json.RawMessage `json:"desired,omitempty"`
	Version  int64           `json:"version,omitempty"`
}

// ShadowDeleted answers OpShadowDelete: the version the delete got.
type ShadowDeleted struct {
	Version int64 `json:"version"`
}
