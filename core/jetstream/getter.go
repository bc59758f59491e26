package jetstream

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// getter runs batched direct gets ($JS.API.DIRECT.GET.<stream> with a
// "batch": the server answers with up to batch messages, then an
// end-of-batch status, 204 EOB, or 404 when nothing matched) over one
// wildcard reply subscription, so a read costs one round trip and no
// subscribe/unsubscribe. Direct gets may be answered by any replica that is
// current; a replica can trail an acknowledged publish by a moment.
type getter struct {
	nc      *nats.Conn
	prefix  string
	sub     *nats.Subscription
	timeout time.Duration

	mu    sync.Mutex
	next  uint64
	calls map[string]*getCall
}

type getCall struct {
	msgs []*nats.Msg
	err  error
	done chan struct{}
}

// directReq is the server's JSApiMsgGetRequest (the fields we use).
type directReq struct {
	Seq      uint64     `json:"seq,omitempty"`
	NextFor  string     `json:"next_by_subj,omitempty"`
	Batch    int        `json:"batch,omitempty"`
	MaxBytes int        `json:"max_bytes,omitempty"`
	Start    *time.Time `json:"start_time,omitempty"`
	// MultiLast asks for the last message of each subject (resize.go).
	MultiLast []string `json:"multi_last,omitempty"`
}

func newGetter(nc *nats.Conn, timeout time.Duration) (*getter, error) {
	g := &getter{nc: nc, prefix: nc.NewRespInbox() + ".", timeout: timeout, calls: map[string]*getCall{}}
	sub, err := nc.Subscribe(g.prefix+"*", g.onMsg)
	if err != nil {
		return nil, fmt.Errorf("jetstream: direct get subscription: %w", err)
	}
	if err := sub.SetPendingLimits(-1, 256<<20); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("jetstream: direct get subscription limits: %w", err)
	}
	g.sub = sub
	return g, nil
}

func (g *getter) close() { _ = g.sub.Unsubscribe() }

func (g *getter) onMsg(m *nats.Msg) {
	tok := m.Subject[len(g.prefix):]
	g.mu.Lock()
	c := g.calls[tok]
	if c == nil {
		g.mu.Unlock()
		return // a late answer to a call that gave up
	}
	finished := false
	if len(m.Data) == 0 && m.Header.Get("Status") != "" {
		finished = true
		switch st := m.Header.Get("Status"); st {
		case "204", "404": // end of batch; nothing matched
		default:
			c.err = fmt.Errorf("jetstream: direct get: status %s %s", st, m.Header.Get("Description"))
		}
	} else {
		c.msgs = append(c.msgs, m)
	}
	if finished {
		delete(g.calls, tok)
		close(c.done)
	}
	g.mu.Unlock()
}

// do sends req for stream and returns the messages of the answer, in
// sequence order (none when nothing matched).
func (g *getter) do(ctx context.Context, stream string, req directReq) ([]*nats.Msg, error) {
	if req.Batch < 1 {
		req.Batch = 1
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("jetstream: direct get request: %w", err)
	}
	c := &getCall{done: make(chan struct{})}
	g.mu.Lock()
	g.next++
	tok := strconv.FormatUint(g.next, 36)
	g.calls[tok] = c
	g.mu.Unlock()
	forget := func() {
		g.mu.Lock()
		delete(g.calls, tok)
		g.mu.Unlock()
	}
	if err := g.nc.PublishRequest("$JS.API.DIRECT.GET."+stream, g.prefix+tok, body); err != nil {
		forget()
		return nil, fmt.Errorf("%w: direct get from %s: %w", ErrUnavailable, stream, err)
	}
	t := time.NewTimer(g.timeout)
	defer t.Stop()
	select {
	case <-c.done:
		return c.msgs, c.err
	case <-ctx.Done():
		forget()
		return nil, ctx.Err()
	case <-t.C:
		forget()
		if !g.nc.IsConnected() {
			return nil, fmt.Errorf("%w: direct get from %s: not connected", ErrUnavailable, stream)
		}
		return nil, fmt.Errorf("%w: direct get from %s: no answer in %v (stream gone, no leader, or no direct access)", ErrUnavailable, stream, g.timeout)
	}
}

// rawMsg is one message of a direct get answer.
type rawMsg struct {
	subject string
	seq     uint64
	time    time.Time
	data    []byte
	pending uint64 // matching messages after this one (batch answers)
}

func parseDirect(m *nats.Msg) (rawMsg, error) {
	r := rawMsg{subject: m.Header.Get("Nats-Subject"), data: m.Data}
	var err error
	if r.seq, err = strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64); err != nil {
		return r, fmt.Errorf("%w: direct get answer without a sequence", ErrBadRecord)
	}
	if r.time, err = time.Parse(time.RFC3339Nano, m.Header.Get("Nats-Time-Stamp")); err != nil {
		return r, fmt.Errorf("%w: direct get answer without a time", ErrBadRecord)
	}
	if np := m.Header.Get("Nats-Num-Pending"); np != "" {
		r.pending, _ = strconv.ParseUint(np, 10, 64)
	}
	if !strings.HasPrefix(r.subject, subjectPrefix) && !strings.HasPrefix(r.subject, keysPrefix) && !strings.HasPrefix(r.subject, markerPrefix) {
		return r, fmt.Errorf("%w: subject %q", ErrBadRecord, r.subject)
	}
	return r, nil
}
