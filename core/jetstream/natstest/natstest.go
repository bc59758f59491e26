// Package natstest starts real NATS servers with JetStream for tests: in
// process from the nats-server module, on loopback ports, with their store
// in a temporary folder. Nothing here is a fake.
//
// There are three shapes:
//
//   - RunServer: one in-process JetStream server.
//   - RunCluster: an in-process JetStream cluster (normally 3 nodes named
//     n1..nN, cluster "ferrymq-test") whose nodes can be stopped and
//     restarted with the same ports, name and store.
//   - RunProcessServer and RunProcessCluster: every node is a separate OS
//     process, so a test can SIGKILL it and see what survives on disk.
//
// # Child processes
//
// Process nodes re-execute the running test binary with the environment
// variable FERRYMQ_NATSTEST_CHILD set to the node's settings. A test package
// that uses them must call MaybeChild first thing in its TestMain:
//
//	func TestMain(m *testing.M) {
//		natstest.MaybeChild()
//		os.Exit(m.Run())
//	}
//
// When the variable is set, MaybeChild runs the nats-server until SIGTERM,
// SIGINT or the death of the parent, then calls os.Exit; it never returns.
// Otherwise it returns at once. The child writes nothing to stdout: the
// server log goes to nats-server.log and stderr to stderr.log in the node's
// folder, next to status.json, the child's own health report that the
// readiness checks read. Child processes are killed when the test ends and,
// on Linux, by the kernel when the test binary dies (Pdeathsig); a child
// whose parent is gone also exits by itself.
//
// All helpers that take a testing.TB, and the methods of the returned
// values, must be called from the test's goroutine: they fail the test with
// t.Fatalf.
package natstest

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// startTimeout bounds how long one server may take to accept connections.
const startTimeout = 10 * time.Second

// MaxPayload is the max_payload of every server this package starts: 8 MiB,
// as testdata/nats and docs/engines.md set it. nats-server's default (1 MB)
// is too small for a message of core.MaxBodyBytes (4 MiB) and its envelope.
const MaxPayload = 8 << 20

// Server is one running nats-server.
type Server struct {
	*server.Server
	// URL is the client URL (nats://127.0.0.1:port).
	URL string
	// Dir is the JetStream store folder.
	Dir  string
	opts *server.Options
}

// Option changes the server options before start. For process nodes only
// the settings of SyncAlways and Limits (sync_interval, max memory and max
// file store) reach the child; other changes are ignored there.
type Option func(*server.Options)

// SyncAlways makes JetStream fsync every write before acknowledging it
// (sync_interval: always), the setting ferrymq documents for production.
func SyncAlways() Option { return func(o *server.Options) { o.SyncAlways = true } }

// Limits caps the JetStream memory store and file store, in bytes, like
// max_memory_store and max_file_store. Use small values when many servers
// run at once; 0 keeps the server's default (a share of the machine).
func Limits(maxMemory, maxStore int64) Option {
	return func(o *server.Options) {
		o.JetStreamMaxMemory = maxMemory
		o.JetStreamMaxStore = maxStore
	}
}

// RunServer starts a single-node JetStream server and stops it when the test
// ends.
func RunServer(t testing.TB, opts ...Option) *Server {
	t.Helper()
	o := &server.Options{
		ServerName: "n1",
		Host:       loopback,
		Port:       server.RANDOM_PORT,
		JetStream:  true,
		StoreDir:   t.TempDir(),
		MaxPayload: MaxPayload,
		NoLog:      true,
		NoSigs:     true,
	}
	for _, opt := range opts {
		opt(o)
	}
	s, err := start(o)
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// start starts a server from o and waits until it accepts connections.
func start(o *server.Options) (*Server, error) {
	ns, err := server.NewServer(o)
	if err != nil {
		return nil, fmt.Errorf("new nats server %s: %w", o.ServerName, err)
	}
	ns.Start()
	if !ns.ReadyForConnections(startTimeout) {
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, fmt.Errorf("nats server %s not ready after %v", o.ServerName, startTimeout)
	}
	return &Server{Server: ns, URL: ns.ClientURL(), Dir: o.StoreDir, opts: o}, nil
}

// Shutdown stops the server and waits until it has stopped. It may be
// called more than once.
func (s *Server) Shutdown() {
	s.Server.Shutdown()
	s.Server.WaitForShutdown()
}
