package httpapi

import (
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/trace"
)

func TestQueryGetAndTraceMessages(t *testing.T) {
	e := newEnv(t, envConfig{noPop: true})
	ctx := t.Context()
	var ids []core.MessageID
	for i, c := range []string{"car-1", "car-2", "car-1"} {
		res, err := e.st.Produce(ctx, &core.Message{Topic: "tel", ShardingKey: c, Keys: []string{"order-" + string(rune('a'+i))},
			Properties: map[string]string{"mqtt.clientid": c}, Body: []byte{'m', byte('0' + i)}})
		require.NoError(t, err)
		ids = append(ids, res.ID)
	}
	bin, err := e.st.Produce(ctx, &core.Message{Topic: "tel", ShardingKey: "car-9", Body: []byte{0xff, 0x00}})
	require.NoError(t, err)

	page := decode[messagePage](t, e.get(t, "/api/v1/messages?client=car-1", http.StatusOK))
	require.Len(t, page.Messages, 2)
	require.Equal(t, ids[0], page.Messages[0].ID)
	require.Equal(t, ids[2], page.Messages[1].ID)
	require.Equal(t, "m0", *page.Messages[0].Body)
	require.Equal(t, "car-1", page.Messages[0].Properties["mqtt.clientid"])

	page = decode[messagePage](t, e.get(t, "/api/v1/messages?topic=tel&key=order-b", http.StatusOK))
	require.Len(t, page.Messages, 1)
	require.Equal(t, ids[1], page.Messages[0].ID)

	// Time range, one per page.
	begin := url.QueryEscape(time.Now().Add(-time.Hour).Format(time.RFC3339))
	var got []core.MessageID
	next := ""
	for range 10 {
		p := "/api/v1/messages?topic=tel&max=1&begin=" + begin
		if next != "" {
			p += "&cursor=" + url.QueryEscape(next)
		}
		page = decode[messagePage](t, e.get(t, p, http.StatusOK))
		for _, m := range page.Messages {
			got = append(got, m.ID)
		}
		if next = page.Next; next == "" {
			break
		}
	}
	require.ElementsMatch(t, append(ids, bin.ID), got)

	// One message; a binary body comes as base64.
	m := decode[storedMessage](t, e.get(t, "/api/v1/messages/"+bin.ID.String(), http.StatusOK))
	require.Nil(t, m.Body)
	require.Equal(t, "/wA=", m.BodyBase64)

	// Trace: the stored message and its hops (none: not traced).
	tr := decode[messageTrace](t, e.get(t, "/api/v1/messages/"+ids[0].String()+"/trace", http.StatusOK))
	require.Equal(t, ids[0], tr.Message.ID)
	require.Empty(t, tr.Hops)
	// With hops recorded.
	rec, err := trace.New(e.st, trace.Options{All: true})
	require.NoError(t, err)
	rec.Start()
	rec.Record(trace.Event{ID: ids[0], Hop: trace.HopDelivered, Attrs: map[string]string{"group": "g"}})
	require.NoError(t, rec.Close())
	tr = decode[messageTrace](t, e.get(t, "/api/v1/messages/"+ids[0].String()+"/trace", http.StatusOK))
	require.Len(t, tr.Hops, 1)
	require.Equal(t, "g", tr.Hops[0].Attrs["group"])

	// Bad input.
	unknown := core.NewCommitLogID(ids[0].StoreID(), 1<<40, 10).String()
	for path, want := range map[string]int{
		"/api/v1/messages":                           http.StatusBadRequest, // no criterion
		"/api/v1/messages?topic=tel":                 http.StatusBadRequest,
		"/api/v1/messages?key=a&client=b":            http.StatusBadRequest,
		"/api/v1/messages?client=a&max=0":            http.StatusBadRequest,
		"/api/v1/messages?client=a&max=100000":       http.StatusBadRequest,
		"/api/v1/messages?client=a&bogus=1":          http.StatusBadRequest,
		"/api/v1/messages?client=a&begin=yesterday":  http.StatusBadRequest,
		"/api/v1/messages?topic=tel&key=a&cursor=zz": http.StatusBadRequest,
		"/api/v1/messages?topic=nope&begin=" + begin: http.StatusNotFound,
		"/api/v1/messages/" + unknown:                http.StatusNotFound,
		"/api/v1/messages/" + unknown + "/trace":     http.StatusNotFound,
		"/api/v1/messages/xyz":                       http.StatusBadRequest,
		"/api/v1/messages/xyz/trace":                 http.StatusBadRequest,
	} {
		e.get(t, path, want)
	}
	resp, _ := e.do(t, req{method: http.MethodPost, path: "/api/v1/messages"})
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
}
