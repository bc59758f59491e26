package httpapi

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/pop"
	"github.com/ferrymq/ferrymq/core/retry"
)

// committed returns the group's committed offset in one queue, -1 if none.
func (e *env) committed(t testing.TB, group, topic string, queue int) int64 {
	t.Helper()
	o, err := e.st.CommittedOffset(t.Context(), group, topic, queue)
	if errors.Is(err, core.ErrNoCommittedOffset) {
		return -1
	}
	require.NoError(t, err)
	return o
}

func TestPopAck(t *testing.T) {
	e := newEnv(t, envConfig{})
	text := decode[sendResultJSON](t, e.postJSON(t, "/api/v1/topics/jobs/messages",
		`{"key":"k1","tag":"a","keys":["x"],"properties":{"p":"v"},"body":"work"}`, http.StatusCreated))
	bin := decode[sendResultJSON](t, e.postJSON(t, "/api/v1/topics/jobs/messages",
		`{"key":"k1","tag":"b","body_base64":"/wA="}`, http.StatusCreated))

	before := time.Now()
	got := e.popN(t, "jobs", "group=workers&max=10&invisible=30s", 2)
	byID := map[string]messageJSON{got[0].ID: got[0], got[1].ID: got[1]}

	m := byID[text.ID]
	require.NotEmpty(t, m.Handle)
	require.Equal(t, 1, m.Attempt)
	require.Equal(t, 0, m.Reconsume)
	require.Equal(t, "jobs", m.Topic)
	require.Equal(t, text.Queue, m.Queue)
	require.Equal(t, text.QueueOffset, m.QueueOffset)
	require.Equal(t, "k1", m.Key)
	require.Equal(t, "a", m.Tag)
	require.Equal(t, []string{"x"}, m.Keys)
	require.Equal(t, map[string]string{"p": "v"}, m.Properties)
	require.NotNil(t, m.Body)
	require.Equal(t, "work", *m.Body)
	require.Nil(t, m.BodyBase64)
	require.True(t, m.StoredAt.Equal(text.StoredAt))
	require.False(t, m.BornAt.IsZero())
	require.WithinDuration(t, before.Add(30*time.Second), m.VisibleAt, 5*time.Second)

	mb := byID[bin.ID]
	require.Nil(t, mb.Body, "not UTF-8: base64")
	require.NotNil(t, mb.BodyBase64)
	raw, err := base64.StdEncoding.DecodeString(*mb.BodyBase64)
	require.NoError(t, err)
	require.Equal(t, []byte{0xff, 0x00}, raw)

	// Ack both, one in a list and one on its own.
	acks := decode[ackJSON](t, e.postJSON(t, "/api/v1/topics/jobs/ack", fmt.Sprintf(`{"handles":[%q]}`, m.Handle), http.StatusOK))
	require.Len(t, acks.Results, 1)
	require.True(t, acks.Results[0].OK)
	require.Equal(t, m.Handle, acks.Results[0].Handle)
	acks = decode[ackJSON](t, e.postJSON(t, "/api/v1/topics/jobs/ack", fmt.Sprintf(`{"handle":%q}`, mb.Handle), http.StatusOK))
	require.True(t, acks.Results[0].OK)
	require.Equal(t, int64(2), e.committed(t, "workers", "jobs", text.Queue), "both acked: the group's offset moved past them")

	// Gone for the group, though another group still gets them.
	e.popN(t, "jobs", "group=workers", 0)
	e.popN(t, "jobs", "group=auditors&max=10", 2)

	// Acking again, or garbage, fails per handle.
	acks = decode[ackJSON](t, e.postJSON(t, "/api/v1/topics/jobs/ack",
		fmt.Sprintf(`{"handles":[%q,"garbage"]}`, m.Handle), http.StatusOK))
	require.Len(t, acks.Results, 2)
	require.False(t, acks.Results[0].OK)
	require.Equal(t, CodeHandleExpired, acks.Results[0].Code)
	require.NotEmpty(t, acks.Results[0].Error)
	require.Equal(t, "garbage", acks.Results[1].Handle)
	require.Equal(t, CodeInvalidHandle, acks.Results[1].Code)
}

