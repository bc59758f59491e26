package node

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core/jetstream"
	"github.com/ferrymq/ferrymq/core/rendezvous"
	"github.com/ferrymq/ferrymq/core/server"
)

// Consumer groups split across the nodes (JetStream engine;
// docs/engines.md, "Every node serves the core"). Each consumer group is
// served — heartbeats, pulls, commits, POP, acks, lag, resets — by one
// node: the one rendezvous hashing picks for the group's name among the
// nodes whose liveness leases are alive (core/rendezvous), which every
// node computes alike without asking anyone. That node holds the group's
// lease ("group.<name>", the core lease's bucket and TTL) while it serves
// it, so two nodes never serve one group even while their views of the
// live nodes differ: the chosen node serves once it holds the lease, a
// node no longer chosen gives it up (and forgets the group's members and
// queue leases, group.Coordinator.Drop), and the others answer CodeMoved
// naming the chosen node. A node that dies keeps its groups until its
// liveness lease and theirs expire (lease_ttl); then the nodes left share
// them. Members find the group's node by the CodeMoved answers (the Go
// client follows them), commit where it is, and a group that moves resumes
// from its committed offsets: messages delivered and not yet committed
// there are delivered again (at least once).

// groupShards places consumer groups on this node or another.
type groupShards struct {
	n    *Node
	self string
	ttl  time.Duration
	log  zerolog.Logger

	mu     sync.Mutex
	leases map[string]*jetstream.Election // the groups this node campaigns for
	live   []string                       // the nodes with a liveness lease, at liveAt
	liveAt time.Time
	closed bool

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// liveTTL is how long a listing of the live nodes is used: a node that
// died is noticed this long after its liveness lease expired, at most.
const liveTTL = 250 * time.Millisecond

func newGroupShards(n *Node, ttl time.Duration) *groupShards {
	g := &groupShards{n: n, self: n.nodeName, ttl: ttl, leases: map[string]*jetstream.Election{},
		log: n.log.With().Str("component", "shards").Logger()}
	ctx, cancel := context.WithCancel(context.Background())
	g.cancel = cancel
	g.wg.Go(func() { g.rebalance(ctx) })
	return g
}

// route is the core server's placement of a consumer group.
func (g *groupShards) route(ctx context.Context, group string) (server.Route, error) {
	live, err := g.liveNodes(ctx)
	if err != nil {
		return server.Route{}, err
	}
	want := rendezvous.Pick(live, group)
	if want != g.self {
		g.release(group)
		addr, err := g.n.peers.addrOf(ctx, want)
		return server.Route{Node: want, Addr: addr}, err
	}
	el, err := g.campaign(ctx, group)
	if err != nil {
		return server.Route{}, err
	}
	if el.Held() {
		return server.Route{Here: true}, nil
	}
	// The node that served it before lets go within a moment (rebalance),
	// or its lease expires: the client asks again.
	return server.Route{}, nil
}

// holders lists which node serves each group (discovery): the groups'
// leases.
func (g *groupShards) holders(ctx context.Context) (map[string]string, error) {
	raw, err := g.n.engine.LeaseHolders(ctx, groupLeasePrefix)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(raw))
	for name, holder := range raw {
		out[strings.TrimPrefix(name, groupLeasePrefix)] = holder
	}
	return out, nil
}

// groupLeasePrefix begins the lease names of groups.
const groupLeasePrefix = "group."

// liveNodes returns the nodes with a liveness lease and a core port (this
// one always).
func (g *groupShards) liveNodes(ctx context.Context) ([]string, error) {
	g.mu.Lock()
	if time.Since(g.liveAt) < liveTTL {
		live := g.live
		g.mu.Unlock()
		return live, nil
	}
	g.mu.Unlock()
	cores, err := g.n.liveCoreNodes(ctx)
	if err != nil {
		return nil, err
	}
	live := []string{g.self}
	for _, h := range cores {
		if h != g.self {
			live = append(live, h)
		}
	}
	g.mu.Lock()
	g.live, g.liveAt = live, time.Now()
	g.mu.Unlock()
	return live, nil
}

