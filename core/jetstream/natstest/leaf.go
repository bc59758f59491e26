package natstest

import (
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"go.uber.org/goleak"
)

// RunLeafPair starts two servers with JetStream domains of their own: the
// primary (domain primary, accepting leaf nodes) and the standby (domain
// standby, a leaf node of the primary), the shape of a standby cluster
// that mirrors a primary's streams (failover mode 2). It returns once the
// leaf connection is up. opts apply to both.
func RunLeafPair(t testing.TB, primary, standby string, opts ...Option) (p, s *Server) {
	t.Helper()
	ln, err := net.Listen("tcp", loopback+":0")
	if err != nil {
		t.Fatalf("natstest: leaf port: %v", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	p = RunServer(t, append(opts, func(o *server.Options) {
		o.ServerName, o.JetStreamDomain = "primary", primary
		o.LeafNode.Host, o.LeafNode.Port = loopback, port
	})...)
	u, err := url.Parse(fmt.Sprintf("nats-leaf://%s:%d", loopback, port))
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	s = RunServer(t, append(opts, func(o *server.Options) {
		o.ServerName, o.JetStreamDomain = "standby", standby
		o.LeafNode.Remotes = []*server.RemoteLeafOpts{{URLs: []*url.URL{u}}}
	})...)
	deadline := time.Now().Add(startTimeout)
	for s.NumLeafNodes() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("natstest: the standby's leaf connection to the primary is not up after %v", startTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return p, s
}

// IgnoreServerGoroutines are goleak options for what an in-process
// nats-server leaves running after its Shutdown (nats-server's own, not the
// code under test): a mirror stream's consumer set-up goroutine waits out
// its retry timer before it sees the server is gone; and a stream's file
// store created while the server shuts down — a test that stops NATS under
// a node still creating its streams — is never stopped, so its state
// flusher and the store-wide access-time ticker it registered keep running.
func IgnoreServerGoroutines() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*stream).setupMirrorConsumer.func3"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushStreamStateLoop"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server/ats.Register.func1"),
	}
}
