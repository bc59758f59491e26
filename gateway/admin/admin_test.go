package admin_test

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/httpapi"
	"github.com/ferrymq/ferrymq/core/retry"
	"github.com/ferrymq/ferrymq/gateway/admin"
	"github.com/ferrymq/ferrymq/gateway/engine"
)

// The answers as a client reads them: the field names are the API's.
type (
	nodeJSON struct {
		Node          string         `json:"node"`
		Version       string         `json:"version"`
		Engine        string         `json:"engine"`
		StartedAt     time.Time      `json:"started_at"`
		Uptime        string         `json:"uptime"`
		UptimeSeconds int64          `json:"uptime_seconds"`
		Config        map[string]any `json:"config"`
		MQTT          *struct {
			Listeners []struct {
				Name string `json:"name"`
				Addr string `json:"addr"`
			} `json:"listeners"`
			ClientsConnected int64 `json:"clients_connected"`
		} `json:"mqtt"`
		Sessions *struct {
			Stored int `json:"stored"`
		} `json:"sessions"`
	}
	rangeJSON struct {
		Queue    int   `json:"queue"`
		Min      int64 `json:"min"`
		Max      int64 `json:"max"`
		Messages int64 `json:"messages"`
	}
	topicJSON struct {
		Name     string      `json:"name"`
		System   bool        `json:"system"`
		Queues   int         `json:"queues"`
		Messages int64       `json:"messages"`
		Ranges   []rangeJSON `json:"ranges"`
		Epochs   []struct {
			Queues int     `json:"queues"`
			Begin  []int64 `json:"begin"`
		} `json:"epochs"`
	}
	topicPageJSON struct {
		Topics []topicJSON `json:"topics"`
		Next   string      `json:"next"`
	}
	lagJSON struct {
		Topic     string `json:"topic"`
		Queue     int    `json:"queue"`
		Member    string `json:"member"`
		Committed int64  `json:"committed"`
		Min       int64  `json:"min"`
		Max       int64  `json:"max"`
		Lag       int64  `json:"lag"`
		Owner     string `json:"owner"`
	}
	memberJSON struct {
		ClientID      string    `json:"client_id"`
		LastHeartbeat time.Time `json:"last_heartbeat"`
		Subscriptions []struct {
			Topic string   `json:"topic"`
			Tags  []string `json:"tags"`
		} `json:"subscriptions"`
		Queues []struct {
			Topic string `json:"topic"`
			Queue int    `json:"queue"`
		} `json:"queues"`
	}
	groupJSON struct {
		Name     string       `json:"name"`
		Mode     string       `json:"mode"`
		Members  []memberJSON `json:"members"`
		Lag      []lagJSON    `json:"lag"`
		TotalLag *int64       `json:"total_lag"`
	}
	groupPageJSON struct {
		Groups []groupJSON `json:"groups"`
		Next   string      `json:"next"`
	}
	resetJSON struct {
		Group   string `json:"group"`
		Topic   string `json:"topic"`
		To      string `json:"to"`
		Offsets []struct {
			Queue  int   `json:"queue"`
			Offset int64 `json:"offset"`
		} `json:"offsets"`
	}
	deadLetterJSON struct {
		ID          string            `json:"id"`
		Queue       int               `json:"queue"`
		QueueOffset int64             `json:"queue_offset"`
		OriginTopic string            `json:"origin_topic"`
		OriginID    string            `json:"origin_id"`
		Reason      string            `json:"reason"`
		Reconsume   int               `json:"reconsume"`
		Key         string            `json:"key"`
		Properties  map[string]string `json:"properties"`
		Size        int               `json:"size"`
		Body        *string           `json:"body"`
		BodyBase64  string            `json:"body_base64"`
		Truncated   bool              `json:"truncated"`
		StoredAt    time.Time         `json:"stored_at"`
		Redriven    bool              `json:"redriven"`
	}
	deadLetterPageJSON struct {
		Group       string           `json:"group"`
		Topic       string           `json:"topic"`
		DeadLetters []deadLetterJSON `json:"dead_letters"`
		Next        string           `json:"next"`
	}
	clientJSON struct {
		ID              string    `json:"id"`
		Connected       bool      `json:"connected"`
		Username        string    `json:"username"`
		Remote          string    `json:"remote"`
		RemoteIP        string    `json:"remote_ip"`
		Listener        string    `json:"listener"`
		ProtocolVersion byte      `json:"protocol_version"`
		Keepalive       uint16    `json:"keepalive"`
		CleanStart      bool      `json:"clean_start"`
		SessionExpiry   *uint32   `json:"session_expiry"`
		ConnectedAt     time.Time `json:"connected_at"`
		Subscriptions   []struct {
			Filter string `json:"filter"`
			QoS    byte   `json:"qos"`
		} `json:"subscriptions"`
		Inflight int `json:"inflight"`
		Session  *struct {
			Parked        bool      `json:"parked"`
			Queued        int       `json:"queued"`
			Subscriptions int       `json:"subscriptions"`
			Deadline      time.Time `json:"deadline"`
		} `json:"session"`
	}
	clientPageJSON struct {
		Clients []clientJSON `json:"clients"`
		Next    string       `json:"next"`
	}
	retainedJSON struct {
		Topic         string    `json:"topic"`
		QoS           byte      `json:"qos"`
		Size          int       `json:"size"`
		Payload       *string   `json:"payload"`
		PayloadBase64 string    `json:"payload_base64"`
		Truncated     bool      `json:"truncated"`
		Origin        string    `json:"origin"`
		CreatedAt     time.Time `json:"created_at"`
	}
	retainedPageJSON struct {
		Retained []retainedJSON `json:"retained"`
		Next     string         `json:"next"`
	}
)

func TestNode(t *testing.T) {
	e := start(t, nil)
	r := e.get(t, "/api/v1/node")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Equal(t, "application/json", r.header.Get("Content-Type"))
	n := decode[nodeJSON](t, r)
	require.Equal(t, "node-1", n.Node)
	require.Equal(t, "ferrymq v9.9.9-test", n.Version)
	require.Equal(t, admin.EngineEmbedded, n.Engine)
	require.WithinDuration(t, time.Now(), n.StartedAt, time.Minute)
	require.NotEmpty(t, n.Uptime)
	require.GreaterOrEqual(t, n.UptimeSeconds, int64(0))
	require.Equal(t, map[string]any{"http": map[string]any{"addr": "127.0.0.1:0"}, "core": map[string]any{"token": "<redacted>"}}, n.Config)
	require.NotNil(t, n.MQTT)
	require.Len(t, n.MQTT.Listeners, 2)
	require.Equal(t, e.gw.TCP, n.MQTT.Listeners[0].Addr)
	require.NotNil(t, n.Sessions)
	requireNoSecret(t, r, token)

	requireError(t, e.do(t, http.MethodPost, "/api/v1/node", ""), http.StatusMethodNotAllowed, admin.CodeMethodNotAllowed)
	requireError(t, e.get(t, "/api/v1/node?verbose=1"), http.StatusBadRequest, admin.CodeBadRequest)
}