func TestPopFilters(t *testing.T) {
	e := newEnv(t, envConfig{})
	for i := range 6 {
		e.postJSON(t, "/api/v1/topics/f/messages", fmt.Sprintf(`{"key":"one","tag":"t%d","body":"%d"}`, i%3, i), http.StatusCreated)
	}
	got := e.popN(t, "f", "group=g&max=10&tags=t0,%20t2", 4)
	for _, m := range got {
		require.Contains(t, []string{"t0", "t2"}, m.Tag)
	}

	// Orderly: while messages of a queue are in flight, it hands out no more.
	got = e.popN(t, "f", "group=o&max=2&orderly=true", 2)
	require.Equal(t, []string{"0", "1"}, []string{*got[0].Body, *got[1].Body})
	e.popN(t, "f", "group=o&max=2&orderly=true", 0)
	e.postJSON(t, "/api/v1/topics/f/ack", fmt.Sprintf(`{"handles":[%q,%q]}`, got[0].Handle, got[1].Handle), http.StatusOK)
	got = e.popN(t, "f", "group=o&max=2&orderly=true", 2)
	require.Equal(t, []string{"2", "3"}, []string{*got[0].Body, *got[1].Body})

	t.Run("max above the service's limit is cut to it", func(t *testing.T) {
		for i := range pop.DefaultMaxPop + 1 {
			e.postJSON(t, "/api/v1/topics/many/messages", fmt.Sprintf(`{"body":"%d"}`, i), http.StatusCreated)
		}
		e.popN(t, "many", "group=g&max=1024", pop.DefaultMaxPop)
	})
}

func TestLongPoll(t *testing.T) {
	e := newEnv(t, envConfig{})
	_, err := e.st.CreateTopic(t.Context(), core.TopicConfig{Name: "lp", Queues: 2})
	require.NoError(t, err)

	const wait = 20 * time.Second
	type result struct {
		got  popJSON
		took time.Duration
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		resp, b := e.do(t, req{method: http.MethodGet, path: "/api/v1/topics/lp/messages?group=g&wait=" + wait.String()})
		var r result
		r.took = time.Since(start)
		if resp.StatusCode == http.StatusOK {
			r.got = decode[popJSON](t, b)
		}
		done <- r
	}()
	// Once Pop looked at the topic's queues, it found them empty: the
	// message produced now can reach it only through the long poll.
	e.awaitTopicCall(t, "lp")
	sent := decode[sendResultJSON](t, e.postJSON(t, "/api/v1/topics/lp/messages", `{"body":"late"}`, http.StatusCreated))

	select {
	case r := <-done:
		require.Len(t, r.got.Messages, 1)
		require.Equal(t, sent.ID, r.got.Messages[0].ID)
		require.Less(t, r.took, wait/2, "woken by the arrival, not by the deadline")
	case <-time.After(waitFor):
		t.Fatal("long poll did not return")
	}
}

// awaitTopicCall waits until the broker's Topic was called for topic.
func (e *env) awaitTopicCall(t testing.TB, topic string) {
	t.Helper()
	timeout := time.After(waitFor)
	for {
		select {
		case name := <-e.b.topicCalls:
			if name == topic {
				return
			}
		case <-timeout:
			t.Fatalf("no Topic(%q) call", topic)
		}
	}
}

func TestLongPollEmptyAndCapped(t *testing.T) {
	e := newEnv(t, envConfig{opts: Options{MaxWait: 50 * time.Millisecond}})
	_, err := e.st.CreateTopic(t.Context(), core.TopicConfig{Name: "quiet"})
	require.NoError(t, err)
	// wait=1h is cut to MaxWait: an empty list, not a hang.
	b := e.get(t, "/api/v1/topics/quiet/messages?group=g&wait=1h", http.StatusOK)
	require.JSONEq(t, `{"messages":[]}`, string(b))
}

func TestLongPollClientGone(t *testing.T) {
	e := newEnv(t, envConfig{})
	_, err := e.st.CreateTopic(t.Context(), core.TopicConfig{Name: "gone"})
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		hr, err := http.NewRequestWithContext(ctx, http.MethodGet, e.srv.URL+"/api/v1/topics/gone/messages?group=g&wait=30s", nil)
		if err == nil {
			var resp *http.Response
			if resp, err = e.srv.Client().Do(hr); err == nil {
				resp.Body.Close()
			}
		}
		errc <- err
	}()
	e.awaitTopicCall(t, "gone")
	cancel()
	require.ErrorIs(t, <-errc, context.Canceled)
	// The server's long poll ended with the request: one debug line.
	require.Eventually(t, func() bool {
		return len(e.logs.lines(`"code":"canceled"`)) == 1
	}, waitFor, time.Millisecond)
	require.Contains(t, e.logs.lines(`"code":"canceled"`)[0], `"level":"debug"`)
}

