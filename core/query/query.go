// Package query finds stored messages for operators: by key (sharding key
// or index key), by the MQTT client that published them, or by store time
// within a topic — paginated, with bounded work per request, on any
// core.Broker. A lookup by ID is Broker.Get.
package query

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ferrymq/ferrymq/core"
)

// Limits.
const (
	// DefaultMax is a page's size when the request gives none.
	DefaultMax = 50
	// MaxMax caps a page.
	MaxMax = 1000
	// MaxScan bounds the messages one request reads: a page may come back
	// short, with a cursor, when the scan ran out.
	MaxScan = 20_000
	// MaxTopics bounds the topics a query without a topic looks through.
	MaxTopics = 256
)

// PropClientID is the property the MQTT bridge names the publishing client
// in (bridge.PropClientID).
const PropClientID = "mqtt.clientid"

// ErrBadRequest is returned for a request that cannot be run: no criterion,
// a malformed cursor, an end before the begin.
var ErrBadRequest = errors.New("query: bad request")

// Request selects messages. Exactly one of Key, ClientID or a time range
// (Begin/End, with Topic) is the criterion; Begin and End also bound key
// and client queries.
type Request struct {
	// Topic limits the query to one topic; required for a time-range query.
	// Empty: every user topic (at most MaxTopics).
	Topic string
	// Key finds messages by sharding key or index key.
	Key string
	// ClientID finds messages an MQTT client published.
	ClientID string
	// Begin and End bound the store time (zero: unbounded).
	Begin, End time.Time
	// Max bounds the page: 0 means DefaultMax, at most MaxMax.
	Max int
	// Cursor continues from a previous page's Next.
	Cursor string
}

// Result is one page, oldest first.
type Result struct {
	Messages []*core.StoredMessage
	// Next continues the query; empty when there is nothing more.
	Next string
}

// position orders messages: store time, then commit-log offset.
type position struct {
	at     int64
	offset int64
}

func posOf(m *core.StoredMessage) position {
	return position{at: m.StoredAt.UnixNano(), offset: m.CommitLogOffset}
}

func (p position) after(q position) bool {
	return p.at > q.at || p.at == q.at && p.offset > q.offset
}

func (p position) String() string {
	return strconv.FormatInt(p.at, 10) + "-" + strconv.FormatInt(p.offset, 10)
}

func parseCursor(s string) (position, error) {
	a, b, ok := strings.Cut(s, "-")
	at, err1 := strconv.ParseInt(a, 10, 64)
	off, err2 := strconv.ParseInt(b, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return position{}, fmt.Errorf("%w: cursor %q: pass back a page's next value", ErrBadRequest, s)
	}
	return position{at: at, offset: off}, nil
}

// Run runs one page of a query.
func Run(ctx context.Context, b core.Broker, req Request) (Result, error) {
	max := req.Max
	if max <= 0 {
		max = DefaultMax
	}
	max = min(max, MaxMax)
	if !req.End.IsZero() && req.End.Before(req.Begin) {
		return Result{}, fmt.Errorf("%w: end %s is before begin %s", ErrBadRequest, req.End.Format(time.RFC3339), req.Begin.Format(time.RFC3339))
	}
	var from position
	hasFrom := req.Cursor != ""
	if hasFrom {
		var err error
		if from, err = parseCursor(req.Cursor); err != nil {
			return Result{}, err
		}
	}
	begin := req.Begin
	if hasFrom && time.Unix(0, from.at).After(begin) {
		begin = time.Unix(0, from.at)
	}
	keep := func(m *core.StoredMessage) bool {
		if hasFrom && !posOf(m).after(from) {
			return false
		}
		return req.End.IsZero() || !m.StoredAt.After(req.End)
	}
	switch {
	case req.Key != "" || req.ClientID != "":
		if req.Key != "" && req.ClientID != "" {
			return Result{}, fmt.Errorf("%w: give key or client, not both", ErrBadRequest)
		}
		key := cmp.Or(req.Key, req.ClientID)
		topics, err := topicsOf(ctx, b, req.Topic)
		if err != nil {
			return Result{}, err
		}
		var all []*core.StoredMessage
		for _, t := range topics {
			// One extra, to know whether a next page exists.
			msgs, err := b.FindByKey(ctx, t, key, core.KeyQuery{Begin: begin, End: req.End, Max: min(MaxScan, max+1+countSame(hasFrom))})
			if err != nil && !errors.Is(err, core.ErrMessageNotFound) && !errors.Is(err, core.ErrTopicNotFound) {
				return Result{}, err
			}
			for _, m := range msgs {
				if keep(m) && (req.ClientID == "" || m.Properties[PropClientID] == req.ClientID) {
					all = append(all, m)
				}
			}
		}
		return page(all, max), nil
	case req.Topic != "" && (!req.Begin.IsZero() || !req.End.IsZero() || hasFrom):
		return byTime(ctx, b, req.Topic, begin, max, keep)
	case req.Topic != "":
		return Result{}, fmt.Errorf("%w: a query of topic %s needs a key, a client or a time range", ErrBadRequest, req.Topic)
	}
	return Result{}, fmt.Errorf("%w: give a key, a client, or a topic and a time range", ErrBadRequest)
}

