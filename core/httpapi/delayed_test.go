package httpapi

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/ferrymq/ferrymq/core/store"
)

// newDelayEnv is a store, a started delay service over it and the API
// producing through the service's broker, on an httptest server at
// 127.0.0.1. Cleanup closes the server, then the service, then the store.
func newDelayEnv(t testing.TB) (*env, *delay.Service) {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "store"), store.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	svc, err := delay.New(st, filepath.Join(dir, "delay"), delay.Options{PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	svc.Start()
	t.Cleanup(func() { require.NoError(t, svc.Close()) })
	e := &env{st: st, logs: &logBuffer{}}
	log := zerolog.New(e.logs).Level(zerolog.DebugLevel)
	h, err := New(Options{Broker: svc.Broker(), Delay: svc, Logger: &log})
	require.NoError(t, err)
	e.srv = httptest.NewServer(h)
	t.Cleanup(e.srv.Close)
	return e, svc
}

// The wire format of the delayed endpoints, decoded strictly.

type delayedJSON struct {
	ID        string    `json:"id"`
	Topic     string    `json:"topic"`
	Due       time.Time `json:"due"`
	Level     int       `json:"level"`
	Exit      time.Time `json:"exit"`
	Key       string    `json:"key"`
	Tag       string    `json:"tag"`
	Size      int       `json:"size"`
	Cancelled bool      `json:"cancelled"`
}

type delayedPageJSON struct {
	Pending []delayedJSON `json:"pending"`
	Next    string        `json:"next"`
}

// inTopic returns every message stored in topic, queue by queue; none when
// the topic does not exist.
func (e *env) inTopic(t testing.TB, topic string) []*core.StoredMessage {
	t.Helper()
	info, err := e.st.Topic(t.Context(), topic)
	if err != nil {
		require.ErrorIs(t, err, core.ErrTopicNotFound)
		return nil
	}
	var out []*core.StoredMessage
	for q := range info.Queues {
		for off := int64(0); ; {
			res, err := e.st.Read(t.Context(), core.ReadRequest{Topic: topic, Queue: q, Offset: off, MaxCount: 1000})
			require.NoError(t, err)
			if len(res.Messages) == 0 {
				break
			}
			out = append(out, res.Messages...)
			off = res.NextOffset
		}
	}
	return out
}

// produceDelayed posts one raw message to topic with the delay header and
// returns the answer, which must be a 201 with queue and offset -1.
func (e *env) produceDelayed(t testing.TB, topic, delayHeader, body string) sendResultJSON {
	t.Helper()
	resp, b := e.do(t, req{method: http.MethodPost, path: "/api/v1/topics/" + topic + "/messages",
		header: http.Header{"X-Ferrymq-Delay": {delayHeader}}, body: strings.NewReader(body)})
	require.Equal(t, http.StatusCreated, resp.StatusCode, "body: %s", b)
	res := decode[sendResultJSON](t, b)
	require.Equal(t, topic, res.Topic)
	require.Equal(t, -1, res.Queue, "the queue is known only at delivery")
	require.Equal(t, int64(-1), res.QueueOffset)
	return res
}

// requireError requires an error answer with status and code.
func requireError(t testing.TB, resp *http.Response, b []byte, status int, code string) {
	t.Helper()
	require.Equal(t, status, resp.StatusCode, "body: %s", b)
	require.Equal(t, code, decode[errorJSON](t, b).Code)
}

// A produce with a delay (header or JSON field) is answered at once with
// queue -1, is listed as pending, and reaches its topic at its due time,
// not before; malformed, negative, too long or past delays are refused.
func TestProduceDelayed(t *testing.T) {
	e, _ := newDelayEnv(t)
	before := time.Now()
	raw := e.produceDelayed(t, "reminders", "1s", "raw later")
	resp, b := e.do(t, req{method: http.MethodPost, path: "/api/v1/topics/reminders/messages",
		contentType: "application/json", body: strings.NewReader(`{"key":"k1","tag":"t1","delay":"1s","body":"json later"}`)})
	require.Equal(t, http.StatusCreated, resp.StatusCode, "body: %s", b)
	js := decode[sendResultJSON](t, b)
	require.Equal(t, -1, js.Queue)
	require.Equal(t, int64(-1), js.QueueOffset)
	require.Empty(t, e.inTopic(t, "reminders"), "nothing in the topic before the due time")

	page := decode[delayedPageJSON](t, e.get(t, "/api/v1/delayed", http.StatusOK))
	require.Empty(t, page.Next, "everything on one page")
	require.Len(t, page.Pending, 2)
	due := map[string]time.Time{}
	for _, p := range page.Pending {
		require.Equal(t, "reminders", p.Topic)
		require.False(t, p.Cancelled)
		require.WithinRange(t, p.Due, before.Add(time.Second), time.Now().Add(time.Second))
		due[p.ID] = p.Due
	}
	require.Contains(t, due, raw.ID)
	require.Contains(t, due, js.ID)
	one := decode[delayedJSON](t, e.get(t, "/api/v1/delayed/"+js.ID, http.StatusOK))
	require.Equal(t, js.ID, one.ID)
	require.Equal(t, "k1", one.Key)
	require.Equal(t, "t1", one.Tag)
	require.Equal(t, len("json later"), one.Size)
	filtered := decode[delayedPageJSON](t, e.get(t, "/api/v1/delayed?topic=other", http.StatusOK))
	require.Empty(t, filtered.Pending, "the topic filter")

	var got []*core.StoredMessage
	require.Eventually(t, func() bool {
		got = e.inTopic(t, "reminders")
		return len(got) == 2
	}, 5*time.Second, 10*time.Millisecond)
	bodies := map[string]string{}
	for _, m := range got {
		id := m.Properties[delay.PropID]
		require.Contains(t, due, id, "the delivered message names the ID its producer got")
		require.False(t, m.StoredAt.Before(due[id]), "never early: stored %v, due %v", m.StoredAt, due[id])
		require.True(t, m.DeliverAt.Equal(due[id]))
		for _, p := range []string{delay.PropTopic, delay.PropDue, delay.PropShardingKey} {
			require.NotContains(t, m.Properties, p, "waiting properties removed")
		}
		bodies[id] = string(m.Body)
	}
	require.Equal(t, map[string]string{raw.ID: "raw later", js.ID: "json later"}, bodies)
	for _, m := range got {
		if m.Properties[delay.PropID] == js.ID {
			require.Equal(t, "k1", m.ShardingKey)
			require.Equal(t, "t1", m.Tag)
		}
	}
	require.Empty(t, decode[delayedPageJSON](t, e.get(t, "/api/v1/delayed", http.StatusOK)).Pending, "none pending once delivered")

	t.Run("batch", func(t *testing.T) {
		b := e.postJSON(t, "/api/v1/topics/batch/messages", `[{"delay":"1h","body":"later"},{"body":"now"}]`, http.StatusCreated)
		res := decode[[]sendResultJSON](t, b)
		require.Len(t, res, 2)
		require.Equal(t, -1, res[0].Queue, "the delayed one")
		require.Equal(t, "batch", res[0].Topic)
		require.GreaterOrEqual(t, res[1].Queue, 0, "the other one is stored at once")
		ms := e.inTopic(t, "batch")
		require.Len(t, ms, 1)
		require.Equal(t, "now", string(ms[0].Body))
	})

	t.Run("refused", func(t *testing.T) {
		past := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
		for _, tc := range []struct {
			name   string
			ct     string
			header http.Header
			body   string
			status int
			code   string
		}{
			{"delay and deliver_at", "application/json", nil, `{"delay":"1s","deliver_at":"2030-01-02T03:04:05Z"}`, 400, CodeBadRequest},
			{"delay and deliver-at headers", "", http.Header{"X-Ferrymq-Delay": {"1s"}, "X-Ferrymq-Deliver-At": {"2030-01-02T03:04:05Z"}}, "x", 400, CodeBadRequest},
			{"negative delay", "application/json", nil, `{"delay":"-5s"}`, 400, CodeBadRequest},
			{"negative delay header", "", http.Header{"X-Ferrymq-Delay": {"-5s"}}, "x", 400, CodeBadRequest},
			{"not a duration", "application/json", nil, `{"delay":"soon"}`, 400, CodeBadRequest},
			{"not a duration header", "", http.Header{"X-Ferrymq-Delay": {"5"}}, "x", 400, CodeBadRequest},
			{"delay not a string", "application/json", nil, `{"delay":5}`, 400, CodeBadJSON},
			{"too long", "application/json", nil, `{"delay":"1000h"}`, 400, CodeDelayTooLong},
			{"too long header", "", http.Header{"X-Ferrymq-Delay": {"1000h"}}, "x", 400, CodeDelayTooLong},
			{"too long in a batch", "application/json", nil, `[{"body":"now"},{"delay":"1000h"}]`, 400, CodeDelayTooLong},
			{"deliver_at an hour ago", "application/json", nil, `{"deliver_at":"` + past + `"}`, 400, CodeDeliverAtPast},
			{"deliver-at header an hour ago", "", http.Header{"X-Ferrymq-Deliver-At": {past}}, "x", 400, CodeDeliverAtPast},
		} {
			t.Run(tc.name, func(t *testing.T) {
				resp, b := e.do(t, req{method: http.MethodPost, path: "/api/v1/topics/refused/messages",
					contentType: tc.ct, header: tc.header, body: strings.NewReader(tc.body)})
				requireError(t, resp, b, tc.status, tc.code)
			})
		}
		require.Empty(t, e.inTopic(t, "refused"), "nothing stored")
		require.Empty(t, decode[delayedPageJSON](t, e.get(t, "/api/v1/delayed?topic=refused", http.StatusOK)).Pending, "nothing scheduled")
	})
}

// A pending message can be looked up and cancelled, once; a cancelled one
// is never delivered. Cancelling what was never delayed, what is unknown
// or what was delivered is refused with its own code.
func TestCancelDelayed(t *testing.T) {
	e, svc := newDelayEnv(t)
	gone := e.produceDelayed(t, "jobs", "1s", "cancelled")
	// Due later than the cancelled one and in the same level by then: once
	// it is delivered, the cancelled one's time has passed.
	kept := e.produceDelayed(t, "jobs", "1500ms", "kept")
	normal := decode[sendResultJSON](t, e.postJSON(t, "/api/v1/topics/jobs/messages", `{"body":"now"}`, http.StatusCreated))

	p := decode[delayedJSON](t, e.get(t, "/api/v1/delayed/"+gone.ID, http.StatusOK))
	require.Equal(t, gone.ID, p.ID)
	require.Equal(t, "jobs", p.Topic)
	require.False(t, p.Cancelled)

	del := func(id string) (*http.Response, []byte) {
		return e.do(t, req{method: http.MethodDelete, path: "/api/v1/delayed/" + id})
	}
	resp, b := del(gone.ID)
	require.Equal(t, http.StatusOK, resp.StatusCode, "body: %s", b)
	c := decode[delayedJSON](t, b)
	require.True(t, c.Cancelled)
	require.Equal(t, gone.ID, c.ID)
	require.True(t, c.Due.Equal(p.Due))

	resp, b = del(gone.ID)
	requireError(t, resp, b, http.StatusConflict, CodeAlreadyCancelled)
	resp, b = del(normal.ID)
	requireError(t, resp, b, http.StatusConflict, CodeNotDelayed)
	mid, err := core.ParseMessageID(normal.ID)
	require.NoError(t, err)
	unknown := core.NewCommitLogID(mid.StoreID(), 1<<40, mid.Size()).String()
	resp, b = del(unknown)
	requireError(t, resp, b, http.StatusNotFound, CodeMessageNotFound)
	resp, b = del(strings.Repeat("0", 32))
	requireError(t, resp, b, http.StatusNotFound, CodeMessageNotFound)
	for _, bad := range []string{"xyz", strings.Repeat("g", 32), strings.Repeat("0", 31)} {
		resp, b = del(bad)
		requireError(t, resp, b, http.StatusBadRequest, CodeBadRequest)
		resp, b = e.do(t, req{method: http.MethodGet, path: "/api/v1/delayed/" + bad})
		requireError(t, resp, b, http.StatusBadRequest, CodeBadRequest)
	}
	resp, b = e.do(t, req{method: http.MethodGet, path: "/api/v1/delayed/" + unknown})
	requireError(t, resp, b, http.StatusNotFound, CodeMessageNotFound)

	got := decode[delayedJSON](t, e.get(t, "/api/v1/delayed/"+gone.ID, http.StatusOK))
	require.True(t, got.Cancelled, "a cancelled message is still found, marked")
	page := decode[delayedPageJSON](t, e.get(t, "/api/v1/delayed", http.StatusOK))
	require.Len(t, page.Pending, 1, "the list leaves cancelled messages out")
	require.Equal(t, kept.ID, page.Pending[0].ID)

	var ms []*core.StoredMessage
	require.Eventually(t, func() bool {
		ms = e.inTopic(t, "jobs")
		return len(ms) >= 2
	}, 5*time.Second, 10*time.Millisecond)
	// The kept message is delivered after the cancelled one's due time, and
	// level 0 handles copies in order: the cancelled one's copy came up first.
	require.Len(t, ms, 2, "the normal message and the kept one only")
	var bodies []string
	for _, m := range ms {
		bodies = append(bodies, string(m.Body))
	}
	require.ElementsMatch(t, []string{"now", "kept"}, bodies)
	require.Eventually(t, func() bool {
		st, err := svc.Stats(t.Context())
		return err == nil && st.Dropped == 1
	}, 5*time.Second, 10*time.Millisecond, "the cancelled copy was dropped")
	require.Len(t, e.inTopic(t, "jobs"), 2)

	resp, b = del(kept.ID)
	requireError(t, resp, b, http.StatusConflict, CodeAlreadyDue)
	resp, b = del(gone.ID)
	requireError(t, resp, b, http.StatusConflict, CodeAlreadyCancelled)

	// Delivered, it is no longer pending: GET says so once the level has
	// committed past its copy (the copies themselves stay stored).
	require.Eventually(t, func() bool {
		resp, b := e.do(t, req{method: http.MethodGet, path: "/api/v1/delayed/" + kept.ID})
		return resp.StatusCode == http.StatusConflict && decode[errorJSON](t, b).Code == CodeAlreadyDue
	}, 5*time.Second, 10*time.Millisecond, "GET of a delivered message: 409 already_due")
	got = decode[delayedJSON](t, e.get(t, "/api/v1/delayed/"+gone.ID, http.StatusOK))
	require.True(t, got.Cancelled, "a cancelled one is still found after its copy was dropped")
}

// The list pages with an opaque cursor until it has no next one.
func TestListDelayedPages(t *testing.T) {
	e, _ := newDelayEnv(t)
	var want []string
	for _, d := range []string{"30s", "40s", "50s"} { // levels 5, 6 and 6
		want = append(want, e.produceDelayed(t, "pages", d, d).ID)
	}
	var seen []string
	cursor := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10, "the listing ends")
		path := "/api/v1/delayed?max=1"
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		page := decode[delayedPageJSON](t, e.get(t, path, http.StatusOK))
		require.LessOrEqual(t, len(page.Pending), 1)
		for _, p := range page.Pending {
			seen = append(seen, p.ID)
		}
		if page.Next == "" {
			break
		}
		cursor = page.Next
	}
	slices.Sort(seen)
	slices.Sort(want)
	require.Equal(t, want, seen, "every pending message once")

	page := decode[delayedPageJSON](t, e.get(t, "/api/v1/delayed?max=2&topic=pages", http.StatusOK))
	require.Len(t, page.Pending, 2)
	require.NotEmpty(t, page.Next)

	for _, q := range []string{"cursor=x", "cursor=1", "cursor=-1:0", "cursor=1:-1", "cursor=a:b", "cursor=1:2:3", "max=0", "max=-1", "max=x"} {
		resp, b := e.do(t, req{method: http.MethodGet, path: "/api/v1/delayed?" + q})
		requireError(t, resp, b, http.StatusBadRequest, CodeBadRequest)
	}
}

