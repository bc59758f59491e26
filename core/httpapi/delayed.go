package httpapi

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/ferrymq/ferrymq/core/httperr"
	"github.com/ferrymq/ferrymq/core/wire"
)

// delayedPage is one page of GET /api/v1/delayed.
type delayedPage struct {
	Pending []wire.Delayed `json:"pending"`
	// Next is the cursor of the next page; empty when there is none.
	Next string `json:"next,omitempty"`
}

func (a *api) delayService(w http.ResponseWriter) (*delay.Service, error) {
	if err := a.elsewhere(w, ""); err != nil {
		return nil, err
	}
	if a.opts.Delay == nil {
		return nil, httperr.New(http.StatusNotImplemented, CodeDelayDisabled, "this server runs without delayed delivery")
	}
	return a.opts.Delay, nil
}

// elsewhere is Options.Elsewhere's answer for shard (nil without it).
func (a *api) elsewhere(w http.ResponseWriter, shard string) error {
	if a.opts.Elsewhere == nil {
		return nil
	}
	return a.opts.Elsewhere(w, shard)
}

func pathID(r *http.Request) (core.MessageID, error) {
	id, err := core.ParseMessageID(r.PathValue("id"))
	if err != nil {
		return id, httperr.New(http.StatusBadRequest, CodeBadRequest, "message id: want 32 hex characters")
	}
	return id, nil
}

// listDelayed serves GET /api/v1/delayed?topic=&max=&cursor=.
func (a *api) listDelayed(w http.ResponseWriter, r *http.Request) error {
	d, err := a.delayService(w)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	req := delay.ListRequest{Topic: q.Get("topic")}
	if v := q.Get("max"); v != "" {
		if req.Max, err = strconv.Atoi(v); err != nil || req.Max < 1 {
			return httperr.BadRequest("max: want a positive number")
		}
	}
	if v := q.Get("cursor"); v != "" {
		l, o, ok := strings.Cut(v, ":")
		level, err1 := strconv.Atoi(l)
		off, err2 := strconv.ParseInt(o, 10, 64)
		if !ok || err1 != nil || err2 != nil || level < 0 || off < 0 {
			return httperr.BadRequest("cursor: want the next value of a previous page")
		}
		req.Cursor = delay.Cursor{Level: level, Offset: off}
	}
	res, err := d.List(r.Context(), req)
	if err != nil {
		return err
	}
	page := delayedPage{Pending: make([]wire.Delayed, 0, len(res.Pending))}
	for _, p := range res.Pending {
		page.Pending = append(page.Pending, wire.DelayedOf(p))
	}
	if !res.Done {
		page.Next = fmt.Sprintf("%d:%d", res.Next.Level, res.Next.Offset)
	}
	a.writeJSON(w, r, http.StatusOK, page)
	return nil
}

// getDelayed serves GET /api/v1/delayed/{id}.
func (a *api) getDelayed(w http.ResponseWriter, r *http.Request) error {
	d, err := a.delayService(w)
	if err != nil {
		return err
	}
	id, err := pathID(r)
	if err != nil {
		return err
	}
	p, err := d.Lookup(r.Context(), id)
	if err != nil {
		return err
	}
	a.writeJSON(w, r, http.StatusOK, wire.DelayedOf(p))
	return nil
}

// cancelDelayed serves DELETE /api/v1/delayed/{id}.
func (a *api) cancelDelayed(w http.ResponseWriter, r *http.Request) error {
	d, err := a.delayService(w)
	if err != nil {
		return err
	}
	id, err := pathID(r)
	if err != nil {
		return err
	}
	p, err := d.Cancel(r.Context(), id)
	if err != nil {
		return err
	}
	a.writeJSON(w, r, http.StatusOK, wire.DelayedOf(p))
	return nil
}
