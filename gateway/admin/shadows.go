package admin

import (
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/ferrymq/ferrymq/core/httperr"
	"github.com/ferrymq/ferrymq/core/shadow"
)

// pathShadow is a device's shadow.
const pathShadow = "/api/v1/devices/{id}/shadow"

// shadowDeleted answers DELETE /api/v1/devices/{id}/shadow.
type shadowDeleted struct {
	ClientID string `json:"client_id"`
	Version  int64  `json:"version"`
}

// shadowOf returns the shadow service and the path's client ID, checked:
// what every shadow endpoint starts with.
func (a *api) shadowOf(r *http.Request) (*shadow.Service, string, error) {
	if a.opts.Shadows == nil {
		return nil, "", disabled(CodeShadowsDisabled, "device shadows")
	}
	id := r.PathValue("id")
	if err := shadow.ValidClientID(id); err != nil {
		return nil, "", httperr.BadRequest("client ID: %v", err)
	}
	return a.opts.Shadows, id, nil
}

// getShadow: GET /api/v1/devices/{id}/shadow.
func (a *api) getShadow(w http.ResponseWriter, r *http.Request) error {
	svc, id, err := a.shadowOf(r)
	if err != nil {
		return err
	}
	d, err := svc.Get(r.Context(), id)
	if err != nil {
		return err
	}
	a.writeJSON(w, r, http.StatusOK, d)
	return nil
}

// updateShadow: PATCH /api/v1/devices/{id}/shadow with
// {"state":{"desired":{…}},"version":N}: a merge patch of desired.
func (a *api) updateShadow(w http.ResponseWriter, r *http.Request) error {
	svc, id, err := a.shadowOf(r)
	if err != nil {
		return err
	}
	limit := int64(svc.Limits().MaxBytes + shadow.RequestOverhead)
	if r.ContentLength > limit {
		w.Header().Set("Connection", "close")
		return httperr.New(http.StatusRequestEntityTooLarge, CodeShadowTooLarge, "request of %d bytes, limit %d", r.ContentLength, limit)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit+1))
	if err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			return httperr.New(http.StatusRequestEntityTooLarge, CodeShadowTooLarge, "request over %d bytes", limit)
		}
		return httperr.BadRequest("read request body: %v", err)
	}
	u, err := shadow.DecodeRequest(body, shadow.Desired, svc.Limits())
	if err != nil {
		svc.Refused(id, shadow.Desired, err)
		return err
	}
	d, err := svc.Update(r.Context(), id, u)
	if err != nil {
		return err
	}
	a.audit(r).Str(fieldClient, id).Int64("version", d.Version).Msg("shadow desired state updated")
	a.writeJSON(w, r, http.StatusOK, d)
	return nil
}

// deleteShadow: DELETE /api/v1/devices/{id}/shadow[?version=N].
func (a *api) deleteShadow(w http.ResponseWriter, r *http.Request) error {
	svc, id, err := a.shadowOf(r)
	if err != nil {
		return err
	}
	q, err := queryParams(r, "version")
	if err != nil {
		return err
	}
	var version int64
	if s := q.Get("version"); s != "" {
		if version, err = strconv.ParseInt(s, 10, 64); err != nil || version < 0 {
			return httperr.BadRequest("version %q: want an integer ≥ 0", s)
		}
	}
	v, err := svc.Delete(r.Context(), id, version)
	if err != nil {
		return err
	}
	a.audit(r).Str(fieldClient, id).Int64("version", v).Msg("shadow deleted")
	a.writeJSON(w, r, http.StatusOK, shadowDeleted{ClientID: id, Version: v})
	return nil
}
