package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/bridge"
	"github.com/ferrymq/ferrymq/core/client"
	"github.com/ferrymq/ferrymq/core/store"
	"github.com/ferrymq/ferrymq/gateway"
	"github.com/ferrymq/ferrymq/gateway/cluster"
	"github.com/ferrymq/ferrymq/gateway/engine"
	"github.com/ferrymq/ferrymq/session"
)

// newGateway builds the MQTT gateway and its bridge from flags and the
// config file's mqtt and bridge sections; bo says which core the bridge
// uses (Broker or Core), st (nil for a remote core) adds store metrics.
func (o *serveOptions) newGateway(bo bridge.Options, st *store.Store, log *zerolog.Logger) (*gateway.Gateway, error) {
	mc, bc := o.file.MQTT, o.file.Bridge
	down, err := bc.downlinkRules()
	if err != nil {
		return nil, err
	}
	so := session.Options{Logger: log}
	var sessions *session.Store
	if o.kv != nil { // engine nats: sessions in a JetStream bucket, shared by the nodes
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		sessions, err = session.OpenKV(ctx, o.kv.JetStream(), session.KVOptions{Logger: log, NodeID: o.kvNode, Replicas: o.file.NATS.Replicas,
			Timeout: time.Duration(o.file.NATS.Timeout)})
		cancel()
	} else {
		sessions, err = session.Open(filepath.Join(o.dataDir, "sessions"), so)
	}
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = sessions.Close()
		}
	}()
	br, err := bridge.New(bridge.Options{
		Core:               bo.Core,
		Broker:             bo.Broker,
		Uplink:             bc.Uplink,
		EventsTopic:        bc.EventsTopic,
		DisableEvents:      bc.DisableEvents,
		MaxInflight:        bc.MaxInflight,
		MaxDelay:           bo.MaxDelay,
		Trace:              bo.Trace,
		Downlink:           down,
		DisableDownlink:    bc.DisableDownlink,
		ReceiptsTopic:      bc.ReceiptsTopic,
		DisableReceipts:    bc.DisableReceipts,
		DeadLetterTopic:    bc.DeadLetterTopic,
		OfflineMaxMessages: bc.OfflineMaxMessages,
		OfflineMaxBytes:    bc.OfflineMaxBytes,
		HoldUnknown:        holdUnknown(bc.HoldUnknown, bo.HoldUnknown),
		Node:               cmp.Or(bo.Node, bc.Node),
		Logger:             log,
	})
	if err != nil {
		return nil, fmt.Errorf("bridge: %w", err)
	}
	var lns []gateway.Listener
	if o.mqttAddr != "" {
		lns = append(lns, gateway.Listener{Type: "tcp", Addr: o.mqttAddr, ProxyProtocol: mc.ProxyProtocol})
	}
	if o.wsAddr != "" {
		lns = append(lns, gateway.Listener{Type: "ws", Addr: o.wsAddr, Path: mc.WS.Path})
	}
	for i, t := range mc.TLS {
		if t.Cert == "" || t.Key == "" {
			return nil, fmt.Errorf("mqtt tls listener %d: cert and key are required", i+1)
		}
		cfg, err := gateway.LoadTLS(t.Cert, t.Key, t.ClientCA)
		if err != nil {
			return nil, fmt.Errorf("mqtt tls listener %d: %w", i+1, err)
		}
		lns = append(lns, gateway.Listener{Name: t.Name, Type: t.Type, Addr: t.Addr, Path: t.Path, TLS: cfg})
	}
	if len(lns) == 0 {
		return nil, errors.New("no mqtt listener: give --mqtt, --ws or a tls listener")
	}
	if mc.ReadBufferBytes != 0 || mc.WriteBufferBytes != 0 {
		log.Warn().Msg("mqtt.read_buffer_bytes and mqtt.write_buffer_bytes are ignored: the MQTT engine keeps no buffer for an idle connection")
	}
	authHook, authClosers, err := newAuth(o.file.Auth, log)
	if err != nil {
		return nil, err
	}
	o.closers = append(o.closers, authClosers...)
	hooks := engine.Hooks{Sessions: sessions, Uplink: br, Presence: br, Delivery: br}
	if authHook != nil {
		hooks.Auth, hooks.ACL, hooks.Limits = authHook, authHook, authHook
	}
	if o.kv != nil {
		// engine nats: MQTT publish/subscribe between devices on different
		// nodes, over NATS interest (gateway/cluster).
		rt, err := cluster.New(cluster.Options{Conn: o.kv.Conn(), Node: o.kvNode, Logger: log})
		if err != nil {
			return nil, fmt.Errorf("mqtt routing between nodes: %w", err)
		}
		hooks.Router = rt
		o.router = rt
	}
	recvMax := mc.ReceiveMaximum
	if bc.MaxInflight > 0 && (recvMax == 0 || uint16(min(bc.MaxInflight, 65535)) < recvMax) {
		recvMax = uint16(min(bc.MaxInflight, 65535)) // bridge.max_inflight bounds the same thing: publishes on their way to the core
	}
	gw, err := gateway.New(gateway.Options{
		Listeners:        lns,
		Hooks:            hooks,
		MaxPacketBytes:   mc.MaxPacketBytes,
		ConnectTimeout:   time.Duration(mc.ConnectTimeout),
		MaxKeepalive:     mc.MaxKeepalive,
		WriteTimeout:     time.Duration(mc.WriteTimeout),
		MaxPendingWrites: mc.MaxPendingWrites,
		ReceiveMaximum:   recvMax,
		MaxInflight:      mc.MaxInflight,
		MaxQueued:        bc.OfflineMaxMessages,
		MaxQueuedBytes:   bc.OfflineMaxBytes,
		MaxClients:       mc.MaxClients,
		Node:             cmp.Or(bo.Node, bc.Node),
		Store:            st,
		Logger:           log,
	})
	if err != nil {
		return nil, err
	}
	ok = true
	o.sessions = sessions
	return gw, nil
}

