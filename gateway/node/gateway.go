package node

import (
	"cmp"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/ferrymq/ferrymq/bridge"
	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/gateway"
	"github.com/ferrymq/ferrymq/gateway/cluster"
	"github.com/ferrymq/ferrymq/gateway/rpc"
	"github.com/ferrymq/ferrymq/session"
)

// newGateway builds the session store, the bridge (bo says which core it
// uses: Broker or Core), the auth hook, the router between nodes (engine
// nats) and the MQTT gateway with its listeners; st (nil without a local
// store) adds store metrics. The gateway is not started yet.
func (n *Node) newGateway(bo bridge.Options, st *store.Store) error {
	o := &n.opts
	if bo.Logger == nil {
		bo.Logger = n.log
	}
	hooks := o.Gateway.Hooks
	var err error
	switch {
	case hooks.Sessions != nil:
		if s, ok := hooks.Sessions.(*session.Store); ok {
			n.sessions = s // the caller's: not closed here
		}
	case n.engine != nil: // engine nats: sessions in a JetStream bucket, shared by the nodes
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		n.sessions, err = session.OpenKV(ctx, n.engine.JetStream(), session.KVOptions{Logger: n.log, NodeID: n.nodeName,
			Replicas: o.NATS.Replicas, Timeout: o.NATS.Timeout})
		cancel()
		n.ownSessions = true
	case o.Sessions != nil:
		so := *o.Sessions
		if so.Logger == nil {
			so.Logger = n.log
		}
		// A core that fsyncs before it acknowledges keeps a QoS 2 publish
		// across a power loss: so must the record its resend is found by.
		so.SyncInbound = so.SyncInbound || o.Store.FlushPolicy == store.FlushSync
		n.sessions, err = session.Open(filepath.Join(o.DataDir, "sessions"), so)
		n.ownSessions = true
	}
	if err != nil {
		n.sessions = nil
		return fmt.Errorf("sessions: %w", err)
	}
	// Synchronous calls to devices: answers are taken off the bridge; with
	// engine nats a call reaches devices connected to other nodes.
	ro := rpc.Options{Node: cmp.Or(n.nodeName, bo.Node, hostname()), Trace: bo.Trace, Logger: n.log}
	if n.engine != nil {
		ro.Conn, ro.Peers = n.engine.Conn(), n.otherLiveNodes
	}
	if n.rpc, err = rpc.New(ro); err != nil {
		return fmt.Errorf("device calls: %w", err)
	}
	bo.Interceptors = append(slices.Clip(bo.Interceptors), n.rpc)
	if o.Auth != nil {
		hook, closers, err := newAuth(o.Auth, n.log)
		n.closers = append(n.closers, closers...)
		if err != nil {
			return err
		}
		hooks.Auth, hooks.ACL, hooks.Limits = hook, hook, hook
	}
	if err := n.newShadowDevices(hooks.ACL); err != nil {
		return fmt.Errorf("device shadows: %w", err)
	}
	if n.devices != nil {
		bo.Interceptors = append(bo.Interceptors[:len(bo.Interceptors):len(bo.Interceptors)], n.devices)
	}
	if n.bridge, err = bridge.New(bo); err != nil {
		return fmt.Errorf("bridge: %w", err)
	}
	gwo := o.Gateway
	gwo.Listeners = append([]gateway.Listener(nil), o.Gateway.Listeners...)
	if o.MQTTAddr != "" {
		gwo.Listeners = append(gwo.Listeners, gateway.Listener{Type: "tcp", Addr: o.MQTTAddr, ProxyProtocol: o.ProxyProtocol})
	}
	if o.WSAddr != "" {
		gwo.Listeners = append(gwo.Listeners, gateway.Listener{Type: "ws", Addr: o.WSAddr, Path: o.WSPath})
	}
	for i, t := range o.TLS {
		cfg, err := gateway.LoadTLS(t.Cert, t.Key, t.ClientCA)
		if err != nil {
			return fmt.Errorf("mqtt tls listener %d: %w", i+1, err)
		}
		gwo.Listeners = append(gwo.Listeners, gateway.Listener{Name: t.Name, Type: t.Type, Addr: t.Addr, Path: t.Path, TLS: cfg})
	}
	if hooks.Sessions == nil && n.sessions != nil {
		hooks.Sessions = n.sessions
	}
	if hooks.Uplink == nil {
		hooks.Uplink = n.bridge
	}
	if hooks.Presence == nil {
		hooks.Presence = n.bridge
	}
	if hooks.Delivery == nil {
		hooks.Delivery = n.bridge
	}
	if n.engine != nil && hooks.Router == nil {
		// engine nats: MQTT publish/subscribe between devices on different
		// nodes, over NATS interest (gateway/cluster).
		if n.router, err = cluster.New(cluster.Options{Conn: n.engine.Conn(), Node: n.nodeName, Logger: n.log}); err != nil {
			return fmt.Errorf("mqtt routing between nodes: %w", err)
		}
		hooks.Router = n.router
	}
	gwo.Hooks = hooks
	if mi := bo.MaxInflight; mi > 0 && (gwo.ReceiveMaximum == 0 || uint16(min(mi, 65535)) < gwo.ReceiveMaximum) {
		gwo.ReceiveMaximum = uint16(min(mi, 65535)) // the bridge's max inflight bounds the same thing: publishes on their way to the core
	}
	if gwo.MaxQueued == 0 {
		gwo.MaxQueued = bo.OfflineMaxMessages
	}
	if gwo.MaxQueuedBytes == 0 {
		gwo.MaxQueuedBytes = bo.OfflineMaxBytes
	}
	gwo.Node = cmp.Or(gwo.Node, bo.Node)
	if gwo.Store == nil {
		gwo.Store = st
	}
	if gwo.Logger == nil {
		gwo.Logger = n.log
	}
	if n.gateway, err = gateway.New(gwo); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	// The calls' service got the engine through the bridge, whose
	// interceptor it is (as the shadows' MQTT side below).
	n.gateway.Registry().MustRegister(n.rpc.Collectors()...)
	if err := n.rpc.Start(); err != nil {
		return fmt.Errorf("device calls: %w", err)
	}
	if n.devices != nil { // attached to the engine through the bridge
		n.gateway.Registry().MustRegister(newShadowCollector(n.shadows), n.devices)
		n.devices.Start()
	}
	n.anonymous = n.anonymousListeners(n.gateway)
	for _, a := range n.anonymous {
		n.log.Warn().Str("listener", a.Name).Str("addr", a.Addr).
			Msg("ANONYMOUS MQTT ACCESS BEYOND LOOPBACK (auth.anonymous: true): clients with no credentials may connect from other machines")
	}
	if o.authOff() {
		n.log.Info().Msg("no auth configured: the MQTT listeners accept only clients on this machine (loopback); configure auth to serve devices (docs/security.md)")
	}
	return nil
}

// otherLiveNodes counts the other nodes holding a liveness lease (engine
// nats), for calls to devices: a call no node has the device for fails
// once they all said so. Cached for a second.
func (n *Node) otherLiveNodes(ctx context.Context) (int, error) {
	if c := n.liveCount.Load(); c != nil && time.Since(c.at) < time.Second {
		return c.n, nil
	}
	holders, err := n.engine.Holders(ctx, "", "node.")
	if err != nil {
		return 0, err
	}
	others := 0
	for _, h := range holders {
		if h != n.nodeName {
			others++
		}
	}
	n.liveCount.Store(&liveCount{n: others, at: time.Now()})
	return others, nil
}

// liveCount is a count of live nodes and when it was taken.
type liveCount struct {
	n  int
	at time.Time
}