func TestDelayedMethods(t *testing.T) {
	e, _ := newDelayEnv(t)
	id := e.produceDelayed(t, "m", "1h", "x").ID
	for _, tc := range []struct {
		method, path, allow string
	}{
		{http.MethodPost, "/api/v1/delayed", "GET"},
		{http.MethodDelete, "/api/v1/delayed", "GET"},
		{http.MethodPost, "/api/v1/delayed/" + id, "GET, DELETE"},
		{http.MethodPut, "/api/v1/delayed/" + id, "GET, DELETE"},
	} {
		resp, b := e.do(t, req{method: tc.method, path: tc.path, body: bytes.NewReader(nil)})
		requireError(t, resp, b, http.StatusMethodNotAllowed, CodeMethodNotAllowed)
		require.Equal(t, tc.allow, resp.Header.Get("Allow"), "%s %s", tc.method, tc.path)
	}
}

// Without a delay service the delayed endpoints answer 501.
func TestDelayDisabled(t *testing.T) {
	e := newEnv(t, envConfig{noPop: true})
	id := decode[sendResultJSON](t, e.postJSON(t, "/api/v1/topics/t/messages", `{"body":"x"}`, http.StatusCreated)).ID
	for _, r := range []req{
		{method: http.MethodGet, path: "/api/v1/delayed"},
		{method: http.MethodGet, path: "/api/v1/delayed/" + id},
		{method: http.MethodDelete, path: "/api/v1/delayed/" + id},
	} {
		resp, b := e.do(t, r)
		requireError(t, resp, b, http.StatusNotImplemented, CodeDelayDisabled)
	}
}