// campaign returns this node's election for group's lease, starting it.
func (g *groupShards) campaign(ctx context.Context, group string) (*jetstream.Election, error) {
	g.mu.Lock()
	el, closed := g.leases[group], g.closed
	g.mu.Unlock()
	if closed {
		return nil, errShardsClosed
	}
	if el != nil {
		return el, nil
	}
	el, err := g.n.engine.Elect(ctx, jetstream.LeaseOptions{Name: groupLeasePrefix + group, Holder: g.self, TTL: g.ttl,
		Retry: max(g.ttl/20, 50*time.Millisecond), Logger: &g.log,
		OnChange: func(held bool) {
			if !held { // lost (not renewed in time): its state goes
				g.n.groups.Drop(group)
			}
		}})
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	if other := g.leases[group]; other != nil || g.closed {
		g.mu.Unlock()
		_ = el.Close()
		if other == nil {
			return nil, errShardsClosed
		}
		return other, nil
	}
	g.leases[group] = el
	g.mu.Unlock()
	g.log.Info().Str("group", group).Msg("campaigning for a consumer group placed here")
	return el, nil
}

var errShardsClosed = errors.New("node: shutting down")

// release stops campaigning for group, giving its lease up if held, and
// forgets its state.
func (g *groupShards) release(group string) {
	g.mu.Lock()
	el := g.leases[group]
	delete(g.leases, group)
	g.mu.Unlock()
	if el == nil {
		return
	}
	held := el.Held()
	_ = el.Close() // deletes the lease if held: the chosen node takes it at its next try
	g.n.groups.Drop(group)
	if held {
		g.log.Info().Str("group", group).Msg("consumer group handed over: another node is chosen for it now")
	}
}

// rebalance gives up, every liveTTL, the groups this node is no longer
// chosen for (a node joined, or its view of the live nodes changed), so
// that their chosen node can take them without waiting for a request here.
func (g *groupShards) rebalance(ctx context.Context) {
	t := time.NewTicker(liveTTL)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		live, err := g.liveNodes(ctx)
		if err != nil {
			continue
		}
		g.mu.Lock()
		var gone []string
		for group := range g.leases {
			if rendezvous.Pick(live, group) != g.self {
				gone = append(gone, group)
			}
		}
		g.mu.Unlock()
		for _, group := range gone {
			g.release(group)
		}
	}
}

// close gives every group lease up and stops.
func (g *groupShards) close() error {
	g.cancel()
	g.wg.Wait()
	g.mu.Lock()
	g.closed = true
	leases := g.leases
	g.leases = map[string]*jetstream.Election{}
	g.mu.Unlock()
	for _, el := range leases {
		_ = el.Close()
	}
	return nil
}

// servicesShard is the name rendezvous hashing places the node-wide
// services by (retry's schedules, delay movers, transactions, the session
// janitor: the core lease), among the same live nodes as the groups.
const servicesShard = "%services"

// placedForServices is the core election's Eligible: this node campaigns
// for the core lease only while rendezvous hashing places the node-wide
// services here (and a holder no longer placed hands it over), so they
// move when a node joins or dies like the groups do. Before the shards
// exist (the start), or when the live nodes cannot be listed (NATS not
// answering: nobody can move anything), a node with a core port stays
// eligible; one without is eligible only when no live node has one.
func (n *Node) placedForServices() bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	g := n.shardsRef.Load()
	if g == nil {
		if n.opts.Core != nil {
			return true // starting
		}
		// A gateway-only node (no core port) runs them only in a cluster
		// of such nodes: the delay movers then, for MQTT's delayed topics.
		return !n.coreNodeLive(ctx)
	}
	live, err := g.liveNodes(ctx)
	if err != nil {
		return true
	}
	return rendezvous.Pick(live, servicesShard) == g.self
}

// coreNodeLive reports whether a live node has a core port (an error
// listing them counts as yes: a node without one does not take the
// services on a guess).
func (n *Node) coreNodeLive(ctx context.Context) bool {
	cores, err := n.liveCoreNodes(ctx)
	return err != nil || len(cores) > 0
}

// liveCoreNodes lists the nodes with a liveness lease and a core port —
// those that serve shards (a gateway-only node records no core address).
// A node whose address cannot be looked up counts.
func (n *Node) liveCoreNodes(ctx context.Context) ([]string, error) {
	holders, err := n.engine.Holders(ctx, "", "node.")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, h := range holders {
		if addr, err := n.peers.addrOf(ctx, h); err != nil || addr != "" {
			out = append(out, h)
		}
	}
	return out, nil
}
