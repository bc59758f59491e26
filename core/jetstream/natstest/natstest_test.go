package natstest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/core/jetstream/natstest"
)

// TestMain runs nats-server children (MaybeChild) and otherwise the tests
// under goleak: shut-down servers, closed connections and killed children
// leave no goroutine behind, so no ignore list is needed.
func TestMain(m *testing.M) {
	natstest.MaybeChild()
	goleak.VerifyTestMain(m)
}

const (
	streamName = "ORDERS"
	subject    = "orders.new"
	// failoverTimeout covers a raft election after SIGKILL (4-9 s) plus
	// slack for -race on two cores.
	failoverTimeout = 30 * time.Second
)

// small keeps each test server's JetStream reservation modest.
var small = natstest.Limits(64<<20, 256<<20)

func TestRunServer(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t, small)
	js := connect(t, s.URL)
	createStream(t, js, 1)
	publish(t, js, 0, 10)
	if got := msgCount(t, js); got != 10 {
		t.Fatalf("stream has %d messages, want 10", got)
	}
}

func TestClusterLeaderStopRestart(t *testing.T) {
	t.Parallel()
	c := natstest.RunCluster(t, 3, small)
	if len(c.Servers) != 3 {
		t.Fatalf("cluster has %d servers, want 3", len(c.Servers))
	}
	c.WaitMetaLeader(t, 5*time.Second)
	js := connect(t, c.URLs())
	createStream(t, js, 3)
	publish(t, js, 0, 100)

	old := c.WaitStreamLeader(t, streamName, 10*time.Second)
	c.Stop(old)
	if c.Servers[old].Running() {
		t.Fatalf("node %d still running after Stop", old)
	}
	if l := c.WaitStreamLeader(t, streamName, failoverTimeout); l == old {
		t.Fatalf("stopped node %d is still the stream leader", old)
	}
	publish(t, js, 100, 150)

	c.Restart(old)
	if got := msgCount(t, js); got != 150 {
		t.Fatalf("stream has %d messages, want 150", got)
	}
	waitLocalCount(t, func() (uint64, error) { return inProcessLocalCount(c.Servers[old]) }, 150)
}

func TestProcessClusterKillLeader(t *testing.T) {
	t.Parallel()
	c := natstest.RunProcessCluster(t, 3, natstest.SyncAlways(), small)
	checkChildConfig(t, c.Nodes[0].MonitorURL)
	js := connect(t, c.URLs())
	createStream(t, js, 3)
	publish(t, js, 0, 100)

	old := c.WaitStreamLeader(t, streamName, 10*time.Second)
	pid := c.Nodes[old].Pid()
	c.Kill(old)
	if c.Nodes[old].Running() || pid == 0 {
		t.Fatalf("node %d (pid %d) still running after Kill", old, pid)
	}
	if l := c.WaitStreamLeader(t, streamName, failoverTimeout); l == old {
		t.Fatalf("killed node %d is still the stream leader", old)
	}
	publish(t, js, 100, 150)

	c.Start(old)
	c.WaitReady(t, failoverTimeout)
	if got := msgCount(t, js); got != 150 {
		t.Fatalf("stream has %d messages, want 150", got)
	}
	waitLocalCount(t, func() (uint64, error) {
		info, err := monitorJsz(c.Nodes[old].MonitorURL, "?accounts=true&streams=true")
		if err != nil {
			return 0, err
		}
		return localCount(info)
	}, 150)
}

func TestProcessClusterKillAll(t *testing.T) {
	t.Parallel()
	c := natstest.RunProcessCluster(t, 3, natstest.SyncAlways(), small)
	js := connect(t, c.URLs())
	createStream(t, js, 3)
	publish(t, js, 0, 50)

	// A whole-cluster crash loses nothing that was acknowledged.
	c.KillAll()
	for i, n := range c.Nodes {
		if n.Running() {
			t.Fatalf("node %d still running after KillAll", i)
		}
	}
	c.StartAll()
	c.WaitReady(t, failoverTimeout)
	c.WaitStreamLeader(t, streamName, failoverTimeout)
	if got := msgCount(t, js); got != 50 {
		t.Fatalf("stream has %d messages after KillAll/StartAll, want 50", got)
	}
}

