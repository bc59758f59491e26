package node

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ferrymq/ferrymq/core/wire"
)

// Discovery (wire OpCluster): the core port names the nodes a client may
// connect to. The embedded engine is one node. With the JetStream engine
// every node records its advertised core address in the engine's bucket
// (at start, and again once its core port listens and knows the port it
// bound), and every node's core port names the nodes whose liveness
// leases are alive, with their recorded addresses and which one holds the
// core services: a client given one address learns where to go when its
// node goes away.

// nodeInfo is what a node records for discovery.
type nodeInfo struct {
	Name string `json:"name"`
	Core string `json:"core,omitempty"`
}

// advertised is the address clients reach this node's core port at:
// Core.Advertise, else the bound address (the configured one before the
// core port listens), with the host's name for an address that binds
// every interface; "" while the port is not known (":0" before it
// listens).
func (n *Node) advertised() string {
	co := n.opts.Core
	if co == nil {
		return ""
	}
	if co.Advertise != "" {
		return co.Advertise
	}
	addr := co.Addr
	if b := n.coreBound.Load(); b != nil {
		addr = *b
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "0" || port == "" {
		return ""
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		h, err := os.Hostname()
		if err != nil || h == "" {
			return ""
		}
		host = h
	}
	return net.JoinHostPort(host, port)
}

// recordNodeInfo writes this node's nodeInfo to the engine's bucket
// (JetStream engine only); failures are logged, discovery is best effort.
func (n *Node) recordNodeInfo(ctx context.Context) {
	if n.engine == nil {
		return
	}
	b, err := json.Marshal(nodeInfo{Name: n.nodeName, Core: n.advertised()})
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := n.engine.SetNodeInfo(ctx, n.nodeName, b); err != nil {
		n.log.Warn().Err(err).Msg("node info for discovery not recorded")
	}
}

// clusterInfo answers OpCluster.
func (n *Node) clusterInfo(ctx context.Context) (wire.ClusterInfo, error) {
	self := wire.NodeInfo{Name: n.nodeName, Core: n.advertised(), Holder: true}
	if n.engine == nil {
		return wire.ClusterInfo{Nodes: []wire.NodeInfo{self}}, nil
	}
	holder := ""
	if el := n.coreLease.Load(); el != nil {
		holder = el.Holder()
	}
	self.Holder = holder == n.nodeName
	holders, err := n.engine.Holders(ctx, "", "node.")
	if err != nil {
		return wire.ClusterInfo{}, err
	}
	alive := map[string]bool{}
	for _, h := range holders {
		alive[h] = true
	}
	cores, err := n.recordedCores(ctx)
	if err != nil {
		return wire.ClusterInfo{}, err
	}
	out := wire.ClusterInfo{Nodes: []wire.NodeInfo{self}}
	for name, core := range cores {
		if name != n.nodeName && alive[name] {
			out.Nodes = append(out.Nodes, wire.NodeInfo{Name: name, Core: core, Holder: name == holder})
		}
	}
	slices.SortFunc(out.Nodes[1:], func(a, b wire.NodeInfo) int { return strings.Compare(a.Name, b.Name) })
	if n.shards != nil {
		if out.Groups, err = n.shards.holders(ctx); err != nil {
			return wire.ClusterInfo{}, err
		}
	}
	return out, nil
}

// peerAddrs caches the core addresses the nodes recorded (nodeInfo), for
// naming the node a shard is served by (placement): a lookup in the
// engine's bucket at most every peerAddrsTTL.
type peerAddrs struct {
	n  *Node
	mu sync.Mutex
	at time.Time
	by map[string]string // node name → core address
}

const peerAddrsTTL = time.Second

// addrOf returns the core address node recorded ("" when none).
func (p *peerAddrs) addrOf(ctx context.Context, node string) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if addr, ok := p.by[node]; ok && time.Since(p.at) < peerAddrsTTL {
		return addr, nil
	}
	by, err := p.n.recordedCores(ctx)
	if err != nil {
		return "", err
	}
	p.by, p.at = by, time.Now()
	return p.by[node], nil
}

// recordedCores reads the nodeInfo every node recorded: node name → core
// address ("" when it has none). Records that do not decode are left out.
func (n *Node) recordedCores(ctx context.Context) (map[string]string, error) {
	raws, err := n.engine.NodeInfos(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(raws))
	for _, raw := range raws {
		var ni nodeInfo
		if json.Unmarshal(raw, &ni) == nil && ni.Name != "" {
			out[ni.Name] = ni.Core
		}
	}
	return out, nil
}
