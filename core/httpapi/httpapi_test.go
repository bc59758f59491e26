package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/pop"
	"github.com/ferrymq/ferrymq/core/retry"
	"github.com/ferrymq/ferrymq/core/store"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitFor bounds every wait of these tests.
const waitFor = 10 * time.Second

// env is a store, retry and pop services and the API on an httptest server
// at 127.0.0.1, all closed at the end of the test (server first).
type env struct {
	st   *store.Store
	b    *watchBroker
	pop  *pop.Service
	srv  *httptest.Server
	logs *logBuffer
}

type envConfig struct {
	opts    Options // Broker, Pop and Logger are filled in
	noPop   bool
	storeOp store.Options
	popOp   pop.Options
	retryOp retry.Options
}

func newEnv(t testing.TB, cfg envConfig) *env {
	t.Helper()
	st, err := store.Open(t.TempDir(), cfg.storeOp)
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	e := &env{st: st, b: &watchBroker{Broker: st, topicCalls: make(chan string, 256)}, logs: &logBuffer{}}
	opts := cfg.opts
	opts.Broker = e.b
	if !cfg.noPop {
		r, err := retry.New(e.b, cfg.retryOp)
		require.NoError(t, err)
		r.Start()
		t.Cleanup(func() { _ = r.Close() })
		e.pop, err = pop.New(e.b, r, cfg.popOp)
		require.NoError(t, err)
		e.pop.Start()
		t.Cleanup(func() { _ = e.pop.Close() })
		opts.Pop = e.pop
	}
	log := zerolog.New(e.logs).Level(zerolog.DebugLevel)
	opts.Logger = &log
	h, err := New(opts)
	require.NoError(t, err)
	e.srv = httptest.NewServer(h) // listens on 127.0.0.1:0
	t.Cleanup(e.srv.Close)
	return e
}

// watchBroker reports every Topic call, so a test knows when a pop has
// taken its snapshot of the queues.
type watchBroker struct {
	core.Broker
	topicCalls chan string
}

func (w *watchBroker) Topic(ctx context.Context, name string) (core.TopicInfo, error) {
	info, err := w.Broker.Topic(ctx, name)
	select {
	case w.topicCalls <- name:
	default:
	}
	return info, err
}

// logBuffer collects log lines; safe for concurrent use.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// lines returns the log lines that contain s.
func (l *logBuffer) lines(s string) []string {
	var out []string
	for line := range strings.SplitSeq(l.String(), "\n") {
		if line != "" && strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return out
}

// req describes one request.
type req struct {
	method      string
	path        string
	contentType string
	header      http.Header
	body        io.Reader
	ctx         context.Context
}

// do sends r and returns the response with its body read.
func (e *env) do(t testing.TB, r req) (*http.Response, []byte) {
	t.Helper()
	ctx := r.ctx
	if ctx == nil {
		ctx = t.Context()
	}
	hr, err := http.NewRequestWithContext(ctx, r.method, e.srv.URL+r.path, r.body)
	require.NoError(t, err)
	for k, vs := range r.header {
		hr.Header[k] = vs
	}
	if r.contentType != "" {
		hr.Header.Set("Content-Type", r.contentType)
	}
	resp, err := e.srv.Client().Do(hr)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, body
}

// postJSON posts body as JSON and requires status want.
func (e *env) postJSON(t testing.TB, path, body string, want int) []byte {
	t.Helper()
	resp, b := e.do(t, req{method: http.MethodPost, path: path, contentType: "application/json", body: strings.NewReader(body)})
	require.Equal(t, want, resp.StatusCode, "body: %s", b)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	return b
}

// get requires status want for a GET.
func (e *env) get(t testing.TB, path string, want int) []byte {
	t.Helper()
	resp, b := e.do(t, req{method: http.MethodGet, path: path})
	require.Equal(t, want, resp.StatusCode, "body: %s", b)
	return b
}

// The documented wire format, decoded strictly: a field the docs do not
// name fails the test.

type sendResultJSON struct {
	ID          string    `json:"id"`
	Topic       string    `json:"topic"`
	Queue       int       `json:"queue"`
	QueueOffset int64     `json:"queue_offset"`
	StoredAt    time.Time `json:"stored_at"`
}

type messageJSON struct {
	ID          string            `json:"id"`
	Handle      string            `json:"handle"`
	Attempt     int               `json:"attempt"`
	VisibleAt   time.Time         `json:"visible_at"`
	Topic       string            `json:"topic"`
	Queue       int               `json:"queue"`
	QueueOffset int64             `json:"queue_offset"`
	Key         string            `json:"key"`
	Tag         string            `json:"tag"`
	Keys        []string          `json:"keys"`
	Properties  map[string]string `json:"properties"`
	Body        *string           `json:"body"`
	BodyBase64  *string           `json:"body_base64"`
	DeliverAt   *time.Time        `json:"deliver_at"`
	BornAt      time.Time         `json:"born_at"`
	StoredAt    time.Time         `json:"stored_at"`
	Reconsume   int               `json:"reconsume"`
}

type popJSON struct {
	Messages []messageJSON `json:"messages"`
}

type ackJSON struct {
	Results []struct {
		Handle string `json:"handle"`
		OK     bool   `json:"ok"`
		Error  string `json:"error"`
		Code   string `json:"code"`
	} `json:"results"`
}

type errorJSON struct {
	Error string `json:"error"`
	Code  string `json:"code"`
}

func decode[T any](t testing.TB, b []byte) T {
	t.Helper()
	var v T
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&v), "body: %s", b)
	return v
}

