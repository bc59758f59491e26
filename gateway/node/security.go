package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/ferrymq/ferrymq/gateway"
)

// ErrAnonymousBeyondLoopback is returned by New when an MQTT listener
// reachable beyond loopback would let every client in without credentials
// because no auth is configured (docs/security.md, "Secure by default").
// Configure auth, bind the listener to loopback, or say so with
// AuthOptions{Anonymous: true}.
var ErrAnonymousBeyondLoopback = errors.New("mqtt listener beyond loopback without auth")

// mqttListener is what the secure default needs to know of a listener
// before it is bound.
type mqttListener struct {
	kind string // "tcp", "ws", "tls", "wss": the listener's default name
	addr string
	// clientCerts: TLS admits only clients with a certificate its CA
	// signed, so none of them is anonymous.
	clientCerts bool
}

// mqttListeners lists the MQTT listeners in the order the gateway gets
// them (newGateway): Gateway.Listeners, MQTTAddr, WSAddr, TLS.
func (o *Options) mqttListeners() []mqttListener {
	var ls []mqttListener
	for _, l := range o.Gateway.Listeners {
		kind := l.Type
		if l.TLS != nil {
			kind = map[string]string{"": "tls", "tcp": "tls", "ws": "wss"}[l.Type]
		}
		ls = append(ls, mqttListener{kind: kind, addr: l.Addr, clientCerts: l.TLS != nil && l.TLS.ClientAuth == tls.RequireAndVerifyClientCert})
	}
	if o.MQTTAddr != "" {
		ls = append(ls, mqttListener{kind: "tcp", addr: o.MQTTAddr})
	}
	if o.WSAddr != "" {
		ls = append(ls, mqttListener{kind: "ws", addr: o.WSAddr})
	}
	for _, t := range o.TLS {
		ls = append(ls, mqttListener{kind: map[string]string{"": "tls", "tcp": "tls", "ws": "wss"}[t.Type], addr: t.Addr, clientCerts: t.ClientCA != ""})
	}
	return ls
}

// authOff reports whether nothing authenticates MQTT clients: no Auth and
// no auth hook of the caller's.
func (o *Options) authOff() bool { return o.Auth == nil && o.Gateway.Hooks.Auth == nil }

// checkAnonymous refuses, as Mosquitto 2 does, an MQTT listener that
// clients beyond this machine could reach and that lets them in with no
// credentials because no auth is configured. An explicit
// AuthOptions.Anonymous is allowed (and said loudly); a listener that
// requires client certificates is not anonymous.
func (o *Options) checkAnonymous() error {
	if !o.authOff() {
		return nil
	}
	var errs []error
	for _, l := range o.mqttListeners() {
		if !l.clientCerts && beyondLoopback(l.addr) {
			errs = append(errs, fmt.Errorf("%w: the %s listener on %q would let every client in anonymously: configure auth (docs/security.md), bind it to 127.0.0.1, or allow it with auth: {anonymous: true}",
				ErrAnonymousBeyondLoopback, l.kind, l.addr))
		}
	}
	return errors.Join(errs...)
}

// lookupTimeout bounds the resolution of a listener's host name.
const lookupTimeout = 5 * time.Second

// beyondLoopback reports whether a listener on addr (host:port) may be
// reached from another machine: an empty or unspecified host, an address
// that is not loopback, or a name that resolves to one (or does not
// resolve) is.
func beyondLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return true
	}
	if ip := net.ParseIP(strings.SplitN(host, "%", 2)[0]); ip != nil {
		return !ip.IsLoopback()
	}
	ctx, cancel := context.WithTimeout(context.Background(), lookupTimeout)
	defer cancel()
	ips, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil || len(ips) == 0 {
		return true
	}
	for _, ip := range ips {
		if !ip.IP.IsLoopback() {
			return true
		}
	}
	return false
}

// AnonymousListener is an MQTT listener that lets clients with no
// credentials in (AuthOptions.Anonymous) and is bound beyond loopback.
type AnonymousListener struct {
	Name string `json:"name"`
	Addr string `json:"addr"`
}

// String is "name addr", as the dashboard shows it.
func (a AnonymousListener) String() string { return a.Name + " " + a.Addr }

// anonymousListeners finds, once the gateway has bound them, the listeners
// anonymous clients may reach from beyond loopback.
func (n *Node) anonymousListeners(g *gateway.Gateway) []AnonymousListener {
	o := &n.opts
	if o.Auth == nil || !o.Auth.Anonymous {
		return nil // without auth such listeners were refused (checkAnonymous)
	}
	var open []AnonymousListener
	names := g.Listeners()
	for i, l := range o.mqttListeners() {
		if l.clientCerts || i >= len(names) {
			continue
		}
		a := g.Addr(names[i])
		if a == nil || !beyondLoopback(a.String()) {
			continue
		}
		open = append(open, AnonymousListener{Name: names[i], Addr: a.String()})
	}
	return open
}

// AnonymousListeners returns the MQTT listeners bound beyond loopback on
// which clients with no credentials may connect (only with
// AuthOptions.Anonymous: without auth such a listener is refused). The
// /stats "security" section, the dashboard's banner and the
// anonymous_access alarm show them.
func (n *Node) AnonymousListeners() []AnonymousListener {
	return append([]AnonymousListener(nil), n.anonymous...)
}

// withSecurity adds the "security" section to /stats: the listeners
// anonymous clients may reach beyond loopback, as "name addr" (the
// dashboard's banner).
func withSecurity(extra func(context.Context) map[string]any, open []AnonymousListener) func(context.Context) map[string]any {
	list := make([]string, len(open))
	for i, a := range open {
		list[i] = a.String()
	}
	return func(ctx context.Context) map[string]any {
		out := map[string]any{}
		if extra != nil {
			out = extra(ctx)
		}
		out["security"] = map[string]any{"anonymous_listeners": list}
		return out
	}
}