func TestNodeStartedAndUptime(t *testing.T) {
	started := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	e := start(t, func(o *admin.Options) {
		o.Started = started
		o.Now = func() time.Time { return started.Add(90*time.Minute + 2*time.Second) }
	})
	n := decode[nodeJSON](t, e.get(t, "/api/v1/node"))
	require.Equal(t, started, n.StartedAt)
	require.Equal(t, "1h30m2s", n.Uptime)
	require.Equal(t, int64(5402), n.UptimeSeconds)
}

func TestUnknownPath(t *testing.T) {
	e := start(t, nil)
	requireError(t, e.get(t, "/api/v1/nothing-here"), http.StatusNotFound, admin.CodeNotFound)
	requireError(t, e.get(t, "/"), http.StatusNotFound, admin.CodeNotFound)
}

func TestNewBadOptions(t *testing.T) {
	_, err := admin.New(admin.Options{Config: make(chan int)})
	require.ErrorIs(t, err, admin.ErrBadOptions)
	_, err = admin.New(admin.Options{MaxPage: -1, MaxBodyBytes: -1})
	require.ErrorIs(t, err, admin.ErrBadOptions)
	require.ErrorContains(t, err, "max page")
	require.ErrorContains(t, err, "max body bytes")
}

func TestTopicCreateAndDescribe(t *testing.T) {
	e := start(t, nil)

	r := e.do(t, http.MethodPost, "/api/v1/topics", `{"name":"orders","queues":4}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	tp := decode[topicJSON](t, r)
	require.Equal(t, "orders", tp.Name)
	require.Equal(t, 4, tp.Queues)
	require.Len(t, tp.Ranges, 4)

	// Again with the same count: 200, the topic as it is.
	r = e.do(t, http.MethodPost, "/api/v1/topics", `{"name":"orders","queues":4}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	r = e.do(t, http.MethodPost, "/api/v1/topics", `{"name":"orders"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Equal(t, 4, decode[topicJSON](t, r).Queues)
	// With another count: 409.
	requireError(t, e.do(t, http.MethodPost, "/api/v1/topics", `{"name":"orders","queues":2}`), http.StatusConflict, admin.CodeTopicExists)
	// Without a count: the engine's default.
	r = e.do(t, http.MethodPost, "/api/v1/topics", `{"name":"plain"}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	require.Equal(t, 8, decode[topicJSON](t, r).Queues)

	for _, tc := range []struct{ body, code string }{
		{`{"name":"no spaces"}`, admin.CodeInvalidTopic},
		{`{"name":""}`, admin.CodeInvalidTopic},
		{`{"name":"%DLQ%x"}`, admin.CodeInvalidTopic},
		{`{"name":"t","queues":-1}`, admin.CodeBadRequest},
		{`{"name":"t","queues":1025}`, admin.CodeBadRequest},
		{`{"name":"t","queues":"4"}`, admin.CodeBadJSON},
		{`{"name":"t","extra":1}`, admin.CodeBadJSON},
		{`{"Name":"t"}`, admin.CodeBadJSON},
		{`{"name":"t","name":"u"}`, admin.CodeBadJSON},
		{`{"name":"t"} {}`, admin.CodeBadJSON},
		{`["t"]`, admin.CodeBadJSON},
		{`{"name":`, admin.CodeBadJSON},
		{` `, admin.CodeBadJSON},
	} {
		t.Run(tc.body, func(t *testing.T) {
			requireError(t, e.do(t, http.MethodPost, "/api/v1/topics", tc.body), http.StatusBadRequest, tc.code)
		})
	}
	requireError(t, e.do(t, http.MethodPost, "/api/v1/topics", `{"name":"`+strings.Repeat("x", 70<<10)+`"}`),
		http.StatusRequestEntityTooLarge, admin.CodeBodyTooLarge)

	e.produce(t, "orders", "a", "b", "c")
	r = e.get(t, "/api/v1/topics/orders")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	tp = decode[topicJSON](t, r)
	require.Equal(t, int64(3), tp.Messages)
	q := core.QueueFor("k", 4)
	require.Equal(t, rangeJSON{Queue: q, Min: 0, Max: 3, Messages: 3}, tp.Ranges[q])

	requireError(t, e.get(t, "/api/v1/topics/missing"), http.StatusNotFound, admin.CodeTopicNotFound)
	requireError(t, e.get(t, "/api/v1/topics/bad%20name"), http.StatusBadRequest, admin.CodeInvalidTopic)
	// System topics are reachable with their '%' encoded.
	r = e.get(t, "/api/v1/topics/"+url.PathEscape(retry.ScheduleTopic))
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.True(t, decode[topicJSON](t, r).System)

	// Delete: gone, and a system topic cannot be deleted.
	requireError(t, e.do(t, http.MethodDelete, "/api/v1/topics/"+url.PathEscape(retry.ScheduleTopic), ""), http.StatusBadRequest, admin.CodeInvalidTopic)
	r = e.do(t, http.MethodDelete, "/api/v1/topics/orders", "")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.JSONEq(t, `{"name":"orders","deleted":true}`, string(r.body))
	requireError(t, e.get(t, "/api/v1/topics/orders"), http.StatusNotFound, admin.CodeTopicNotFound)
	requireError(t, e.do(t, http.MethodDelete, "/api/v1/topics/orders", ""), http.StatusNotFound, admin.CodeTopicNotFound)
	r = e.do(t, http.MethodPut, "/api/v1/topics/orders", "")
	requireError(t, r, http.StatusMethodNotAllowed, admin.CodeMethodNotAllowed)
	require.Equal(t, "GET, DELETE, PATCH", r.header.Get("Allow"))
	r = e.do(t, http.MethodDelete, "/api/v1/topics", "")
	requireError(t, r, http.StatusMethodNotAllowed, admin.CodeMethodNotAllowed)
	require.Equal(t, "GET, POST", r.header.Get("Allow"))
}

// TestTopicResize: PATCH /api/v1/topics/{topic} resizes a topic in use;
// the answer shows the new count, the retired queues still readable and the
// epochs; bad counts, system and unknown topics get clear errors.
func TestTopicResize(t *testing.T) {
	e := start(t, nil)
	r := e.do(t, http.MethodPost, "/api/v1/topics", `{"name":"orders","queues":4}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	for i := range 8 {
		_, err := e.gw.Store.Produce(t.Context(), &core.Message{Topic: "orders", ShardingKey: fmt.Sprintf("car-%d", i), Body: []byte("x")})
		require.NoError(t, err)
	}
	r = e.do(t, http.MethodPatch, "/api/v1/topics/orders", `{"queues":2}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	got := decode[topicJSON](t, r)
	require.Equal(t, 2, got.Queues)
	require.Len(t, got.Ranges, 4, "the retired queues stay readable")
	require.EqualValues(t, 8, got.Messages)
	require.Len(t, got.Epochs, 2)
	require.Equal(t, []int{4, 2}, []int{got.Epochs[0].Queues, got.Epochs[1].Queues})

	requireError(t, e.do(t, http.MethodPatch, "/api/v1/topics/orders", `{"queues":0}`), http.StatusBadRequest, admin.CodeBadRequest)
	requireError(t, e.do(t, http.MethodPatch, "/api/v1/topics/orders", `{"queues":1025}`), http.StatusBadRequest, admin.CodeBadRequest)
	requireError(t, e.do(t, http.MethodPatch, "/api/v1/topics/orders", `{"queues":"many"}`), http.StatusBadRequest, admin.CodeBadJSON)
	requireError(t, e.do(t, http.MethodPatch, "/api/v1/topics/"+url.PathEscape(retry.ScheduleTopic), `{"queues":2}`), http.StatusBadRequest, admin.CodeInvalidTopic)
	requireError(t, e.do(t, http.MethodPatch, "/api/v1/topics/nope", `{"queues":2}`), http.StatusNotFound, admin.CodeTopicNotFound)
}

func TestTopicList(t *testing.T) {
	e := start(t, func(o *admin.Options) { o.MaxPage = 3 })
	for _, name := range []string{"t1", "t2", "t3", "t4"} {
		r := e.do(t, http.MethodPost, "/api/v1/topics", fmt.Sprintf(`{"name":%q,"queues":2}`, name))
		require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	}
	e.produce(t, "t2", "x", "y")

	// A huge max is cut to MaxPage.
	r := e.get(t, "/api/v1/topics?max=99999999999999999999999")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	p := decode[topicPageJSON](t, r)
	var names []string
	for _, tp := range p.Topics {
		names = append(names, tp.Name)
		require.False(t, tp.System)
		require.Len(t, tp.Ranges, 2)
	}
	require.Equal(t, []string{"t1", "t2", "t3"}, names)
	require.Equal(t, int64(2), p.Topics[1].Messages)
	require.Equal(t, "t3", p.Next)

	p = decode[topicPageJSON](t, e.get(t, "/api/v1/topics?cursor="+p.Next))
	require.Len(t, p.Topics, 1)
	require.Equal(t, "t4", p.Topics[0].Name)
	require.Empty(t, p.Next)

	p = decode[topicPageJSON](t, e.get(t, "/api/v1/topics?max=1&cursor=t1"))
	require.Equal(t, "t2", p.Topics[0].Name)
	require.Equal(t, "t2", p.Next)

	// System topics only when asked for.
	all := decode[topicPageJSON](t, e.get(t, "/api/v1/topics?system=true&max=3"))
	require.True(t, all.Topics[0].System, "%%-topics sort first")

	for _, q := range []string{"max=0", "max=-1", "max=abc", "max=1&max=2", "system=maybe", "sort=name"} {
		requireError(t, e.get(t, "/api/v1/topics?"+q), http.StatusBadRequest, admin.CodeBadRequest)
	}
}

// heartbeat makes client a live clustering member of g subscribed to topic.
func heartbeat(t testing.TB, e *env, g, client, topic string) group.Assignment {
	t.Helper()
	a, err := e.groups.Heartbeat(t.Context(), group.HeartbeatRequest{Group: g, ClientID: client,
		Subscriptions: []group.Subscription{{Topic: topic}}})
	require.NoError(t, err)
	return a
}

func TestGroups(t *testing.T) {
	e := start(t, nil)
	r := e.do(t, http.MethodPost, "/api/v1/topics", `{"name":"orders","queues":1}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	e.produce(t, "orders", "a", "b", "c", "d")
	heartbeat(t, e, "billing", "worker-1", "orders")
	heartbeat(t, e, "audit", "a-1", "orders")

	// billing consumes two and commits.
	ref := group.QueueRef{Topic: "orders", Queue: 0}
	pr, err := e.groups.Pull(t.Context(), group.PullRequest{Group: "billing", ClientID: "worker-1", Queue: ref, Offset: -1, Max: 2})
	require.NoError(t, err)
	require.Len(t, pr.Messages, 2)
	require.NoError(t, e.groups.Commit(t.Context(), "billing", "worker-1", ref, pr.NextOffset))

	p := decode[groupPageJSON](t, e.get(t, "/api/v1/groups"))
	require.Len(t, p.Groups, 2)
	require.Equal(t, "audit", p.Groups[0].Name)
	require.Equal(t, "billing", p.Groups[1].Name)
	require.Equal(t, "clustering", p.Groups[1].Mode)
	require.Equal(t, "worker-1", p.Groups[1].Members[0].ClientID)
	require.Nil(t, p.Groups[1].Lag, "no lag in the listing")

	p = decode[groupPageJSON](t, e.get(t, "/api/v1/groups?max=1"))
	require.Len(t, p.Groups, 1)
	require.Equal(t, "audit", p.Next)
	p = decode[groupPageJSON](t, e.get(t, "/api/v1/groups?max=1&cursor=audit"))
	require.Equal(t, "billing", p.Groups[0].Name)
	require.Empty(t, p.Next)

	r = e.get(t, "/api/v1/groups/billing")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	g := decode[groupJSON](t, r)
	require.Equal(t, "billing", g.Name)
	require.Len(t, g.Members, 1)
	m := g.Members[0]
	require.Equal(t, "worker-1", m.ClientID)
	require.WithinDuration(t, time.Now(), m.LastHeartbeat, time.Minute)
	require.Equal(t, "orders", m.Subscriptions[0].Topic)
	require.NotEmpty(t, m.Queues)
	var orders *lagJSON
	for i := range g.Lag {
		if g.Lag[i].Topic == "orders" {
			orders = &g.Lag[i]
		}
	}
	require.NotNil(t, orders, "lag of orders in %+v", g.Lag)
	require.Equal(t, lagJSON{Topic: "orders", Queue: 0, Committed: 2, Min: 0, Max: 4, Lag: 2, Owner: "worker-1"}, *orders)
	require.NotNil(t, g.TotalLag)
	require.Equal(t, int64(2), *g.TotalLag)

	requireError(t, e.get(t, "/api/v1/groups/nobody"), http.StatusNotFound, admin.CodeGroupNotFound)
	requireError(t, e.get(t, "/api/v1/groups/bad%20group"), http.StatusBadRequest, admin.CodeInvalidGroup)
	requireError(t, e.do(t, http.MethodDelete, "/api/v1/groups/billing", ""), http.StatusMethodNotAllowed, admin.CodeMethodNotAllowed)
}

func TestGroupBroadcastLagPerMember(t *testing.T) {
	e := start(t, nil)
	e.produce(t, "news", "a", "b")
	for _, id := range []string{"m1", "m2"} {
		_, err := e.groups.Heartbeat(t.Context(), group.HeartbeatRequest{Group: "fanout", ClientID: id, Mode: group.Broadcast,
			Subscriptions: []group.Subscription{{Topic: "news"}}})
		require.NoError(t, err)
	}
	g := decode[groupJSON](t, e.get(t, "/api/v1/groups/fanout"))
	require.Equal(t, "broadcast", g.Mode)
	members := map[string]int64{}
	for _, l := range g.Lag {
		members[l.Member] += l.Lag
	}
	require.Equal(t, map[string]int64{"m1": 2, "m2": 2}, members)
	require.Equal(t, int64(4), *g.TotalLag)
}

func TestGroupReset(t *testing.T) {
	e := start(t, nil)
	r := e.do(t, http.MethodPost, "/api/v1/topics", `{"name":"orders","queues":1}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	sent := e.produce(t, "orders", "a", "b", "c", "d", "e")
	mid := sent[2].StoredAt // a reset to it starts at the first message stored at or after it
	before := int64(0)
	for _, s := range sent {
		if s.StoredAt.Before(mid) {
			before++
		}
	}
	heartbeat(t, e, "billing", "worker-1", "orders")

	committed := func() int64 {
		off, err := e.gw.Store.CommittedOffset(t.Context(), "billing", "orders", 0)
		require.NoError(t, err)
		return off
	}
	// Skip the backlog.
	r = e.do(t, http.MethodPost, "/api/v1/groups/billing/reset", `{"topic":"orders","to":"latest"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	res := decode[resetJSON](t, r)
	require.Equal(t, "billing", res.Group)
	require.Equal(t, "latest", res.To)
	require.Len(t, res.Offsets, 1)
	require.Equal(t, int64(5), res.Offsets[0].Offset)
	require.Equal(t, int64(5), committed())
	g := decode[groupJSON](t, e.get(t, "/api/v1/groups/billing"))
	require.Equal(t, int64(0), *g.TotalLag)

	r = e.do(t, http.MethodPost, "/api/v1/groups/billing/reset", `{"topic":"orders","to":"earliest"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Equal(t, int64(0), committed())

	r = e.do(t, http.MethodPost, "/api/v1/groups/billing/reset", fmt.Sprintf(`{"topic":"orders","to":%q}`, mid.UTC().Format(time.RFC3339Nano)))
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Equal(t, before, committed())

	// A group with no live member can be reset too (its offsets persist).
	r = e.do(t, http.MethodPost, "/api/v1/groups/later/reset", `{"topic":"orders","to":"latest"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)

	for _, tc := range []struct {
		path, body string
		status     int
		code       string
	}{
		{"/api/v1/groups/billing/reset", `{"topic":"orders"}`, http.StatusBadRequest, admin.CodeBadRequest},
		{"/api/v1/groups/billing/reset", `{"topic":"orders","to":"yesterday"}`, http.StatusBadRequest, admin.CodeBadRequest},
		{"/api/v1/groups/billing/reset", `{"to":"latest"}`, http.StatusBadRequest, admin.CodeBadRequest},
		{"/api/v1/groups/billing/reset", `{"topic":"a b","to":"latest"}`, http.StatusBadRequest, admin.CodeInvalidTopic},
		{"/api/v1/groups/billing/reset", `{"topic":"orders","to":"latest","queue":1}`, http.StatusBadRequest, admin.CodeBadJSON},
		{"/api/v1/groups/billing/reset", `{"topic":"missing","to":"latest"}`, http.StatusNotFound, admin.CodeTopicNotFound},
		{"/api/v1/groups/bad%20g/reset", `{"topic":"orders","to":"latest"}`, http.StatusBadRequest, admin.CodeInvalidGroup},
	} {
		t.Run(tc.body, func(t *testing.T) {
			requireError(t, e.do(t, http.MethodPost, tc.path, tc.body), tc.status, tc.code)
		})
	}
	requireError(t, e.get(t, "/api/v1/groups/billing/reset"), http.StatusMethodNotAllowed, admin.CodeMethodNotAllowed)
}

// deadLetter stores a message in topic and dead-letters it for g.
func deadLetter(t testing.TB, e *env, g, topic string, body []byte, reason string) core.SendResult {
	t.Helper()
	res, err := e.gw.Store.Produce(t.Context(), &core.Message{Topic: topic, ShardingKey: "k", Body: body,
		Properties: map[string]string{"source": "test"}})
	require.NoError(t, err)
	m, err := e.gw.Store.Get(t.Context(), res.ID)
	require.NoError(t, err)
	m.ReconsumeCount = 16
	require.NoError(t, e.retry.DeadLetter(t.Context(), g, m, reason))
	return res
}

func TestDeadLetters(t *testing.T) {
	e := start(t, nil)
	binary := []byte{0xff, 0x00, 0xfe}
	first := deadLetter(t, e, "billing", "orders", []byte(`{"total":12.5}`), "payment service down")
	second := deadLetter(t, e, "billing", "orders", binary, "bad format")
	long := deadLetter(t, e, "billing", "orders", []byte(strings.Repeat("é", admin.PreviewBytes)), "too long")

	r := e.get(t, "/api/v1/groups/billing/dead-letters")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	p := decode[deadLetterPageJSON](t, r)
	require.Equal(t, retry.DLQTopic("billing"), p.Topic)
	require.Len(t, p.DeadLetters, 3)
	require.Empty(t, p.Next)
	d := p.DeadLetters[0]
	require.Equal(t, "orders", d.OriginTopic)
	require.Equal(t, first.ID.String(), d.OriginID)
	require.Equal(t, "payment service down", d.Reason)
	require.Equal(t, 16, d.Reconsume)
	require.Equal(t, "k", d.Key)
	require.Equal(t, map[string]string{"source": "test"}, d.Properties)
	require.NotNil(t, d.Body)
	require.Equal(t, `{"total":12.5}`, *d.Body)
	require.False(t, d.Redriven)
	require.WithinDuration(t, time.Now(), d.StoredAt, time.Minute)
	d = p.DeadLetters[1]
	require.Equal(t, second.ID.String(), d.OriginID)
	require.Nil(t, d.Body)
	require.Equal(t, base64.StdEncoding.EncodeToString(binary), d.BodyBase64)
	d = p.DeadLetters[2]
	require.Equal(t, long.ID.String(), d.OriginID)
	require.True(t, d.Truncated)
	require.Equal(t, 2*admin.PreviewBytes, d.Size)
	require.Equal(t, strings.Repeat("é", admin.PreviewBytes/2), *d.Body)

	// Pages.
	p = decode[deadLetterPageJSON](t, e.get(t, "/api/v1/groups/billing/dead-letters?max=2"))
	require.Len(t, p.DeadLetters, 2)
	require.Equal(t, "0:2", p.Next)
	p = decode[deadLetterPageJSON](t, e.get(t, "/api/v1/groups/billing/dead-letters?max=2&cursor="+p.Next))
	require.Len(t, p.DeadLetters, 1)
	require.Equal(t, long.ID.String(), p.DeadLetters[0].OriginID)
	require.Empty(t, p.Next)
	p = decode[deadLetterPageJSON](t, e.get(t, "/api/v1/groups/billing/dead-letters?max=1000000000"))
	require.Len(t, p.DeadLetters, 3)

	// A group that never dead-lettered anything has none.
	p = decode[deadLetterPageJSON](t, e.get(t, "/api/v1/groups/quiet/dead-letters"))
	require.Empty(t, p.DeadLetters)
	requireError(t, e.get(t, "/api/v1/groups/billing/dead-letters?cursor=x"), http.StatusBadRequest, admin.CodeBadRequest)
	requireError(t, e.get(t, "/api/v1/groups/bad%20g/dead-letters"), http.StatusBadRequest, admin.CodeInvalidGroup)

	// Redrive one, then the rest (an empty body: the default max).
	r = e.do(t, http.MethodPost, "/api/v1/groups/billing/dead-letters/redrive", `{"max":1}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Equal(t, 1, decode[struct {
		Redriven int `json:"redriven"`
	}](t, r).Redriven)
	info, err := e.gw.Store.Topic(t.Context(), "orders")
	require.NoError(t, err)
	q := core.QueueFor("k", info.Queues)
	res, err := e.gw.Store.Read(t.Context(), core.ReadRequest{Topic: "orders", Queue: q, Offset: 3})
	require.NoError(t, err)
	require.Len(t, res.Messages, 1, "the redriven message is back in its topic")
	require.Equal(t, `{"total":12.5}`, string(res.Messages[0].Body))
	require.Equal(t, first.ID.String(), res.Messages[0].Properties[retry.PropOriginID])

	p = decode[deadLetterPageJSON](t, e.get(t, "/api/v1/groups/billing/dead-letters"))
	require.True(t, p.DeadLetters[0].Redriven)
	require.False(t, p.DeadLetters[1].Redriven)

	r = e.do(t, http.MethodPost, "/api/v1/groups/billing/dead-letters/redrive", "")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Contains(t, string(r.body), `"redriven":2`)
	r = e.do(t, http.MethodPost, "/api/v1/groups/billing/dead-letters/redrive", `{"max":99999999}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Contains(t, string(r.body), `"redriven":0`)

	requireError(t, e.do(t, http.MethodPost, "/api/v1/groups/billing/dead-letters/redrive", `{"max":0}`), http.StatusBadRequest, admin.CodeBadRequest)
	requireError(t, e.do(t, http.MethodPost, "/api/v1/groups/billing/dead-letters/redrive", `{"max":"1"}`), http.StatusBadRequest, admin.CodeBadJSON)
	requireError(t, e.do(t, http.MethodGet, "/api/v1/groups/billing/dead-letters/redrive", ""), http.StatusMethodNotAllowed, admin.CodeMethodNotAllowed)
	requireError(t, e.do(t, http.MethodPost, "/api/v1/groups/billing/dead-letters", ""), http.StatusMethodNotAllowed, admin.CodeMethodNotAllowed)
}

// A page of large dead letters stops after 8 MiB of them, with a cursor.
func TestDeadLettersPageBytes(t *testing.T) {
	e := start(t, nil)
	big := []byte(strings.Repeat("x", 3<<20))
	for range 3 {
		deadLetter(t, e, "billing", "orders", big, "too big to handle")
	}
	deadLetter(t, e, "billing", "orders", []byte("small"), "")
	p := decode[deadLetterPageJSON](t, e.get(t, "/api/v1/groups/billing/dead-letters?max=10"))
	require.Len(t, p.DeadLetters, 3)
	require.True(t, p.DeadLetters[0].Truncated)
	require.Equal(t, 3<<20, p.DeadLetters[0].Size)
	require.Equal(t, "0:3", p.Next)
	p = decode[deadLetterPageJSON](t, e.get(t, "/api/v1/groups/billing/dead-letters?max=10&cursor="+p.Next))
	require.Len(t, p.DeadLetters, 1)
	require.Equal(t, "small", *p.DeadLetters[0].Body)
	require.Empty(t, p.DeadLetters[0].Reason)
	require.Empty(t, p.Next)
}

func TestClients(t *testing.T) {
	e := start(t, nil)
	before := time.Now().Add(-time.Second)
	c := dialV3(t, e.gw.TCP, "dev-1", func(o *paho3.ClientOptions) {
		o.SetUsername("alice").SetPassword("pw-very-secret").SetWill("devices/dev-1/status", "offline-will-payload", 1, false)
	})
	wait(t, c.Subscribe("cmd/dev-1/#", 1, nil))
	wait(t, c.Subscribe("broadcast", 0, nil))
	dialV3(t, e.gw.TCP, "dev-2")

	r := e.get(t, "/api/v1/clients")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	requireNoSecret(t, r, "pw-very-secret")
	requireNoSecret(t, r, "offline-will-payload")
	p := decode[clientPageJSON](t, r)
	require.Len(t, p.Clients, 2)
	require.Empty(t, p.Next)
	cl := p.Clients[0]
	require.Equal(t, "dev-1", cl.ID)
	require.True(t, cl.Connected)
	require.Equal(t, "alice", cl.Username)
	require.Equal(t, "127.0.0.1", cl.RemoteIP)
	require.Contains(t, cl.Remote, "127.0.0.1:")
	require.Equal(t, byte(4), cl.ProtocolVersion)
	require.Equal(t, uint16(30), cl.Keepalive)
	require.True(t, cl.CleanStart)
	require.Nil(t, cl.SessionExpiry)
	require.True(t, cl.ConnectedAt.After(before), "connected_at %v", cl.ConnectedAt)
	subs := map[string]byte{}
	for _, s := range cl.Subscriptions {
		subs[s.Filter] = s.QoS
	}
	require.Equal(t, map[string]byte{"broadcast": 0, "cmd/dev-1/#": 1}, subs,
		"the client's own (point-to-point commands need none: the bridge sends them to the session)")
	require.Equal(t, 0, cl.Inflight)
	require.Equal(t, "dev-2", p.Clients[1].ID)

	p = decode[clientPageJSON](t, e.get(t, "/api/v1/clients?max=1"))
	require.Len(t, p.Clients, 1)
	require.Equal(t, "dev-1", p.Next)
	p = decode[clientPageJSON](t, e.get(t, "/api/v1/clients?max=1&cursor=dev-1"))
	require.Equal(t, "dev-2", p.Clients[0].ID)
	require.Empty(t, p.Next)
	p = decode[clientPageJSON](t, e.get(t, "/api/v1/clients?max=100000000"))
	require.Len(t, p.Clients, 2)

	r = e.get(t, "/api/v1/clients/dev-1")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	one := decode[clientJSON](t, r)
	require.Equal(t, "alice", one.Username)
	require.True(t, one.Connected)

	// MQTT 5: the session expiry shows.
	dialV5(t, e.gw.TCP, "v5 client/with slash", nil)
	r = e.get(t, "/api/v1/clients/"+url.PathEscape("v5 client/with slash"))
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	one = decode[clientJSON](t, r)
	require.Equal(t, byte(5), one.ProtocolVersion)

	requireError(t, e.get(t, "/api/v1/clients/nobody"), http.StatusNotFound, admin.CodeClientNotFound)
	requireError(t, e.get(t, "/api/v1/clients?cursor=a&cursor=b"), http.StatusBadRequest, admin.CodeBadRequest)
	requireError(t, e.do(t, http.MethodPost, "/api/v1/clients", "{}"), http.StatusMethodNotAllowed, admin.CodeMethodNotAllowed)
}

func TestParkedSession(t *testing.T) {
	e := start(t, nil)
	c := dialV3(t, e.gw.TCP, "car-7", func(o *paho3.ClientOptions) { o.SetCleanSession(false).SetUsername("fleet") })
	wait(t, c.Subscribe("cars/car-7/cmd", 1, nil))
	// While connected, the MQTT server holds the session: kick first.
	requireError(t, e.do(t, http.MethodDelete, "/api/v1/sessions/car-7", ""), http.StatusConflict, admin.CodeSessionHeld)
	c.Disconnect(100)
	eng := e.gw.Gateway.Engine()
	require.Eventually(t, func() bool { return !eng.Connected("car-7") && eng.HasSession("car-7") }, 10*time.Second, 10*time.Millisecond)

	r := e.get(t, "/api/v1/clients/car-7")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	cl := decode[clientJSON](t, r)
	require.Equal(t, "car-7", cl.ID)
	require.False(t, cl.Connected)
	require.Equal(t, "fleet", cl.Username)
	require.NotNil(t, cl.Session)
	require.True(t, cl.Session.Parked)
	require.Equal(t, 1, cl.Session.Subscriptions)
	require.False(t, cl.Session.Deadline.IsZero(), "an MQTT 3 persistent session parks with the server's longest expiry")

	// Offline clients are not in the list of connected ones, nor can they
	// be kicked.
	p := decode[clientPageJSON](t, e.get(t, "/api/v1/clients"))
	require.Empty(t, p.Clients)
	requireError(t, e.do(t, http.MethodDelete, "/api/v1/clients/car-7", ""), http.StatusNotFound, admin.CodeClientNotFound)

	// A parked session is deleted with its queue.
	require.NoError(t, eng.Send("car-7", &engine.Message{Topic: "cars/car-7/cmd", QoS: 1, Payload: []byte("unlock")}))
	require.Eventually(t, func() bool { return e.gw.Sessions.Stats().Messages == 1 }, 10*time.Second, 10*time.Millisecond, "stored")
	r = e.do(t, http.MethodDelete, "/api/v1/sessions/car-7", "")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.JSONEq(t, `{"id":"car-7","deleted":true,"dropped":1}`, string(r.body))
	require.False(t, eng.HasSession("car-7"))
	requireError(t, e.get(t, "/api/v1/clients/car-7"), http.StatusNotFound, admin.CodeClientNotFound)
	requireError(t, e.do(t, http.MethodDelete, "/api/v1/sessions/car-7", ""), http.StatusNotFound, admin.CodeSessionNotFound)
	requireError(t, e.do(t, http.MethodDelete, "/api/v1/sessions/nobody", ""), http.StatusNotFound, admin.CodeSessionNotFound)
	require.Eventually(t, func() bool { st := e.gw.Sessions.Stats(); return st.Sessions == 0 && st.Messages == 0 },
		10*time.Second, 10*time.Millisecond, "the session is gone from the store")
	requireError(t, e.get(t, "/api/v1/sessions/car-7"), http.StatusMethodNotAllowed, admin.CodeMethodNotAllowed)
}

func TestKickClient(t *testing.T) {
	e := start(t, nil)
	var reason atomic.Int32
	reason.Store(-1)
	c := dialV5(t, e.gw.TCP, "kick-me", func(d *paho.Disconnect) { reason.Store(int32(d.ReasonCode)) })
	dialV5(t, e.gw.TCP, "stay", nil)

	// Not without authorization.
	requireError(t, e.doWith(t, http.MethodDelete, "/api/v1/clients/kick-me", "", nil), http.StatusUnauthorized, admin.CodeUnauthorized)

	r := e.do(t, http.MethodDelete, "/api/v1/clients/kick-me", "")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.JSONEq(t, `{"id":"kick-me","disconnected":true}`, string(r.body))
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the kicked client is still connected")
	}
	require.Eventually(t, func() bool { return reason.Load() == 0x98 }, 10*time.Second, 10*time.Millisecond,
		"DISCONNECT with reason 0x98 administrative action, got %#x", reason.Load())
	require.Eventually(t, func() bool {
		p := decode[clientPageJSON](t, e.get(t, "/api/v1/clients"))
		return len(p.Clients) == 1 && p.Clients[0].ID == "stay"
	}, 10*time.Second, 10*time.Millisecond)
	requireError(t, e.do(t, http.MethodDelete, "/api/v1/clients/kick-me", ""), http.StatusNotFound, admin.CodeClientNotFound)

	// An MQTT 3.1.1 client loses its connection.
	lost := make(chan struct{})
	dialV3(t, e.gw.TCP, "old-device", func(o *paho3.ClientOptions) {
		o.SetConnectionLostHandler(func(paho3.Client, error) { close(lost) })
	})
	r = e.do(t, http.MethodDelete, "/api/v1/clients/old-device", "")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	select {
	case <-lost:
	case <-time.After(10 * time.Second):
		t.Fatal("the kicked MQTT 3 client is still connected")
	}
}

func TestRetained(t *testing.T) {
	e := start(t, nil)
	c := dialV3(t, e.gw.TCP, "thermostat")
	wait(t, c.Publish("home/kitchen/temp", 1, true, "21.5"))
	big := make([]byte, 2*admin.PreviewBytes)
	for i := range big {
		big[i] = byte(i)
	}
	wait(t, c.Publish("home/camera/frame", 0, true, big))
	wait(t, c.Publish("/leading/slash", 0, true, "x"))
	eng := e.gw.Gateway.Engine()
	require.Eventually(t, func() bool { // QoS 0 publishes: sent is not processed
		for _, topic := range []string{"home/kitchen/temp", "home/camera/frame", "/leading/slash"} {
			if _, ok := eng.RetainedMessage(topic); !ok {
				return false
			}
		}
		return e.gw.Sessions.Stats().Retained == 3 // and stored by the session store
	}, 10*time.Second, 10*time.Millisecond)

	r := e.get(t, "/api/v1/retained")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	p := decode[retainedPageJSON](t, r)
	require.Len(t, p.Retained, 3)
	require.Equal(t, "/leading/slash", p.Retained[0].Topic)
	frame := p.Retained[1]
	require.Equal(t, "home/camera/frame", frame.Topic)
	require.Equal(t, 2*admin.PreviewBytes, frame.Size)
	require.True(t, frame.Truncated)
	require.Nil(t, frame.Payload)
	require.Equal(t, base64.StdEncoding.EncodeToString(big[:admin.PreviewBytes]), frame.PayloadBase64)
	temp := p.Retained[2]
	require.Equal(t, "home/kitchen/temp", temp.Topic)
	require.Equal(t, byte(1), temp.QoS)
	require.Equal(t, "21.5", *temp.Payload)
	require.False(t, temp.Truncated)
	require.Equal(t, "thermostat", temp.Origin)
	require.WithinDuration(t, time.Now(), temp.CreatedAt, time.Minute)

	p = decode[retainedPageJSON](t, e.get(t, "/api/v1/retained?max=2"))
	require.Len(t, p.Retained, 2)
	require.Equal(t, "home/camera/frame", p.Next)
	p = decode[retainedPageJSON](t, e.get(t, "/api/v1/retained?max=2&cursor="+url.QueryEscape(p.Next)))
	require.Len(t, p.Retained, 1)
	require.Empty(t, p.Next)

	r = e.get(t, "/api/v1/retained/home/kitchen/temp")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Equal(t, "21.5", *decode[retainedJSON](t, r).Payload)
	// A topic with a leading '/' (or empty levels): its slashes encoded.
	r = e.get(t, "/api/v1/retained/"+url.PathEscape("/leading/slash"))
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)

	// Clear one: it goes from the engine and from the session store, and a
	// subscriber arriving later gets nothing.
	requireError(t, e.doWith(t, http.MethodDelete, "/api/v1/retained/home/kitchen/temp", "", nil), http.StatusUnauthorized, admin.CodeUnauthorized)
	r = e.do(t, http.MethodDelete, "/api/v1/retained/home/kitchen/temp", "")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.JSONEq(t, `{"topic":"home/kitchen/temp","cleared":true}`, string(r.body))
	_, ok := eng.RetainedMessage("home/kitchen/temp")
	require.False(t, ok)
	require.Eventually(t, func() bool { return e.gw.Sessions.Stats().Retained == 2 }, 10*time.Second, 10*time.Millisecond)
	requireError(t, e.get(t, "/api/v1/retained/home/kitchen/temp"), http.StatusNotFound, admin.CodeRetainedNotFound)
	requireError(t, e.do(t, http.MethodDelete, "/api/v1/retained/home/kitchen/temp", ""), http.StatusNotFound, admin.CodeRetainedNotFound)
	var got atomic.Int32
	late := dialV3(t, e.gw.TCP, "late-subscriber")
	wait(t, late.Subscribe("home/#", 0, func(paho3.Client, paho3.Message) { got.Add(1) }))
	require.Eventually(t, func() bool { return got.Load() == 1 }, 10*time.Second, 10*time.Millisecond, "only the frame is retained under home/")
	p = decode[retainedPageJSON](t, e.get(t, "/api/v1/retained"))
	require.Len(t, p.Retained, 2)

	requireError(t, e.do(t, http.MethodDelete, "/api/v1/retained/home/%2B/temp", ""), http.StatusBadRequest, admin.CodeBadRequest)
	requireError(t, e.do(t, http.MethodDelete, "/api/v1/retained/home/%23", ""), http.StatusBadRequest, admin.CodeBadRequest)
	requireError(t, e.do(t, http.MethodPost, "/api/v1/retained/home/camera/frame", ""), http.StatusMethodNotAllowed, admin.CodeMethodNotAllowed)
	requireError(t, e.do(t, http.MethodDelete, "/api/v1/retained", ""), http.StatusMethodNotAllowed, admin.CodeMethodNotAllowed)
}

// Every write needs AllowWrites or an authorized request; reads do not
// (the caller's token check guards them).
func TestWritesNeedAuthorization(t *testing.T) {
	writes := []struct{ method, path, body string }{
		{http.MethodPost, "/api/v1/topics", `{"name":"t"}`},
		{http.MethodDelete, "/api/v1/topics/u", ""},
		{http.MethodPost, "/api/v1/groups/g/reset", `{"topic":"t","to":"latest"}`},
		{http.MethodPost, "/api/v1/groups/g/dead-letters/redrive", `{"max":1}`},
		{http.MethodDelete, "/api/v1/clients/c", ""},
		{http.MethodDelete, "/api/v1/sessions/c", ""},
		{http.MethodDelete, "/api/v1/retained/a/b", ""},
	}
	t.Run("authorize", func(t *testing.T) {
		e := start(t, nil)
		for _, w := range writes {
			for _, hdr := range []http.Header{nil, {"Authorization": {"Bearer wrong"}}, {"Authorization": {token}}} {
				r := e.doWith(t, w.method, w.path, w.body, hdr)
				requireError(t, r, http.StatusUnauthorized, admin.CodeUnauthorized)
				require.Equal(t, `Bearer realm="ferrymq"`, r.header.Get("WWW-Authenticate"))
				requireNoSecret(t, r, token)
			}
			r := e.do(t, w.method, w.path, w.body) // with the token: past the check
			require.NotEqual(t, http.StatusUnauthorized, r.status, "%s %s: %s", w.method, w.path, r.body)
			require.NotEqual(t, http.StatusForbidden, r.status)
		}
		_, err := e.gw.Store.Topic(t.Context(), "t")
		require.NoError(t, err, "the authorized create went through")
		require.Equal(t, http.StatusOK, e.get(t, "/api/v1/topics").status, "reads need no write authorization")
	})
	t.Run("read-only", func(t *testing.T) {
		e := start(t, func(o *admin.Options) { o.Authorize = nil })
		for _, w := range writes {
			requireError(t, e.do(t, w.method, w.path, w.body), http.StatusForbidden, admin.CodeWritesDisabled)
		}
		_, err := e.gw.Store.Topic(t.Context(), "t")
		require.ErrorIs(t, err, core.ErrTopicNotFound)
	})
	t.Run("allow-writes", func(t *testing.T) {
		e := start(t, func(o *admin.Options) { o.Authorize, o.AllowWrites = nil, true })
		r := e.doWith(t, http.MethodPost, "/api/v1/topics", `{"name":"t"}`, nil)
		require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	})
}

func TestDisabledParts(t *testing.T) {
	h, err := admin.New(admin.Options{AllowWrites: true, Version: "v"})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	r := send(t, srv.URL, http.MethodGet, "/api/v1/node", "", nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	n := decode[nodeJSON](t, r)
	require.Nil(t, n.MQTT)
	require.Nil(t, n.Sessions)
	for _, tc := range []struct{ method, path, body, code string }{
		{http.MethodGet, "/api/v1/topics", "", admin.CodeStoreDisabled},
		{http.MethodPost, "/api/v1/topics", `{"name":"t"}`, admin.CodeStoreDisabled},
		{http.MethodGet, "/api/v1/topics/t", "", admin.CodeStoreDisabled},
		{http.MethodGet, "/api/v1/groups", "", admin.CodeGroupsDisabled},
		{http.MethodGet, "/api/v1/groups/g", "", admin.CodeGroupsDisabled},
		{http.MethodPost, "/api/v1/groups/g/reset", `{}`, admin.CodeGroupsDisabled},
		{http.MethodGet, "/api/v1/groups/g/dead-letters", "", admin.CodeStoreDisabled},
		{http.MethodPost, "/api/v1/groups/g/dead-letters/redrive", "", admin.CodeRetryDisabled},
		{http.MethodGet, "/api/v1/clients", "", admin.CodeMQTTDisabled},
		{http.MethodGet, "/api/v1/clients/c", "", admin.CodeMQTTDisabled},
		{http.MethodDelete, "/api/v1/clients/c", "", admin.CodeMQTTDisabled},
		{http.MethodDelete, "/api/v1/sessions/c", "", admin.CodeMQTTDisabled}, // sessions live in the MQTT engine
		{http.MethodGet, "/api/v1/retained", "", admin.CodeMQTTDisabled},
		{http.MethodGet, "/api/v1/retained/a", "", admin.CodeMQTTDisabled},
		{http.MethodDelete, "/api/v1/retained/a", "", admin.CodeMQTTDisabled},
	} {
		requireError(t, send(t, srv.URL, tc.method, tc.path, tc.body, nil), http.StatusNotImplemented, tc.code)
	}
}

// The admin patterns and core/httpapi share one mux, as ferrymq serve
// mounts them: each path reaches its own handler.
func TestPatternsBesideHTTPAPI(t *testing.T) {
	e := start(t, nil)
	adminH, err := admin.New(admin.Options{Broker: e.gw.Store, AllowWrites: true})
	require.NoError(t, err)
	apiH, err := httpapi.New(httpapi.Options{Broker: e.gw.Store})
	require.NoError(t, err)
	mux := http.NewServeMux()
	for _, p := range admin.Patterns() {
		mux.Handle(p, adminH)
	}
	mux.Handle("/api/", apiH)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	r := send(t, srv.URL, http.MethodPost, "/api/v1/topics", `{"name":"orders","queues":2}`, nil)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body) // admin
	r = send(t, srv.URL, http.MethodPost, "/api/v1/topics/orders/messages", `{"body":"hi"}`, nil)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body) // httpapi
	r = send(t, srv.URL, http.MethodGet, "/api/v1/topics/orders", "", nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body) // admin
	require.Equal(t, int64(1), decode[topicJSON](t, r).Messages)
	r = send(t, srv.URL, http.MethodGet, "/api/v1/messages?topic=orders&begin=2000-01-01T00:00:00Z", "", nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body) // httpapi
	r = send(t, srv.URL, http.MethodGet, "/api/v1/delayed", "", nil)
	require.Equal(t, http.StatusNotImplemented, r.status, "%s", r.body) // httpapi, without delay
}

func TestBearerAuthorizer(t *testing.T) {
	req := func(h string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		if h != "" {
			r.Header.Set("Authorization", h)
		}
		return r
	}
	ok := admin.BearerAuthorizer("tok")
	require.True(t, ok(req("Bearer tok")))
	require.False(t, ok(req("Bearer tok2")))
	require.False(t, ok(req("tok")))
	require.False(t, ok(req("")))
	none := admin.BearerAuthorizer("")
	require.False(t, none(req("Bearer ")))
	require.False(t, none(req("")))
}
