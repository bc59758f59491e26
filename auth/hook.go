package auth

import (
	"bytes"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"sync"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/rs/zerolog"
)

// HookOptions configure the gateway hook. Every part is optional: a nil
// Chain allows anonymous devices only, a nil ACL allows every topic, nil
// Quotas limit nothing.
type HookOptions struct {
	Chain  *Chain
	ACL    *ACL
	Quotas *Quotas
	// Slowdown is how long an MQTT 3 client over its publish rate is
	// stalled before its packet is dropped; a client still over the rate
	// after Strikes stalls is disconnected. Defaults 1 s and 3.
	Slowdown time.Duration
	Strikes  int
	Logger   *zerolog.Logger
}

// Hook is auth as one mochi hook: authentication at CONNECT, the ACL on
// every publish, subscription and delivery (retained messages included),
// and quotas (per-IP admission before a byte is read, per-client rates,
// subscription and topic limits). Add it before the bridge so refused
// publishes never reach the core.
type Hook struct {
	mqtt.HookBase
	o       HookOptions
	log     zerolog.Logger
	server  *mqtt.Server
	clients sync.Map // client ID → *session (a new connection replaces it)
}

type session struct {
	owner   *mqtt.Client
	id      Identity
	lim     *ClientLimiter
	strikes int
	expiry  *time.Timer
}

// NewHook builds the hook.
func NewHook(o HookOptions) *Hook {
	if o.Slowdown <= 0 {
		o.Slowdown = time.Second
	}
	if o.Strikes <= 0 {
		o.Strikes = 3
	}
	h := &Hook{o: o, log: zerolog.Nop()}
	if o.Logger != nil {
		h.log = o.Logger.With().Str("component", "auth").Logger()
	}
	return h
}

// Attach gives the hook the server (to disconnect clients whose
// credential expires).
func (h *Hook) Attach(s *mqtt.Server) { h.server = s }

// ID implements mqtt.Hook.
func (h *Hook) ID() string { return "ferrymq-auth" }

// Provides implements mqtt.Hook.
func (h *Hook) Provides(b byte) bool {
	return bytes.Contains([]byte{mqtt.OnConnectAuthenticate, mqtt.OnACLCheck, mqtt.OnPublish, mqtt.OnSubscribe,
		mqtt.OnDisconnect, mqtt.OnClientExpired}, []byte{b})
}

// AdmitConnection implements the gateway's Admitter: connection caps,
// connect rate and bans per IP, before a byte is read.
func (h *Hook) AdmitConnection(remote net.Addr) (func(), error) {
	if h.o.Quotas == nil {
		return func() {}, nil
	}
	ip := remote.String()
	if host, _, err := net.SplitHostPort(ip); err == nil {
		ip = host
	}
	return h.o.Quotas.AdmitConnection(ip)
}

// OnConnectAuthenticate authenticates the CONNECT; false answers CONNACK
// "bad user name or password" (0x86; 4 on MQTT 3).
func (h *Hook) OnConnectAuthenticate(cl *mqtt.Client, pk packets.Packet) bool {
	username := string(pk.Connect.Username)
	if h.o.ACL.UsesTemplates() && !h.o.ACL.TemplatesSafe(cl.ID, username) {
		h.log.Info().Str("client", cl.ID).Msg("refused: client ID or username unusable in topic templates")
		return false
	}
	req := &Request{ClientID: cl.ID, Username: username, Password: pk.Connect.Password, Remote: cl.Net.Remote, Now: time.Now()}
	if c, ok := cl.Net.Conn.(interface {
		ConnectionState() (tls.ConnectionState, bool)
	}); ok {
		if st, ok := c.ConnectionState(); ok {
			req.TLS = &st
		}
	}
	chain := h.o.Chain
	if chain == nil {
		chain = &Chain{AllowAnonymous: true}
	}
	id, err := chain.Authenticate(req)
	if err != nil {
		h.log.Info().Err(err).Str("client", cl.ID).Str("remote", cl.Net.Remote).Msg("authentication refused")
		return false
	}
	if old := h.session(cl); old != nil && old.id.Username != id.Username {
		// The session of this client ID belongs to someone else: a
		// different identity may not take it over.
		h.log.Info().Str("client", cl.ID).Str("remote", cl.Net.Remote).Msg("refused: client ID held by another identity")
		return false
	}
	s := &session{owner: cl, id: id}
	if h.o.Quotas != nil {
		s.lim = h.o.Quotas.NewClientLimiter()
	}
	if !id.Expires.IsZero() && h.server != nil {
		s.expiry = time.AfterFunc(time.Until(id.Expires), func() {
			h.log.Info().Str("client", cl.ID).Msg("credential expired; disconnecting")
			_ = h.server.DisconnectClient(cl, packets.ErrMaxConnectTime)
		})
	}
	if old, ok := h.clients.Swap(cl.ID, s); ok {
		if o := old.(*session); o.expiry != nil {
			o.expiry.Stop()
		}
	}
	return true
}