func TestProcessServerKillKeepsSyncedData(t *testing.T) {
	t.Parallel()
	p := natstest.RunProcessServer(t, natstest.SyncAlways(), small)
	js := connect(t, p.URL)
	createStream(t, js, 1)
	publish(t, js, 0, 20)

	p.Kill()
	p.Start()
	p.WaitReady(t, 10*time.Second)
	if got := msgCount(t, js); got != 20 {
		t.Fatalf("stream has %d messages after SIGKILL, want 20", got)
	}
}

// connect returns a JetStream context on a connection that keeps
// reconnecting to any of urls and closes with the test.
func connect(t *testing.T, urls string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(urls, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatalf("connect %s: %v", urls, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	return js
}

func createStream(t *testing.T, js jetstream.JetStream, replicas int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:     streamName,
		Subjects: []string{"orders.>"},
		Storage:  jetstream.FileStorage,
		Replicas: replicas,
		MaxBytes: 16 << 20,
	})
	if err != nil {
		t.Fatalf("create stream: %v", err)
	}
}

// publish publishes messages from..to-1, each with a message id so that a
// retry across a leader change does not store a message twice; each
// message is retried for up to failoverTimeout.
func publish(t *testing.T, js jetstream.JetStream, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.NoError(c, publishOne(js, i))
		}, failoverTimeout, 50*time.Millisecond, "publish message %d", i)
	}
}

func publishOne(js jetstream.JetStream, i int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	id := fmt.Sprintf("msg-%d", i)
	if _, err := js.Publish(ctx, subject, []byte(id), jetstream.WithMsgID(id)); err != nil {
		return fmt.Errorf("publish %s: %w", id, err)
	}
	return nil
}

// msgCount returns the stream's message count from the stream leader,
// retrying while the cluster settles.
func msgCount(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	var n uint64
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, streamName)
		if assert.NoError(c, err, "stream info") {
			n = s.CachedInfo().State.Msgs
		}
	}, failoverTimeout, 50*time.Millisecond)
	return n
}

// waitLocalCount waits until one node's own copy of the stream holds want
// messages.
func waitLocalCount(t *testing.T, local func() (uint64, error), want uint64) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		got, err := local()
		if assert.NoError(c, err) {
			assert.Equal(c, want, got, "messages on the restarted node")
		}
	}, failoverTimeout, 50*time.Millisecond)
}

// inProcessLocalCount reads the stream state of one in-process server.
func inProcessLocalCount(s *natstest.Server) (uint64, error) {
	info, err := s.Jsz(&server.JSzOptions{Accounts: true, Streams: true})
	if err != nil {
		return 0, fmt.Errorf("jsz: %w", err)
	}
	return localCount(info)
}

// checkChildConfig checks that the options reached a child process.
func checkChildConfig(t *testing.T, monitorURL string) {
	t.Helper()
	info, err := monitorJsz(monitorURL, "")
	if err != nil {
		t.Fatal(err)
	}
	if !info.Config.SyncAlways || info.Config.MaxStore != 256<<20 || info.Config.MaxMemory != 64<<20 {
		t.Fatalf("child JetStream config %+v, want sync always, 64 MiB memory, 256 MiB store", info.Config)
	}
}

// monitorClient keeps no idle connections, which goleak would report.
var monitorClient = &http.Client{
	Timeout:   2 * time.Second,
	Transport: &http.Transport{DisableKeepAlives: true},
}

// monitorJsz fetches a process node's /jsz page.
func monitorJsz(monitorURL, query string) (*server.JSInfo, error) {
	resp, err := monitorClient.Get(monitorURL + "/jsz" + query)
	if err != nil {
		return nil, fmt.Errorf("get jsz: %w", err)
	}
	defer resp.Body.Close()
	var info server.JSInfo
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
		return nil, fmt.Errorf("decode jsz: %w", err)
	}
	return &info, nil
}

func localCount(info *server.JSInfo) (uint64, error) {
	for _, acc := range info.AccountDetails {
		for _, st := range acc.Streams {
			if st.Name == streamName {
				return st.State.Msgs, nil
			}
		}
	}
	return 0, fmt.Errorf("stream %s not in jsz", streamName)
}