// countSame allows for the messages at the cursor's own time that the key
// index returns again.
func countSame(hasFrom bool) int {
	if hasFrom {
		return 64
	}
	return 0
}

func topicsOf(ctx context.Context, b core.Broker, topic string) ([]string, error) {
	if topic != "" {
		return []string{topic}, nil
	}
	infos, err := b.Topics(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, t := range infos {
		if core.ValidateTopic(t.Name) == nil {
			out = append(out, t.Name)
		}
		if len(out) == MaxTopics {
			break
		}
	}
	return out, nil
}

// page sorts msgs and cuts the first max, with a cursor if more remain.
func page(msgs []*core.StoredMessage, max int) Result {
	slices.SortFunc(msgs, func(a, b *core.StoredMessage) int {
		pa, pb := posOf(a), posOf(b)
		return cmp.Or(cmp.Compare(pa.at, pb.at), cmp.Compare(pa.offset, pb.offset))
	})
	msgs = slices.CompactFunc(msgs, func(a, b *core.StoredMessage) bool { return a.ID == b.ID })
	if len(msgs) <= max {
		return Result{Messages: msgs}
	}
	return Result{Messages: msgs[:max], Next: posOf(msgs[max-1]).String()}
}

// byTime merges the queues of topic from begin on.
func byTime(ctx context.Context, b core.Broker, topic string, begin time.Time, max int, keep func(*core.StoredMessage) bool) (Result, error) {
	info, err := b.Topic(ctx, topic)
	if err != nil {
		return Result{}, err
	}
	var all []*core.StoredMessage
	budget := MaxScan
	perQueue := max + 1
	truncated := false
	for q := range len(info.Ranges) { // retired queues of a resized topic too
		off, err := b.OffsetAt(ctx, topic, q, begin)
		if err != nil {
			return Result{}, err
		}
		got := 0
		for got < perQueue && budget > 0 {
			res, err := b.Read(ctx, core.ReadRequest{Topic: topic, Queue: q, Offset: off, MaxCount: min(256, budget)})
			if err != nil {
				return Result{}, err
			}
			if len(res.Messages) == 0 {
				break
			}
			budget -= len(res.Messages)
			stop := false
			for _, m := range res.Messages {
				if !keep(m) {
					if !m.StoredAt.Before(begin) && !(m.StoredAt.Equal(begin)) {
						stop = true // past the end
						break
					}
					continue
				}
				all = append(all, m)
				got++
			}
			if stop {
				break
			}
			off = res.NextOffset
		}
		if budget <= 0 {
			truncated = true
			break
		}
	}
	r := page(all, max)
	if truncated && r.Next == "" && len(r.Messages) > 0 {
		r.Next = posOf(r.Messages[len(r.Messages)-1]).String()
	}
	return r, nil
}
