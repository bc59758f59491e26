package natstest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// childEnv is the environment variable that turns the test binary into a
// nats-server child; its value is the node spec as JSON.
const childEnv = "FERRYMQ_NATSTEST_CHILD"

const (
	// parentCheckInterval is how often a child checks that its parent
	// lives.
	parentCheckInterval = 200 * time.Millisecond
	// statusInterval is how often a child rewrites its status file.
	statusInterval = 100 * time.Millisecond
	// statusFileName is the child's status report, in its node folder.
	statusFileName = "status.json"
)

// childStatus is what a child reports about its server in status.json, for
// the parent's readiness checks: some of it (which peers the meta leader
// can place streams on) is visible on no network endpoint.
type childStatus struct {
	PID     int       `json:"pid"`
	Written time.Time `json:"written"`
	// Health is the /healthz error, empty when healthy.
	Health string `json:"health,omitempty"`
	// MetaLeader is set on the JetStream meta leader of a cluster.
	MetaLeader bool `json:"meta_leader,omitempty"`
	// Peers are, on the meta leader, the online JetStream peers that have
	// reported their stats, so that streams can be placed on them.
	Peers []string `json:"peers,omitempty"`
}

// MaybeChild runs a nats-server child process when the test binary was
// started as one by RunProcessServer or RunProcessCluster, and exits the
// process when the server stops; otherwise it returns at once. Call it
// first thing in TestMain of every package that uses process nodes.
func MaybeChild() {
	raw, ok := os.LookupEnv(childEnv)
	if !ok {
		return
	}
	if err := runChild(raw); err != nil {
		fmt.Fprintf(os.Stderr, "natstest child: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// runChild runs the server described by raw until SIGTERM, SIGINT, the
// parent's death or the server's own shutdown.
func runChild(raw string) error {
	var sp nodeSpec
	if err := json.Unmarshal([]byte(raw), &sp); err != nil {
		return fmt.Errorf("decode %s: %w", childEnv, err)
	}
	parent := os.Getppid()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, os.Interrupt)
	defer signal.Stop(sigs)

	ns, err := server.NewServer(sp.options())
	if err != nil {
		return fmt.Errorf("new nats server %s: %w", sp.Name, err)
	}
	ns.ConfigureLogger()
	ns.Start()
	defer func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	}()
	if !ns.ReadyForConnections(startTimeout) {
		return fmt.Errorf("nats server %s not ready after %v", sp.Name, startTimeout)
	}

	stop := make(chan struct{})
	defer close(stop)
	reportStatus(ns, filepath.Join(sp.StoreDir, statusFileName), stop)
	select {
	case <-sigs:
	case <-parentGone(parent, stop):
	case <-shutdownDone(ns):
	}
	return nil
}

// parentGone returns a channel that is closed when the process is no longer
// the child of parent (the parent died and the child was re-parented). Its
// goroutine stops when stop is closed.
func parentGone(parent int, stop <-chan struct{}) <-chan struct{} {
	gone := make(chan struct{})
	go func() {
		tick := time.NewTicker(parentCheckInterval)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if os.Getppid() != parent {
					close(gone)
					return
				}
			}
		}
	}()
	return gone
}

// reportStatus writes the server's status to path now and then every
// statusInterval, until stop is closed. Write errors are ignored: the
// parent then sees a stale or missing status and keeps waiting.
func reportStatus(ns *server.Server, path string, stop <-chan struct{}) {
	_ = writeStatus(ns, path)
	go func() {
		tick := time.NewTicker(statusInterval)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				_ = writeStatus(ns, path)
			}
		}
	}()
}

// writeStatus replaces the status file atomically.
func writeStatus(ns *server.Server, path string) error {
	st := childStatus{PID: os.Getpid(), Written: time.Now()}
	if h := ns.Healthz(nil); h.StatusCode != http.StatusOK {
		st.Health = fmt.Sprintf("%s: %s", h.Status, h.Error)
	}
	// JetStreamClusterPeers needs a cluster; a single server calls itself
	// the leader without one.
	if ns.JetStreamIsClustered() && ns.JetStreamIsLeader() {
		st.MetaLeader = true
		st.Peers = ns.JetStreamClusterPeers()
	}
	raw, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("encode status: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, raw, 0o644); err != nil {
		return fmt.Errorf("write status: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("replace status: %w", err)
	}
	return nil
}

// readStatus reads a status file written by pid, refusing one that is
// older than maxAge.
func readStatus(path string, pid int, maxAge time.Duration) (childStatus, error) {
	var st childStatus
	raw, err := os.ReadFile(path)
	if err != nil {
		return st, fmt.Errorf("read status: %w", err)
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return st, fmt.Errorf("decode status %s: %w", path, err)
	}
	if st.PID != pid {
		return st, fmt.Errorf("status %s is from pid %d, not %d", path, st.PID, pid)
	}
	if age := time.Since(st.Written); age > maxAge {
		return st, fmt.Errorf("status %s is %v old", path, age.Round(time.Millisecond))
	}
	return st, nil
}

// shutdownDone returns a channel that is closed when ns has shut down. Its
// goroutine ends with the server, which runChild always shuts down.
func shutdownDone(ns *server.Server) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		ns.WaitForShutdown()
		close(done)
	}()
	return done
}
