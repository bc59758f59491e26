package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ferrymq/ferrymq/core/wire"
)

// Shards served elsewhere. In a cluster each consumer group (and the
// node-wide services: delayed messages, transactions, group listing) is
// served by one node; a node asked for a shard it does not serve answers
// wire.CodeMoved naming the node that does. The client follows: it dials
// that node (a peer: a Client of its own, with this one's options), sends
// the request again there, and sends the shard's next requests there
// directly until that node moves it again or goes away. Requests without
// a shard (produce, reads, queries, topics) stay on the client's own
// connection.

// noShard marks requests any node serves.
const noShard = "\x00"

// shardServices is the shard of the node-wide services.
const shardServices = ""

// root is the client transaction producers are registered with: c, or the
// client that dialed peer c.
func (c *Client) root() *Client {
	if c.parent != nil {
		return c.parent
	}
	return c
}

// callShard is call for a request of shard: sent where the shard is
// served, following CodeMoved answers (up to maxMoves), and sent again
// after a pause while the node answers that the shard's services are not
// running yet or any more (CodeShuttingDown: a node starting, or handing
// the shard over), until ctx ends.
func (c *Client) callShard(ctx context.Context, shard string, op wire.Op, payload []byte) ([]byte, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.opts.RequestTimeout)
		defer cancel()
	}
	b := backoff{max: 250 * time.Millisecond} // a shard moves within a lease TTL: look again often
	moves := 0
	for {
		p, err := c.routeOf(shard).call(ctx, op, payload)
		if c.parent != nil || err == nil {
			return p, err
		}
		if addr, moved := wire.MovedTo(err); moved && moves < maxMoves {
			next, ferr := c.follow(ctx, shard, addr)
			if ferr == nil && next.connected() {
				moves++
				continue
			}
			// The node named is not reachable now — one that died and
			// whose leases have not expired yet: ask again after a pause,
			// until the cluster names the shard's next node.
			if ferr == nil {
				ferr = fmt.Errorf("%w: %s", ErrConnLost, addr)
			}
			if b.wait(ctx) {
				continue
			}
			return nil, fmt.Errorf("%w; following it: %w", err, ferr)
		}
		var we *wire.Error
		if errors.As(err, &we) && we.Code == wire.CodeShuttingDown && b.wait(ctx) {
			continue
		}
		return p, err
	}
}

// maxMoves bounds the CodeMoved answers one request follows: shards move
// when nodes come and go, not back and forth.
const maxMoves = 3

// callShardJSON is callJSON for a request of shard.
func (c *Client) callShardJSON(ctx context.Context, shard string, op wire.Op, req, resp any) error {
	return c.callJSONVia(ctx, op, req, resp, func(ctx context.Context, op wire.Op, b []byte) ([]byte, error) {
		return c.callShard(ctx, shard, op, b)
	})
}

// routeOf returns the client shard's requests go to: the peer its last
// CodeMoved answer named while that peer is connected, else c.
func (c *Client) routeOf(shard string) *Client {
	if shard == noShard {
		return c
	}
	c.mu.Lock()
	addr, ok := c.routes[shard]
	peer := c.peers[addr]
	c.mu.Unlock()
	if !ok || peer == nil {
		return c
	}
	if !peer.connected() {
		// The node went away (or is reconnecting): ask the own node again,
		// which names the shard's new home.
		c.mu.Lock()
		if c.routes[shard] == addr {
			delete(c.routes, shard)
		}
		c.mu.Unlock()
		return c
	}
	return peer
}

// follow records that shard is served at addr and returns the client for
// it, dialing a peer if there is none for addr yet.
func (c *Client) follow(ctx context.Context, shard, addr string) (*Client, error) {
	if shard == noShard {
		return nil, fmt.Errorf("client: a request any node serves was moved to %s", addr)
	}
	if c.ownAddr(addr) {
		c.mu.Lock()
		delete(c.routes, shard)
		c.mu.Unlock()
		return c, nil
	}
	peer, err := c.peer(ctx, addr)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if _, had := c.routes[shard]; !had {
		c.log.Info().Str("shard", shard).Str("node", addr).Msg("following a shard to the node that serves it")
	}
	c.routes[shard] = addr
	c.mu.Unlock()
	return peer, nil
}

// peer returns the client of the node at addr, dialing it (with this
// client's options) if there is none yet.
func (c *Client) peer(ctx context.Context, addr string) (*Client, error) {
	c.mu.Lock()
	peer := c.peers[addr]
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	if peer != nil {
		return peer, nil
	}
	opts := c.opts
	opts.Addr, opts.Discover = addr, false
	np, err := dial(ctx, opts, c)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		_ = np.Close()
		return nil, ErrClosed
	}
	if peer = c.peers[addr]; peer == nil {
		peer = np
		c.peers[addr] = np
		np = nil
	}
	c.mu.Unlock()
	if np != nil { // another call dialed it meanwhile
		_ = np.Close()
	}
	return peer, nil
}

// ownAddr reports whether addr is one of the addresses the client's own
// connection is made to.
func (c *Client) ownAddr(addr string) bool {
	for _, a := range strings.Split(c.opts.Addr, ",") {
		if strings.TrimSpace(a) == addr {
			return true
		}
	}
	return false
}

// closePeers closes the peers (at Close).
func (c *Client) closePeers() {
	c.mu.Lock()
	peers := c.peers
	c.peers = map[string]*Client{}
	c.mu.Unlock()
	for _, p := range peers {
		_ = p.Close()
	}
}

// eachPeer runs f on every peer.
func (c *Client) eachPeer(f func(*Client)) {
	c.mu.Lock()
	peers := make([]*Client, 0, len(c.peers))
	for _, p := range c.peers {
		peers = append(peers, p)
	}
	c.mu.Unlock()
	for _, p := range peers {
		f(p)
	}
}
