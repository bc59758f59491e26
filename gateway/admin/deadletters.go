package admin

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/httperr"
	"github.com/ferrymq/ferrymq/core/retry"
)

// Bounds of one dead-letter listing: the stored bytes one Read loads (at
// least one message is always read), and the stored bytes one page reads in
// all — a page of large dead letters comes back short, with a cursor.
const (
	readBytes = 1 << 20
	pageBytes = 8 << 20
)

// deadLetter is one message of a group's dead-letter topic.
type deadLetter struct {
	ID          core.MessageID    `json:"id"`
	Queue       int               `json:"queue"`
	QueueOffset int64             `json:"queue_offset"`
	OriginTopic string            `json:"origin_topic,omitempty"`
	OriginID    string            `json:"origin_id,omitempty"`
	Reason      string            `json:"reason,omitempty"`
	Reconsume   int               `json:"reconsume"`
	Key         string            `json:"key,omitempty"`
	Tag         string            `json:"tag,omitempty"`
	Properties  map[string]string `json:"properties,omitempty"`
	Size        int               `json:"size"`
	Body        *string           `json:"body,omitempty"`
	BodyBase64  string            `json:"body_base64,omitempty"`
	Truncated   bool              `json:"truncated,omitempty"`
	BornAt      time.Time         `json:"born_at,omitzero"`
	StoredAt    time.Time         `json:"stored_at"`
	// Redriven is true once Redrive moved it back (it stays listed).
	Redriven bool `json:"redriven"`
}

func toDeadLetter(m *core.StoredMessage, redriven bool) deadLetter {
	out := deadLetter{
		ID: m.ID, Queue: m.Queue, QueueOffset: m.QueueOffset,
		OriginTopic: m.Properties[retry.PropOriginTopic], OriginID: m.Properties[retry.PropOriginID],
		Reason: m.Properties[retry.PropReason], Reconsume: m.ReconsumeCount,
		Key: m.ShardingKey, Tag: m.Tag, Size: len(m.Body), StoredAt: m.StoredAt.UTC(), Redriven: redriven,
	}
	for k, v := range m.Properties {
		switch k {
		case retry.PropOriginTopic, retry.PropOriginID, retry.PropReason:
		default:
			if out.Properties == nil {
				out.Properties = map[string]string{}
			}
			out.Properties[k] = v
		}
	}
	if !m.BornAt.IsZero() {
		out.BornAt = m.BornAt.UTC()
	}
	out.Body, out.BodyBase64, out.Truncated = preview(m.Body)
	return out
}

// deadLetterPage is one page of GET /api/v1/groups/{group}/dead-letters.
type deadLetterPage struct {
	Group       string       `json:"group"`
	Topic       string       `json:"topic"`
	DeadLetters []deadLetter `json:"dead_letters"`
	Next        string       `json:"next,omitempty"`
}

// parseQueueCursor parses "queue:offset".
func parseQueueCursor(s string) (int, int64, error) {
	if s == "" {
		return 0, 0, nil
	}
	qs, os, ok := strings.Cut(s, ":")
	q, err1 := strconv.Atoi(qs)
	off, err2 := strconv.ParseInt(os, 10, 64)
	if !ok || err1 != nil || err2 != nil || q < 0 || off < 0 {
		return 0, 0, httperr.BadRequest("cursor: want the next value of a previous page")
	}
	return q, off, nil
}

