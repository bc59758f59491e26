package admin

import (
	"encoding/base64"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/ferrymq/ferrymq/core/httperr"
	"github.com/ferrymq/ferrymq/gateway/rpc"
)

// callRequest is the body of POST /api/v1/devices/{id}/rpc: the request's
// payload as text or base64 (one of them), and the device's time to answer.
type callRequest struct {
	Payload       *string `json:"payload"`
	PayloadBase64 *string `json:"payload_base64"`
	TimeoutMS     int64   `json:"timeout_ms"`
}

// callAnswer is the answer of POST /api/v1/devices/{id}/rpc: the device's
// payload as text when it is UTF-8, else base64.
type callAnswer struct {
	ID            string  `json:"id"`
	Payload       *string `json:"payload,omitempty"`
	PayloadBase64 *string `json:"payload_base64,omitempty"`
	Node          string  `json:"node,omitempty"`
	TookMS        float64 `json:"took_ms"`
}

// callDevice serves POST /api/v1/devices/{id}/rpc: a synchronous call to
// a device (docs/commands.md).
func (a *api) callDevice(w http.ResponseWriter, r *http.Request) error {
	calls := a.opts.Calls
	if calls == nil {
		return disabled(CodeMQTTDisabled, "an MQTT gateway")
	}
	if _, err := queryParams(r); err != nil {
		return err
	}
	var req callRequest
	if err := a.decodeBody(w, r, &req, false); err != nil {
		return err
	}
	var payload []byte
	switch {
	case req.Payload != nil && req.PayloadBase64 != nil:
		return httperr.BadRequest("give payload or payload_base64, not both")
	case req.Payload != nil:
		payload = []byte(*req.Payload)
	case req.PayloadBase64 != nil:
		b, err := base64.StdEncoding.DecodeString(*req.PayloadBase64)
		if err != nil {
			return httperr.BadRequest("payload_base64: %v", err)
		}
		payload = b
	}
	if req.TimeoutMS < 0 {
		return httperr.BadRequest("timeout_ms %d: want 1000 to 60000 (0 or none: 5000)", req.TimeoutMS)
	}
	id := r.PathValue("id")
	ans, err := calls.Call(r.Context(), id, payload, time.Duration(req.TimeoutMS)*time.Millisecond)
	if err != nil {
		return err
	}
	out := callAnswer{ID: ans.ID.String(), Node: ans.Node, TookMS: float64(ans.Took.Microseconds()) / 1e3}
	if utf8.Valid(ans.Payload) {
		s := string(ans.Payload)
		out.Payload = &s
	} else {
		s := base64.StdEncoding.EncodeToString(ans.Payload)
		out.PayloadBase64 = &s
	}
	a.writeJSON(w, r, http.StatusOK, out)
	return nil
}

// The outcomes of a call as HTTP statuses.
var callSentinels = []httperr.Sentinel{
	{Err: rpc.ErrBadRequest, Status: http.StatusBadRequest, Code: CodeBadRequest},
	{Err: rpc.ErrNotConnected, Status: http.StatusNotFound, Code: CodeDeviceNotConnected},
	{Err: rpc.ErrTimeout, Status: http.StatusGatewayTimeout, Code: CodeDeviceTimeout, Msg: "the device did not answer in time"},
	{Err: rpc.ErrClosed, Status: http.StatusServiceUnavailable, Code: CodeShuttingDown, Msg: "server shutting down; retry later"},
}
