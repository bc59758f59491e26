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

	"github.com/ferrymq/ferrymq/gateway/mqtttopic"
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
	// SessionOwner reports the Username of the identity that owns the
	// stored session of clientID, for sessions that are no longer in
	// mochi's client list (parked on disk by the session layer); ok false
	// when there is none. It is asked at CONNECT only when mochi holds no
	// client of that ID, and must be safe for concurrent use. Nil means
	// such sessions have no owner.
	SessionOwner func(clientID string) (username string, ok bool)
	Logger       *zerolog.Logger
}

// Hook is auth as one mochi hook: authentication at CONNECT, the ACL on
// every publish, subscription and delivery (retained messages included),
// and quotas (per-IP admission before a byte is read, per-client rates,
// subscription and topic limits). Add it before the bridge so refused
// publishes never reach the core.
//
// The hook remembers only live connections (from authentication to
// OnDisconnect). Once authenticated, a client's
// Properties.Username is its Identity's Username, so that what mochi and
// the session layer keep of an offline session names its owner: a client
// ID whose session exists — online, offline in mochi's client list, or
// parked (HookOptions.SessionOwner) — may be taken only by the identity
// with that Username, whatever the new connection's clean-start flag.
type Hook struct {
	mqtt.HookBase
	o       HookOptions
	log     zerolog.Logger
	server  *mqtt.Server
	clients sync.Map // client ID → *session of its newest connection
}

// session is what the hook knows of one authenticated connection.
type session struct {
	owner   *mqtt.Client
	id      Identity
	lim     *ClientLimiter
	strikes int // MQTT 3 publish stalls in a row; owner's read goroutine only
	expiry  *time.Timer
}