// popN pops from topic for group and requires n messages.
func (e *env) popN(t testing.TB, topic, query string, n int) []messageJSON {
	t.Helper()
	got := decode[popJSON](t, e.get(t, "/api/v1/topics/"+topic+"/messages?"+query, http.StatusOK))
	require.Len(t, got.Messages, n)
	return got.Messages
}

func TestNewOptions(t *testing.T) {
	_, err := New(Options{})
	require.ErrorIs(t, err, ErrBadOptions)

	st, err := store.Open(t.TempDir(), store.Options{})
	require.NoError(t, err)
	defer st.Close()
	_, err = New(Options{Broker: st, MaxBodyBytes: -1, MaxWait: -1, MaxBatch: -1})
	require.ErrorIs(t, err, ErrBadOptions)
	for _, s := range []string{"body", "wait", "batch"} {
		require.ErrorContains(t, err, s, "every problem is listed")
	}
	h, err := New(Options{Broker: st})
	require.NoError(t, err)
	require.NotNil(t, h)
}

func TestClassify(t *testing.T) {
	ctx := context.Background()
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	secret := errors.New("write /var/lib/ferrymq/commitlog/0: no space left on device")
	for _, tc := range []struct {
		name   string
		ctx    context.Context
		err    error
		status int
		code   string
	}{
		{"store failed", ctx, errors.Join(core.ErrStoreFailed, secret), 503, CodeStoreFailed},
		{"closed", ctx, core.ErrClosed, 503, CodeShuttingDown},
		{"corrupt", ctx, &core.CorruptError{Topic: "t", Err: secret}, 500, CodeCorrupt},
		{"request canceled", canceled, context.Canceled, 503, CodeCanceled},
		{"cancel not of this request", ctx, context.Canceled, 500, CodeInternal},
		{"unknown", ctx, secret, 500, CodeInternal},
		{"topic not found", ctx, core.ErrTopicNotFound, 404, CodeTopicNotFound},
		{"message not found", ctx, core.ErrMessageNotFound, 404, CodeMessageNotFound},
		{"handle expired", ctx, pop.ErrHandleExpired, 409, CodeHandleExpired},
		{"body", ctx, &http.MaxBytesError{Limit: 10}, 413, CodeBodyTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := classify(tc.ctx, tc.err)
			require.Equal(t, tc.status, e.Status)
			require.Equal(t, tc.code, e.Code)
			if e.Status >= 500 {
				require.NotContains(t, e.Msg, "/var/lib", "5xx answers never carry the cause")
			}
		})
	}
}