// session returns the identity of cl's client ID (also for a persistent
// session's offline client object, which keeps its ID).
func (h *Hook) session(cl *mqtt.Client) *session {
	if v, ok := h.clients.Load(cl.ID); ok {
		return v.(*session)
	}
	return nil
}

// OnACLCheck applies the ACL to a publish (write), a subscription filter,
// or a delivery to cl (including retained messages).
//
// A client's point-to-point messages (internal topic $ferrymq/p2p/<its ID>)
// pass: a backend addressed them to it. A session restored from storage
// (offline since the restart) is checked by its stored username, without
// the grants its credential carried.
func (h *Hook) OnACLCheck(cl *mqtt.Client, topic string, write bool) bool {
	if !write && strings.HasPrefix(topic, p2pTopicPrefix) {
		return topic == p2pTopicPrefix+cl.ID
	}
	username, extra := string(cl.Properties.Username), []string(nil)
	if s := h.session(cl); s != nil {
		username, extra = s.id.Username, s.id.Subscribe
		if write {
			extra = s.id.Publish
		}
	}
	return h.o.ACL.Check(cl.ID, username, topic, write, extra)
}

// p2pTopicPrefix is the bridge's internal point-to-point namespace.
const p2pTopicPrefix = "$ferrymq/p2p/"

// OnPublish enforces the topic limits and the client's publish rate. MQTT
// 5: PUBACK/PUBREC 0x96 (message rate too high) or 0x90; QoS 0 dropped.
// MQTT 3 has no way to say it: the client is stalled, its packet dropped,
// and after Strikes stalls it is disconnected.
func (h *Hook) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if cl.Net.Inline {
		return pk, nil
	}
	s := h.session(cl)
	if s == nil || h.o.Quotas == nil {
		return pk, nil // authenticated (mochi checked): no limiter without quotas
	}
	if err := h.o.Quotas.CheckTopic(pk.TopicName); err != nil {
		return pk, h.refuse(cl, pk, packets.ErrTopicNameInvalid)
	}
	ok, wait := s.lim.AllowPublish(len(pk.Payload))
	if ok {
		s.strikes = 0
		return pk, nil
	}
	if cl.Properties.ProtocolVersion < 5 {
		s.strikes++
		if s.strikes > h.o.Strikes {
			h.log.Info().Str("client", cl.ID).Msg("publish rate exceeded; disconnecting")
			cl.Stop(errors.New("auth: publish rate exceeded"))
			return pk, packets.ErrRejectPacket
		}
		time.Sleep(min(wait, h.o.Slowdown)) // TCP backpressure on this client only
		return pk, packets.ErrRejectPacket
	}
	return pk, h.refuse(cl, pk, packets.ErrMessageRateTooHigh)
}

// refuse answers a refused MQTT 5 QoS 1/2 publish with code (mochi writes
// the ack); anything else is dropped.
func (h *Hook) refuse(cl *mqtt.Client, pk packets.Packet, code packets.Code) error {
	if cl.Properties.ProtocolVersion == 5 && pk.FixedHeader.Qos > 0 {
		return code
	}
	if cl.Properties.ProtocolVersion < 5 && pk.FixedHeader.Qos > 0 {
		cl.Stop(code) // MQTT 3: disconnect without an ack, as for an ACL refusal
	}
	return packets.ErrRejectPacket
}

// OnSubscribe refuses filters past the subscription cap or the topic
// limits (they become invalid filters: SUBACK 0x8F / 0x80).
func (h *Hook) OnSubscribe(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	if h.o.Quotas == nil {
		return pk
	}
	current := cl.State.Subscriptions.Len()
	for i := range pk.Filters {
		if h.o.Quotas.CheckTopic(pk.Filters[i].Filter) != nil || !h.o.Quotas.AllowSubscription(current) {
			pk.Filters[i].Filter = "#/refused"
			continue
		}
		current++
	}
	return pk
}

// OnDisconnect forgets the identity of a session that ends with its
// connection; a persistent session keeps it (messages queued for it are
// checked against it) until it expires.
func (h *Hook) OnDisconnect(cl *mqtt.Client, _ error, expire bool) {
	if expire {
		h.forget(cl)
		return
	}
	if s := h.session(cl); s != nil && s.owner == cl && s.expiry != nil {
		s.expiry.Stop()
	}
}

// OnClientExpired forgets an expired persistent session's identity.
func (h *Hook) OnClientExpired(cl *mqtt.Client) { h.forget(cl) }

// forget drops cl's identity unless a newer connection of the same ID
// already replaced it.
func (h *Hook) forget(cl *mqtt.Client) {
	v, ok := h.clients.Load(cl.ID)
	if !ok || v.(*session).owner != cl {
		return
	}
	if h.clients.CompareAndDelete(cl.ID, v) {
		if s := v.(*session); s.expiry != nil {
			s.expiry.Stop()
		}
	}
}