// holdUnknown is the configured hold for unknown clients (0s: off), else
// the mode's default.
func holdUnknown(configured *duration, def time.Duration) time.Duration {
	if configured == nil {
		return def
	}
	if *configured <= 0 {
		return -1
	}
	return time.Duration(*configured)
}

// runRemote runs only the gateway, in front of the core server at
// --core-remote: uplink produces there, downlink consumes there (each node
// its own broadcast offsets, the node being this process's client ID).
func (o *serveOptions) runRemote(cmd *cobra.Command, n *node, log *zerolog.Logger) error {
	node, _ := os.Hostname()
	if o.file.Bridge.Node != "" {
		node = o.file.Bridge.Node
	}
	node = fmt.Sprintf("%s-%d", node, os.Getpid())
	ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, client.Options{Addr: o.remote, Token: o.token, ClientID: node, Logger: log})
	if err != nil {
		return fmt.Errorf("core-remote %s: %w", o.remote, err)
	}
	n.remote = c
	// Every node sees every command: holding one for a client none of them
	// knows would give an "expired" receipt from each node but one.
	bo := bridge.Options{Core: bridge.Remote(c, log), Node: node, HoldUnknown: -1}
	if n.gateway, err = o.newGateway(bo, nil, log); err != nil {
		return err
	}
	n.sessions, n.summary = o.sessions, o.summary()
	httpAddr, err := n.startGateway(cmd.OutOrStdout(), o.httpAddr, log)
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "core  remote %s\nhttp  %s\ndata  %s (sessions)\n", o.remote, httpAddr, o.dataDir)
	log.Info().Str("core_remote", o.remote).Str("node", node).Str("http", httpAddr.String()).Msg("serving (gateway only)")
	return n.runUntilDone(cmd.Context(), log)
}

// startGateway serves HTTP (API and stats), starts the MQTT listeners and
// prints the version and every listener's address to out.
func (n *node) startGateway(out io.Writer, httpAddr string, log *zerolog.Logger) (net.Addr, error) {
	addr, err := n.startHTTP(httpAddr, log)
	if err != nil {
		return nil, err
	}
	if err := n.gateway.Start(); err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "ferrymq %s\n", buildVersion())
	for _, name := range n.gateway.Listeners() {
		fmt.Fprintf(out, "%-5s %s\n", name, n.gateway.Addr(name))
	}
	return addr, nil
}