// stop stops the credential-expiry timer, if any.
func (s *session) stop() {
	if s.expiry != nil {
		s.expiry.Stop()
	}
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
	return bytes.Contains([]byte{mqtt.OnConnectAuthenticate, mqtt.OnACLCheck, mqtt.OnPacketRead, mqtt.OnPublish,
		mqtt.OnSubscribe, mqtt.OnDisconnect, mqtt.OnWill}, []byte{b})
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
// "bad user name or password" (0x86; mochi sends 5 on MQTT 3). It also
// refuses a client ID or username unusable in the ACL's templates, and a
// client ID whose session belongs to another identity.
func (h *Hook) OnConnectAuthenticate(cl *mqtt.Client, pk packets.Packet) bool {
	req := &Request{ClientID: cl.ID, Username: string(pk.Connect.Username), Password: pk.Connect.Password, Remote: cl.Net.Remote, Now: time.Now()}
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
	// The identity's username is what %u becomes (for HMAC and mTLS it is
	// not the CONNECT's username).
	if h.o.ACL.UsesTemplates() && !h.o.ACL.TemplatesSafe(cl.ID, id.Username) {
		h.log.Info().Str("client", cl.ID).Str("remote", cl.Net.Remote).Msg("refused: client ID or username unusable in topic templates")
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
	if !h.claim(s) {
		s.stop()
		// The session of this client ID belongs to someone else: a
		// different identity may not take it over, nor start it afresh.
		h.log.Info().Str("client", cl.ID).Str("remote", cl.Net.Remote).Msg("refused: client ID held by another identity")
		return false
	}
	cl.Properties.Username = []byte(id.Username)
	return true
}

// claim makes s the session of its client ID, unless another identity
// owns the ID: the client mochi holds (online, or an offline persistent
// session), else the parked session (SessionOwner), or a connection the
// hook knows (connected, or authenticated and not yet in mochi's list).
// The last check and the swap are atomic, so of two identities racing
// for a free ID one loses.
func (h *Hook) claim(s *session) bool {
	cid := s.owner.ID
	if owner, ok := h.storedOwner(cid); ok && owner != s.id.Username {
		return false
	}
	for {
		v, loaded := h.clients.LoadOrStore(cid, s)
		if !loaded {
			return true
		}
		old := v.(*session)
		// A closed connection the hook still knows (its CONNACK failed, so
		// mochi told no hook) owns nothing: the stored owner was checked.
		if old.id.Username != s.id.Username && !old.owner.Closed() {
			return false
		}
		if h.clients.CompareAndSwap(cid, v, s) {
			old.stop()
			return true
		}
	}
}

// storedOwner returns the Username owning the session of clientID that
// mochi holds, or else the parked one.
func (h *Hook) storedOwner(clientID string) (string, bool) {
	if h.server != nil {
		if old, ok := h.server.Clients.Get(clientID); ok {
			return string(old.Properties.Username), true
		}
	}
	if h.o.SessionOwner != nil {
		return h.o.SessionOwner(clientID)
	}
	return "", false
}

// session returns what the hook knows of cl's connection: nil for a
// client object that is not a live connection (an offline persistent
// session, one restored from storage, or one already replaced).
func (h *Hook) session(cl *mqtt.Client) *session {
	if v, ok := h.clients.Load(cl.ID); ok && v.(*session).owner == cl {
		return v.(*session)
	}
	return nil
}

// OnACLCheck applies the ACL to a publish (write), a subscription filter,
// or a delivery to cl (including retained messages).
//
// A client's point-to-point messages (internal topic $ferrymq/p2p/<its ID>)
// pass: a backend addressed them to it. No client may publish into the
// internal namespace $ferrymq/ (OnPacketRead also moves publishes to $SYS
// there to have them refused). A client object that is not a live
// connection — an offline persistent session, or one restored from
// storage — is checked by its Properties.Username (its identity's
// Username), without the grants its credential carried.
func (h *Hook) OnACLCheck(cl *mqtt.Client, topic string, write bool) bool {
	if internal, shared := internalTopic(topic, write); internal {
		return !write && !shared && topic == mqtttopic.P2P+cl.ID
	}
	if write {
		// A delayed publish is a publish to its inner topic; a malformed one
		// is refused by the bridge with its own reason code.
		if inner, _, ok, err := mqtttopic.Delayed(topic); ok {
			if err != nil {
				return true
			}
			topic = inner
		}
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

// Readable reports whether a message on topic may be queued for the parked
// (offline) session of clientID, authenticated as username: the check
// OnACLCheck makes before each delivery, for a session that has no mochi
// client (session.Options.Readable). Like every offline check it goes by
// the username alone, without the credential's grants.
func (h *Hook) Readable(clientID, username, topic string) bool {
	if internal, _ := internalTopic(topic, false); internal {
		return topic == mqtttopic.P2P+clientID
	}
	return h.o.ACL.Check(clientID, username, topic, false)
}

// internalTopic reports whether a topic (write) or a subscription filter
// or delivery topic (!write) lies in the internal namespace, and whether it
// is a shared subscription ("$share/{group}/$ferrymq/…").
func internalTopic(topic string, write bool) (internal, shared bool) {
	if !write {
		if _, filter, ok := mqtttopic.Unshare(topic); ok {
			return strings.HasPrefix(filter, mqtttopic.Internal), true
		}
	}
	return strings.HasPrefix(topic, mqtttopic.Internal), false
}

// willRefused replaces the topic of a will the ACL does not let its client
// publish: nobody may subscribe under the internal namespace and no uplink
// rule bridges it, so the will goes nowhere.
const willRefused = mqtttopic.Internal + "refused/will"

// OnWill checks a will against the ACL when it is published, as a publish
// of its client [MQTT-3.1.2-8]: mochi does not, so without this a client
// could reach any topic through its will. A refused will is logged and
// sent nowhere (its topic moved to the internal namespace, retain
// cleared). The gateway calls this for wills restored after a restart too.
func (h *Hook) OnWill(cl *mqtt.Client, will mqtt.Will) (mqtt.Will, error) {
	if will.TopicName == willRefused || h.OnACLCheck(cl, will.TopicName, true) {
		return will, nil
	}
	h.log.Warn().Str("client", cl.ID).Msg("will refused by the ACL: not published")
	will.TopicName = willRefused
	will.Retain = false
	return will, nil
}

// sysRefused replaces the topic of a client's publish to $SYS, so that
// mochi refuses it like any publish the ACL denies.
const sysRefused = mqtttopic.Internal + "refused/sys"

// OnPacketRead runs before mochi validates a packet. For a client's
// PUBLISH it
//
//   - resolves an MQTT 5 topic alias (an empty topic name with an alias
//     set earlier), because mochi checks the ACL before it resolves
//     aliases and would otherwise check the empty name;
//   - turns a topic starting with "$SYS" (any case, as mochi tests it)
//     into one in the internal namespace, which OnACLCheck refuses. Mochi
//     silently drops publishes to $SYS, leaving an MQTT 5 QoS 1/2 client
//     waiting for its ack; refused by the ACL it gets PUBACK/PUBREC 0x87
//     (not authorized), an MQTT 3 client publishing at QoS 1/2 is
//     disconnected, and QoS 0 is dropped.
func (h *Hook) OnPacketRead(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if pk.FixedHeader.Type != packets.Publish || cl.Net.Inline {
		return pk, nil
	}
	if pk.TopicName == "" && pk.Properties.TopicAlias > 0 {
		// Set with an empty topic only reads (mochi makes the same call
		// later; an unknown alias stays empty and is refused).
		pk.TopicName = cl.State.TopicAliases.Inbound.Set(pk.Properties.TopicAlias, "")
	}
	if len(pk.TopicName) >= len(mqtt.SysPrefix) && strings.EqualFold(pk.TopicName[:len(mqtt.SysPrefix)], mqtt.SysPrefix) {
		h.log.Debug().Str("client", cl.ID).Msg("publish to $SYS refused")
		pk.TopicName = sysRefused
	}
	return pk, nil
}

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

// refuse answers a refused MQTT 5 QoS 1 publish with PUBACK code and a
// QoS 2 one with PUBREC code (mochi would answer QoS 2 with a PUBACK);
// an MQTT 3 client publishing at QoS 1/2 is disconnected, as for an ACL
// refusal. QoS 0 is dropped.
func (h *Hook) refuse(cl *mqtt.Client, pk packets.Packet, code packets.Code) error {
	switch {
	case pk.FixedHeader.Qos == 0:
	case cl.Properties.ProtocolVersion == 5:
		ack := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, PacketID: pk.PacketID,
			ReasonCode: code.Code, Properties: packets.Properties{ReasonString: code.Reason}}
		if pk.FixedHeader.Qos == 2 {
			ack.FixedHeader.Type = packets.Pubrec
		}
		if err := cl.WritePacket(ack); err != nil {
			// The connection is failing; the packet stays refused (any
			// error but ErrRejectPacket would let mochi publish it).
			h.log.Debug().Err(err).Str("client", cl.ID).Msg("refusal ack not written")
		}
	default:
		cl.Stop(code)
	}
	return packets.ErrRejectPacket
}

// OnSubscribe refuses filters past the subscription cap or the topic
// limits (they become invalid filters: SUBACK 0x8F / 0x80). A filter the
// client already holds replaces its subscription and takes no new place;
// the bridge's internal subscriptions ($ferrymq/…) take none either.
func (h *Hook) OnSubscribe(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	if h.o.Quotas == nil {
		return pk
	}
	capped := h.o.Quotas.cfg.MaxSubscriptions > 0
	var held map[string]packets.Subscription
	current := 0
	if capped {
		held = cl.State.Subscriptions.GetAll()
		for f := range held {
			if !strings.HasPrefix(f, mqtttopic.Internal) {
				current++
			}
		}
	}
	for i := range pk.Filters {
		f := pk.Filters[i].Filter
		if h.o.Quotas.CheckTopic(f) != nil {
			pk.Filters[i].Filter = refusedFilter
			continue
		}
		if !capped {
			continue
		}
		if _, ok := held[f]; ok {
			continue
		}
		if !h.o.Quotas.AllowSubscription(current) {
			pk.Filters[i].Filter = refusedFilter
			continue
		}
		held[f] = pk.Filters[i]
		current++
	}
	return pk
}

// refusedFilter is an invalid filter: mochi refuses it in the SUBACK.
const refusedFilter = "#/refused"

// OnDisconnect forgets the connection (and stops its expiry timer),
// unless a newer connection of the same client ID already replaced it.
// An offline persistent session keeps no state here: deliveries queued
// for it are checked by its Properties.Username, and a new connection is
// checked against that username, or against SessionOwner once the
// session is parked.
func (h *Hook) OnDisconnect(cl *mqtt.Client, _ error, _ bool) {
	if s := h.session(cl); s != nil && h.clients.CompareAndDelete(cl.ID, s) {
		s.stop()
	}
}