// listDeadLetters serves GET /api/v1/groups/{group}/dead-letters?max=&cursor=:
// the group's dead-letter topic, oldest first, queue by queue. A page holds
// at most max dead letters and pageBytes of stored messages; follow next.
func (a *api) listDeadLetters(w http.ResponseWriter, r *http.Request) error {
	b, err := a.broker()
	if err != nil {
		return err
	}
	name, err := pathGroupName(r)
	if err != nil {
		return err
	}
	q, err := queryParams(r, "max", "cursor")
	if err != nil {
		return err
	}
	n, cursor, err := a.pageParams(q)
	if err != nil {
		return err
	}
	startQ, startOff, err := parseQueueCursor(cursor)
	if err != nil {
		return err
	}
	dlq := retry.DLQTopic(name)
	page := deadLetterPage{Group: name, Topic: dlq, DeadLetters: []deadLetter{}}
	info, err := b.Topic(r.Context(), dlq)
	if errors.Is(err, core.ErrTopicNotFound) {
		a.writeJSON(w, r, http.StatusOK, page) // never dead-lettered anything
		return nil
	}
	if err != nil {
		return err
	}
	scanned := 0
	full := func() bool { return len(page.DeadLetters) >= n || scanned >= pageBytes }
	for qi := startQ; qi < len(info.Ranges); qi++ {
		rg := info.Ranges[qi]
		off := rg.Min
		if qi == startQ {
			off = max(off, startOff)
		}
		redrivenTo, err := b.CommittedOffset(r.Context(), retry.RedriveGroup, dlq, qi)
		if errors.Is(err, core.ErrNoCommittedOffset) {
			redrivenTo, err = 0, nil
		}
		if err != nil {
			return err
		}
		for off < rg.Max && !full() {
			res, err := b.Read(r.Context(), core.ReadRequest{Topic: dlq, Queue: qi, Offset: off,
				MaxCount: n - len(page.DeadLetters), MaxBytes: readBytes})
			if err != nil {
				var ce *core.CorruptError
				if !errors.As(err, &ce) || ce.QueueOffset < off {
					return fmt.Errorf("read %s/%d at %d: %w", dlq, qi, off, err)
				}
				a.log.Error().Err(err).Str(fieldTopic, dlq).Int64("offset", ce.QueueOffset).Msg("corrupt dead letter skipped")
				res.NextOffset = ce.QueueOffset + 1
			}
			if res.NextOffset <= off {
				break
			}
			for _, m := range res.Messages {
				page.DeadLetters = append(page.DeadLetters, toDeadLetter(m, m.QueueOffset < redrivenTo))
				scanned += m.Size
			}
			off = res.NextOffset
		}
		if !full() {
			continue
		}
		switch {
		case off < rg.Max:
			page.Next = fmt.Sprintf("%d:%d", qi, off)
		case qi+1 < len(info.Ranges):
			page.Next = fmt.Sprintf("%d:0", qi+1)
		}
		break
	}
	a.writeJSON(w, r, http.StatusOK, page)
	return nil
}

// redriveRequest is the body of POST /api/v1/groups/{group}/dead-letters/redrive;
// it may be empty.
type redriveRequest struct {
	Max *int `json:"max"`
}

type redriveResult struct {
	Group    string `json:"group"`
	Redriven int    `json:"redriven"`
}

// redrive serves POST /api/v1/groups/{group}/dead-letters/redrive: moves up
// to max dead letters (default DefaultRedrive, cut to MaxRedrive) back to
// their original topics.
func (a *api) redrive(w http.ResponseWriter, r *http.Request) error {
	if a.opts.Retry == nil {
		return disabled(CodeRetryDisabled, "the retry service")
	}
	name, err := pathGroupName(r)
	if err != nil {
		return err
	}
	var req redriveRequest
	if err := a.decodeBody(w, r, &req, true); err != nil {
		return err
	}
	n := DefaultRedrive
	if req.Max != nil {
		if *req.Max < 1 {
			return httperr.BadRequest("max %d: want a positive number", *req.Max)
		}
		n = min(*req.Max, MaxRedrive)
	}
	moved, err := a.opts.Retry.Redrive(r.Context(), name, n)
	if moved > 0 {
		a.audit(r).Str(fieldGroup, name).Int(fieldCount, moved).Msg("dead letters redriven")
	}
	if err != nil {
		return err
	}
	a.writeJSON(w, r, http.StatusOK, redriveResult{Group: name, Redriven: moved})
	return nil
}
