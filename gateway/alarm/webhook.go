package alarm

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// Defaults of Webhook.
const (
	DefaultWebhookTimeout     = 5 * time.Second
	DefaultWebhookAttempts    = 8
	DefaultWebhookQueue       = 256
	DefaultWebhookBackoff     = time.Second
	DefaultWebhookMaxBackoff  = time.Minute
	maxWebhookResponseSkipped = 64 << 10
)

// Webhook is an HTTP endpoint that receives every event as a JSON POST
// (one Event per request, Content-Type application/json). A 2xx answer
// delivers it; a 408, 429, 5xx or a network error is retried after
// Backoff, doubling up to MaxBackoff, at most Attempts times; any other
// answer gives up at once. Events wait in a queue of Queue entries; when
// it is full the oldest is dropped (ferrymq_alarm_webhook_dropped_total):
// the newest state of things matters most.
type Webhook struct {
	URL string
	// Headers are sent with every request (e.g. Authorization). Never
	// logged.
	Headers map[string]string
	// Timeout bounds one attempt; default DefaultWebhookTimeout.
	Timeout time.Duration
	// Attempts per event; default DefaultWebhookAttempts.
	Attempts int
	// Queue is how many events may wait; default DefaultWebhookQueue.
	Queue int
	// Backoff before the first retry, doubling up to MaxBackoff; defaults
	// DefaultWebhookBackoff, DefaultWebhookMaxBackoff.
	Backoff, MaxBackoff time.Duration
	// Client sends the requests; default one with no overall timeout (each
	// attempt has Timeout).
	Client *http.Client
}

func (w *Webhook) validate() error {
	u, err := url.Parse(w.URL)
	if err != nil {
		return fmt.Errorf("url: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return fmt.Errorf("url %q: want http:// or https:// and a host", w.URL)
	}
	if w.Timeout < 0 || w.Attempts < 0 || w.Queue < 0 || w.Backoff < 0 || w.MaxBackoff < 0 {
		return errors.New("timeout, attempts, queue and backoffs must not be negative")
	}
	return nil
}

// sender delivers events to one webhook from its queue.
type sender struct {
	w   Webhook
	log zerolog.Logger
	m   *metrics

	mu    sync.Mutex
	queue []Event
	wake  chan struct{} // cap 1: something was queued
}

func newSender(w Webhook, log zerolog.Logger, m *metrics) *sender {
	w.Timeout = cmp.Or(w.Timeout, DefaultWebhookTimeout)
	w.Attempts = cmp.Or(w.Attempts, DefaultWebhookAttempts)
	w.Queue = cmp.Or(w.Queue, DefaultWebhookQueue)
	w.Backoff = cmp.Or(w.Backoff, DefaultWebhookBackoff)
	w.MaxBackoff = max(cmp.Or(w.MaxBackoff, DefaultWebhookMaxBackoff), w.Backoff)
	if w.Client == nil {
		w.Client = &http.Client{}
	}
	return &sender{w: w, log: log.With().Str(fieldURL, redact(w.URL)).Logger(), m: m, wake: make(chan struct{}, 1)}
}

// redact drops a URL's user information and query (they may hold
// secrets) for the logs.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable url)"
	}
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	return u.String()
}

// enqueue never blocks: past the queue's size the oldest event goes.
func (s *sender) enqueue(events []Event) {
	s.mu.Lock()
	s.queue = append(s.queue, events...)
	if over := len(s.queue) - s.w.Queue; over > 0 {
		s.queue = append(s.queue[:0], s.queue[over:]...)
		s.m.webhookDropped.Add(float64(over))
		s.log.Warn().Int(fieldCount, over).Msg("alarm webhook queue full: oldest events dropped")
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *sender) take() (Event, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.queue) == 0 {
		return Event{}, false
	}
	e := s.queue[0]
	s.queue = s.queue[1:]
	return e, true
}

func (s *sender) run(ctx context.Context) {
	for {
		e, ok := s.take()
		if !ok {
			select {
			case <-ctx.Done():
				s.mu.Lock()
				left := len(s.queue)
				s.mu.Unlock()
				if left > 0 {
					s.log.Warn().Int(fieldCount, left).Msg("alarm webhook stopped with events not delivered")
				}
				return
			case <-s.wake:
				continue
			}
		}
		s.deliver(ctx, e)
	}
}

// deliver posts e, retrying; false once ctx is done.
func (s *sender) deliver(ctx context.Context, e Event) {
	body, err := json.Marshal(e)
	if err != nil {
		s.log.Error().Err(err).Msg("alarm event not encoded")
		return
	}
	backoff := s.w.Backoff
	for attempt := 1; ; attempt++ {
		retry, err := s.post(ctx, body)
		if err == nil {
			s.m.webhookSent.Inc()
			return
		}
		if ctx.Err() != nil {
			return
		}
		s.m.webhookFailures.Inc()
		if !retry || attempt >= s.w.Attempts {
			s.log.Error().Err(err).Int(fieldAttempt, attempt).Str(fieldKind, string(e.Kind)).Str(fieldSubject, e.Subject).
				Msg("alarm webhook gave up on an event")
			return
		}
		s.log.Debug().Err(err).Int(fieldAttempt, attempt).Msg("alarm webhook failed; retrying")
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, s.w.MaxBackoff)
	}
}

// post sends body once; retry says whether a failure may pass.
func (s *sender) post(ctx context.Context, body []byte) (retry bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.w.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.w.URL, bytes.NewReader(body))
	if err != nil {
		return false, fmt.Errorf("request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "ferrymq-alarm")
	for k, v := range s.w.Headers {
		req.Header.Set(k, v)
	}
	resp, err := s.w.Client.Do(req)
	if err != nil {
		return true, fmt.Errorf("post: %w", err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxWebhookResponseSkipped))
	_ = resp.Body.Close()
	switch c := resp.StatusCode; {
	case c >= 200 && c < 300:
		return false, nil
	case c == http.StatusRequestTimeout || c == http.StatusTooManyRequests || c >= 500:
		return true, fmt.Errorf("answered %s", resp.Status)
	default:
		return false, fmt.Errorf("answered %s", resp.Status)
	}
}