func TestChangeInvisible(t *testing.T) {
	e := newEnv(t, envConfig{
		popOp:   pop.Options{MinInvisible: 10 * time.Millisecond},
		retryOp: retry.Options{Schedule: []time.Duration{10 * time.Millisecond}},
	})
	kept := decode[sendResultJSON](t, e.postJSON(t, "/api/v1/topics/inv/messages", `{"key":"a","body":"slow job"}`, http.StatusCreated))
	e.postJSON(t, "/api/v1/topics/inv/messages", `{"key":"a","body":"abandoned job"}`, http.StatusCreated)
	got := e.popN(t, "inv", "group=g&max=2&invisible=200ms", 2)
	require.Equal(t, kept.ID, got[0].ID)

	b := e.postJSON(t, "/api/v1/topics/inv/invisible", fmt.Sprintf(`{"handle":%q,"invisible":"1h"}`, got[0].Handle), http.StatusOK)
	newHandle := decode[struct {
		Handle string `json:"handle"`
	}](t, b).Handle
	require.NotEmpty(t, newHandle)
	require.NotEqual(t, got[0].Handle, newHandle)

	// The other message's 200 ms run out and it comes back through the
	// retry topic; the one whose time was changed stays hidden.
	back := e.popN(t, "inv", "group=g&max=2&wait=5s", 1)[0]
	require.Equal(t, "abandoned job", *back.Body)
	require.Equal(t, 2, back.Attempt)
	require.Equal(t, 1, back.Reconsume)
	require.Equal(t, "%RETRY%g", back.Topic)
	require.Equal(t, "inv", back.Properties[retry.PropOriginTopic])
	e.popN(t, "inv", "group=g&max=2", 0)

	// The old handle stopped working; the new one works.
	b = e.postJSON(t, "/api/v1/topics/inv/invisible", fmt.Sprintf(`{"handle":%q,"invisible":"30s"}`, got[0].Handle), http.StatusConflict)
	require.Equal(t, CodeHandleExpired, decode[errorJSON](t, b).Code)
	b = e.postJSON(t, "/api/v1/topics/inv/invisible", fmt.Sprintf(`{"handle":%q,"invisible":"13h"}`, newHandle), http.StatusBadRequest)
	require.Equal(t, CodeInvisibleTime, decode[errorJSON](t, b).Code)
	acks := decode[ackJSON](t, e.postJSON(t, "/api/v1/topics/inv/ack",
		fmt.Sprintf(`{"handles":[%q,%q,%q]}`, got[0].Handle, newHandle, back.Handle), http.StatusOK))
	require.Equal(t, CodeHandleExpired, acks.Results[0].Code)
	require.True(t, acks.Results[1].OK)
	require.True(t, acks.Results[2].OK, "a redelivered message is acked through the topic it was popped from")
}

func TestConsumeDisabled(t *testing.T) {
	e := newEnv(t, envConfig{noPop: true})
	e.postJSON(t, "/api/v1/topics/t/messages", `{"body":"x"}`, http.StatusCreated)
	b := e.get(t, "/api/v1/topics/t/messages?group=g", http.StatusNotImplemented)
	require.Equal(t, CodeConsumeDisabled, decode[errorJSON](t, b).Code)
	b = e.postJSON(t, "/api/v1/topics/t/ack", `{"handle":"x"}`, http.StatusNotImplemented)
	require.Equal(t, CodeConsumeDisabled, decode[errorJSON](t, b).Code)
	b = e.postJSON(t, "/api/v1/topics/t/invisible", `{"handle":"x","invisible":"30s"}`, http.StatusNotImplemented)
	require.Equal(t, CodeConsumeDisabled, decode[errorJSON](t, b).Code)
}

func TestClosed(t *testing.T) {
	e := newEnv(t, envConfig{})
	e.postJSON(t, "/api/v1/topics/t/messages", `{"body":"x"}`, http.StatusCreated)
	require.NoError(t, e.pop.Close())
	require.NoError(t, e.st.Close())

	for _, r := range []req{
		{method: http.MethodPost, path: "/api/v1/topics/t/messages", contentType: "application/json", body: strings.NewReader(`{"body":"x"}`)},
		{method: http.MethodPost, path: "/api/v1/topics/t/messages", body: strings.NewReader("raw")},
		{method: http.MethodGet, path: "/api/v1/topics/t/messages?group=g"},
		{method: http.MethodPost, path: "/api/v1/topics/t/invisible", body: strings.NewReader(`{"handle":"x","invisible":"30s"}`)},
	} {
		resp, b := e.do(t, r)
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s %s: %s", r.method, r.path, b)
		require.Equal(t, CodeShuttingDown, decode[errorJSON](t, b).Code)
		require.Equal(t, retryAfter, resp.Header.Get("Retry-After"))
	}
	require.NotEmpty(t, e.logs.lines(`"level":"error"`), "5xx logged as errors")
}
