package engine

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/ferrymq/ferrymq/gateway/mqtttopic"
)

// handleConnect handles the first packet: checks it against both specs,
// authenticates, takes over or resumes the session, and answers CONNACK.
func (c *conn) handleConnect(first byte, body []byte) error {
	if first&0x0F != 0 {
		return malformed("[MQTT-2.1.3-1]", "reserved flags of CONNECT set")
	}
	name, level, ok := protocolOf(body)
	if !ok {
		return malformed("[MQTT-3.1.2-1]", "CONNECT too short for a protocol name and level")
	}
	switch {
	case name != "MQTT" && name != "MQIsdp":
		// Another protocol: close without a CONNACK [MQTT-3.1.2-1].
		return violation("[MQTT-3.1.2-1]", "protocol name %q", name)
	case (name == "MQTT" && level != 4 && level != 5) || (name == "MQIsdp" && level != 3):
		// Answered in the 3.1.1 form every client understands, then closed
		// [MQTT-3.1.2-2].
		c.version = 4
		c.refuse(UnsupportedProtocol, "protocol level not supported")
		return nil
	}
	c.version = level
	var pk packets.Packet
	pk.ProtocolVersion = level
	if err := decodeHeader(&pk, first, len(body)); err != nil {
		return err
	}
	if level == 5 {
		if err := checkConnectProps(body, 2+len(name)+1); err != nil {
			code := MalformedPacket
			var pe *protocolError
			if errors.As(err, &pe) {
				code = pe.code
			}
			c.refuse(code, err.Error())
			return nil
		}
	}
	if err := pk.ConnectDecode(ownBody(body)); err != nil {
		if level == 5 {
			c.refuse(MalformedPacket, err.Error())
			return nil
		}
		return decodeError(packets.Connect, err)
	}
	if err := c.checkConnect(&pk); err != nil {
		var pe *protocolError
		if level == 5 && errors.As(err, &pe) && pe.code != MalformedPacket {
			c.refuse(pe.code, pe.msg)
			return nil
		}
		return err
	}
	return c.connect(&pk)
}

// protocolOf reads the protocol name and level at the start of a CONNECT.
func protocolOf(body []byte) (string, byte, bool) {
	if len(body) < 2 {
		return "", 0, false
	}
	n := int(body[0])<<8 | int(body[1])
	if len(body) < 2+n+1 {
		return "", 0, false
	}
	return string(body[2 : 2+n]), body[2+n], true
}

// checkConnectProps scans an MQTT 5 CONNECT's properties and its will's
// (p is the offset of the connect flags): repeated properties, and a
// Receive Maximum or Maximum Packet Size of 0, are protocol errors
// (§3.1.2.11.3, §3.1.2.11.4). What does not fit is left to the decoder.
func checkConnectProps(body []byte, p int) error {
	if p+3 > len(body) {
		return nil
	}
	flags := body[p]
	p += 3 // flags, keepalive
	s, err := scanProps(body[p:])
	if err != nil {
		return err
	}
	if s.seen[0x21] && s.zero[0x21] {
		return violation("§3.1.2.11.3", "receive maximum 0")
	}
	if s.seen[0x27] && s.zero[0x27] {
		return violation("§3.1.2.11.4", "maximum packet size 0")
	}
	p += s.size
	if flags&0x04 == 0 || p+2 > len(body) {
		return nil
	}
	p += 2 + (int(body[p])<<8 | int(body[p+1])) // the client ID
	if p >= len(body) {
		return nil
	}
	_, err = scanProps(body[p:])
	return err
}

// checkConnect checks what mochi's decoder leaves to us. The decoder
// itself refuses a CONNECT whose flags announce a field that is not there
// — the will's topic and payload (both specs' [MQTT-3.1.2-9]), the user
// name (3.1.1 [MQTT-3.1.2-19], MQTT 5 [MQTT-3.1.2-17]), the password
// (3.1.1 [MQTT-3.1.2-21], MQTT 5 [MQTT-3.1.2-19]) — or whose will topic
// or user name is not UTF-8 (3.1.1 [MQTT-3.1.3-10] [MQTT-3.1.3-11], MQTT 5
// [MQTT-3.1.3-11] [MQTT-3.1.3-12]). What is left fails [MQTT-3.1.4-1]:
// closed, with a CONNACK only where MQTT 5 gives a reason code.
func (c *conn) checkConnect(pk *packets.Packet) error {
	cp := &pk.Connect
	if pk.ReservedBit != 0 {
		return malformed("[MQTT-3.1.2-3]", "CONNECT reserved flag set")
	}
	if !cp.WillFlag && (cp.WillQos != 0 || cp.WillRetain) {
		// MQTT 5 [MQTT-3.1.2-11] [MQTT-3.1.2-13]; 3.1.1 [MQTT-3.1.2-11]
		// [MQTT-3.1.2-13] [MQTT-3.1.2-15].
		return malformed("[MQTT-3.1.2-11]", "will QoS or retain without a will")
	}
	if cp.WillQos > 2 {
		return malformed("[MQTT-3.1.2-12]", "will QoS 3") // 3.1.1: [MQTT-3.1.2-14]
	}
	if cp.UsernameFlag && (!utf8Valid(cp.Username) || bytes.IndexByte(cp.Username, 0) >= 0) {
		// mochi decodes the user name as bytes: 3.1.1 [MQTT-3.1.3-11],
		// MQTT 5 [MQTT-3.1.3-12].
		return malformed("[MQTT-3.1.3-12]", "user name is not UTF-8")
	}
	if pk.ProtocolVersion < 5 && cp.PasswordFlag && !cp.UsernameFlag {
		return malformed("[MQTT-3.1.2-22]", "password without a user name")
	}
	if cp.WillFlag {
		if err := validTopicName(cp.WillTopic); err != nil {
			return &protocolError{code: TopicNameInvalid, spec: "[MQTT-3.1.3-11]", msg: "will topic: " + err.Error()}
		}
		if pk.ProtocolVersion == 5 {
			wp := &cp.WillProperties
			if wp.PayloadFormatFlag && wp.PayloadFormat > 1 {
				return violation("§3.1.3.2.3", "will payload format %d", wp.PayloadFormat)
			}
			if wp.PayloadFormat == 1 && !utf8Valid(cp.WillPayload) {
				return &protocolError{code: PayloadFormatInvalid, spec: "§3.1.3.2.3", msg: "will payload is not UTF-8"}
			}
			if wp.ResponseTopic != "" && validTopicName(wp.ResponseTopic) != nil {
				return violation("§3.1.3.2.8", "will response topic %q is not a topic name", wp.ResponseTopic)
			}
		}
	}
	if pk.ProtocolVersion == 5 {
		p := &pk.Properties
		if p.AuthenticationMethod != "" {
			// Enhanced authentication is not offered [MQTT-4.12.0-1].
			return &protocolError{code: BadAuthenticationMethod, msg: "authentication method " + p.AuthenticationMethod + " not supported"}
		}
		if len(p.AuthenticationData) > 0 {
			return violation("§3.1.2.11.10", "authentication data without a method")
		}
		if p.RequestProblemInfoFlag && p.RequestProblemInfo > 1 {
			return violation("§3.1.2.11.7", "request problem information %d", p.RequestProblemInfo)
		}
		if p.RequestResponseInfo > 1 {
			return violation("§3.1.2.11.6", "request response information %d", p.RequestResponseInfo)
		}
	}
	return nil
}

// connect authenticates and establishes the session.
func (c *conn) connect(pk *packets.Packet) error {
	e := c.e
	cp := &pk.Connect
	v5 := pk.ProtocolVersion == 5
	// What is kept of the CONNECT is copied out of its body (mochi's strings
	// alias it), so the body — password included — is not kept alive.
	id := strings.Clone(cp.ClientIdentifier)
	assigned := false
	if id == "" {
		switch {
		case pk.ProtocolVersion == 3 || (pk.ProtocolVersion == 4 && !cp.Clean):
			c.refuse(ClientIDNotValid, "an empty client ID needs a clean session") // [MQTT-3.1.3-8]
			return nil
		default:
			id, assigned = e.assignID(), true // [MQTT-3.1.3-6] [MQTT-3.2.2-16]
		}
	}
	if e.opts.MaxClients > 0 && int(e.m.connected.Load()) >= e.opts.MaxClients {
		c.refuse(ServerBusy, "too many clients")
		return nil
	}
	expiry := uint32(0)
	maxExpiry := uint32(e.opts.MaxSessionExpiry / time.Second)
	switch {
	case v5:
		expiry = min(pk.Properties.SessionExpiryInterval, maxExpiry)
	case !cp.Clean:
		expiry = maxExpiry // an MQTT 3 persistent session lives as long as we let it
	}
	info := &ConnectInfo{
		ClientID: id, Assigned: assigned, Username: string(cp.Username), Password: cp.Password,
		Protocol: pk.ProtocolVersion, Clean: cp.Clean, Keepalive: cp.Keepalive, SessionExpiry: expiry,
		Listener: c.ln.name, Remote: c.cl.remote, TLS: c.t.tlsState(),
	}
	if v5 {
		for _, u := range pk.Properties.User {
			info.User = append(info.User, UserProperty{Key: u.Key, Value: u.Val})
		}
	}
	var will *willSpec
	if cp.WillFlag {
		will = &willSpec{m: &Message{Topic: strings.Clone(cp.WillTopic), Payload: append([]byte(nil), cp.WillPayload...),
			QoS: cp.WillQos, Retain: cp.WillRetain, Origin: id, Will: true}}
		if v5 {
			wp := &cp.WillProperties
			will.m.Props = clonedProps(propsOf(wp))
			will.expiry = min(wp.MessageExpiryInterval, uint32(e.opts.MaxMessageExpiry/time.Second))
			will.delay = wp.WillDelayInterval
		}
		info.Will = will.m
	}

	ident := Identity{Username: info.Username}
	if e.opts.Hooks.Auth != nil {
		ctx, cancel := context.WithTimeout(e.ctx, e.opts.ConnectTimeout)
		var err error
		ident, err = e.opts.Hooks.Auth.Authenticate(ctx, info)
		cancel()
		if err != nil {
			code, why := BadUsernameOrPassword, err.Error()
			var r *Refusal
			if errors.As(err, &r) {
				code, why = r.Code, r.Reason
			}
			e.m.authFailures.Add(1)
			e.log.Info().Err(err).Str(logClient, id).Str(logRemote, c.cl.remote).Msg("connect refused")
			c.refuse(code, why)
			return nil
		}
	}
	if c.state == stClosed {
		return nil // killed while authenticating (shutdown)
	}
	c.cl = Client{
		id: id, username: ident.Username, listener: c.ln.name, remote: c.cl.remote, protocol: pk.ProtocolVersion,
		clean: cp.Clean, keepalive: cp.Keepalive, since: time.Now().UnixNano(), authState: ident.State,
		tls: info.TLS, cn: c,
	}
	cl := &c.cl

	// Keepalive (3.1.1 [MQTT-3.1.2-24], MQTT 5 [MQTT-3.1.2-22]): MQTT 5 clients asking for more than the
	// cap, or for none, are told the cap (Server Keep Alive
	// [MQTT-3.2.2-21]); MQTT 3 clients are held to it.
	ka := cp.Keepalive
	serverKA := false
	if ka == 0 || ka > e.opts.MaxKeepalive {
		ka = e.opts.MaxKeepalive
		serverKA = v5
	}
	cl.keepalive = ka
	if v5 {
		p := &pk.Properties
		c.maxOut = p.MaximumPacketSize
		c.recvMax = p.ReceiveMaximum
		if n := min(p.TopicAliasMaximum, e.opts.TopicAliasMaximum); n > 0 {
			c.outAlias = &outAliases{max: n}
		}
		c.noProblem = p.RequestProblemInfoFlag && p.RequestProblemInfo == 0
	}

	cs, shared := e.opts.Hooks.Sessions.(SessionClaimer)
	if shared {
		ctx, cancel := context.WithTimeout(e.ctx, e.opts.ConnectTimeout)
		stored, err := cs.Claim(ctx, id, cp.Clean)
		cancel()
		switch {
		case err != nil:
			// Served from what this node has; the store says what it keeps.
			e.log.Warn().Err(err).Str(logClient, id).Msg("claim session")
		case stored != nil:
			e.adopt(stored)
		}
	}
	if !ident.Expires.IsZero() {
		c.expiresAt.Store(ident.Expires.UnixNano())
	}
	c.holdWrites() // until the CONNACK is queued, below
	s, present, replaced, refused := e.establish(c, cl, cp.Clean, expiry, will, e.opts.Hooks.Auth != nil)
	if refused {
		c.releaseWrites(nil) // nothing was queued: the session is not c's
		e.log.Info().Str(logClient, id).Str(logRemote, c.cl.remote).Msg("connect refused: the client ID's session belongs to another identity")
		c.refuse(BadUsernameOrPassword, "client ID held by another identity")
		return nil
	}
	c.client, c.sess = cl, s
	c.state = stConnected
	c.established.Store(true)
	e.m.connects.Add(1)
	e.m.connected.Add(1)
	if p := e.opts.Hooks.Presence; p != nil {
		p.Connected(cl, present, replaced)
	}

	if shared && expiry > 0 {
		// Outside the engine's locks; what reaches the session meanwhile
		// waits behind the CONNACK (holdWrites).
		ctx, cancel := context.WithTimeout(e.ctx, e.opts.ConnectTimeout)
		err := cs.Flush(ctx, id)
		cancel()
		if err != nil {
			// Served from what this node has; the store says what it keeps.
			e.log.Warn().Err(err).Str(logClient, id).Msg("session not stored before its CONNACK")
		}
	}
	ack := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connack}, SessionPresent: present}
	if v5 {
		ap := &ack.Properties
		ap.ReceiveMaximum = e.opts.ReceiveMaximum
		ap.MaximumPacketSize = uint32(e.opts.MaxPacketBytes)
		ap.TopicAliasMaximum = e.opts.TopicAliasMaximum
		if assigned {
			ap.AssignedClientID = id
		}
		if serverKA {
			ap.ServerKeepAlive, ap.ServerKeepAliveFlag = ka, true
		}
		if pk.Properties.SessionExpiryInterval > expiry {
			ap.SessionExpiryInterval, ap.SessionExpiryIntervalFlag = expiry, true
		}
	}
	b, _ := c.encodePacket(&ack) // a CONNACK within any Maximum Packet Size
	c.releaseWrites(b)           // before what the session got meanwhile
	c.kaNanos.Store(int64(ka) * int64(time.Second) * 3 / 2)
	c.watch()
	cl.tls = nil // kept for authentication only

	// What the session had on its way goes out after the CONNACK.
	s.mu.Lock()
	var err error
	if s.conn == c {
		err = e.resumeLocked(s)
	}
	s.mu.Unlock()
	if err != nil {
		// Served later: the client connects again; its messages stay.
		e.log.Error().Err(err).Str(logClient, id).Msg("session not resumed")
		c.end(ServerBusy, reasonStore, err)
	}
	return nil
}

// refuse answers CONNACK with code (the MQTT 3 return code it maps to on
// MQTT 3), Session Present 0, and ends the connection: 3.1.1
// [MQTT-3.2.2-4] [MQTT-3.2.2-5] (a rejected client ID is return code 2
// [MQTT-3.1.3-9]); MQTT 5 [MQTT-3.2.2-6] [MQTT-3.2.2-7]. Nothing the
// client sent after the CONNECT is processed [MQTT-3.1.4-6]: the
// connection lingers, reading and discarding.
func (c *conn) refuse(code ReasonCode, why string) {
	ack := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connack}}
	if c.version == 5 {
		ack.ReasonCode = byte(code)
		if !c.noProblem {
			ack.Properties.ReasonString = why
		}
	} else {
		ack.ReasonCode = v3Connack(code)
	}
	c.queuePacket(&ack)
	c.e.m.refused.Add(1)
	c.end(0, reasonRefused, &Refusal{Code: code, Reason: why})
}

// establish attaches c to the session of cl's client ID: a clean start
// ends what was there, otherwise it is resumed (present). A connection
// already on the session is taken over: it gets DISCONNECT 0x8E (MQTT 5),
// sends no will, and its presence ends with takenOver [MQTT-3.1.4-3].
// With authentication on, a session owned by another username is not
// given away (refused).
func (e *Engine) establish(c *conn, cl *Client, clean bool, expiry uint32, will *willSpec, owned bool) (s *session, present bool, replaced *Client, refused bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s = e.sessions[cl.id]
	tookOver := false
	if s != nil {
		s.mu.Lock()
		if owned && s.username != cl.username {
			s.mu.Unlock()
			return nil, false, nil, true
		}
		if old := s.conn; old != nil {
			replaced = &old.cl // filled before old's establish, under this lock
			old.takenOver.Store(true)
			tookOver = true
			s.conn = nil
			s.online.Store(false)
			old.kill(SessionTakenOver, reasonTakenOver, nil)
			e.m.takeovers.Add(1)
		}
		// A will waiting for its delay is not sent once the client is back
		// [MQTT-3.1.3-9].
		s.will, s.willAt = nil, 0
		if clean {
			e.endLocked(s, "a clean start discarded the session")
			s.mu.Unlock()
			delete(e.sessions, cl.id)
			s = nil
		} else {
			present = true
		}
	}
	if s == nil {
		s = &session{id: cl.id, e: e}
		s.mu.Lock()
		e.sessions[cl.id] = s
	}
	s.generation++
	s.conn = c
	s.resuming = true
	s.online.Store(true)
	if !tookOver {
		e.routeOnlineLocked(s, true)
	}
	s.offline = 0
	s.username = cl.username
	s.protocol = cl.protocol
	stored := s.persistent()
	s.expiry = expiry
	s.will = will
	switch {
	case s.persistent():
		s.unstore = false
		e.storeClient(s)
		if !stored {
			e.adoptLocked(s)
		}
	case stored:
		// Resumed without an expiry: it ends with this connection
		// [MQTT-3.1.2-23], and nothing of it may stay stored — but its
		// queued messages are read back first (resumeLocked): deleting
		// them now would drop what the session kept for the client.
		s.unstore = true
	}
	s.mu.Unlock()
	return s, present, replaced, false
}

var idSeq atomic.Uint64

// assignID makes up a client ID for a client that sent none.
func (e *Engine) assignID() string {
	n := idSeq.Add(1)
	return "ferrymq-" + e.idPrefix + "-" + itoa(n)
}

func itoa(n uint64) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(b[i:])
		}
	}
}

// validTopicName checks a topic name a client publishes to: not empty
// (3.1.1 [MQTT-4.7.3-1]), no
// wildcards [MQTT-3.3.2-2], no NUL. mochi's decoder refuses every string
// that is not well-formed UTF-8 or holds U+0000 as malformed: 3.1.1
// [MQTT-1.5.3-1] [MQTT-1.5.3-2], MQTT 5 [MQTT-1.5.4-1] [MQTT-1.5.4-2].
func validTopicName(t string) error {
	switch {
	case t == "":
		return errors.New("empty")
	case strings.ContainsAny(t, "+#"):
		return errors.New("wildcards in a topic name")
	case strings.IndexByte(t, 0) >= 0:
		return errors.New("NUL in a topic name")
	}
	return nil
}

// internalTopic reports whether a client may not publish to t: the
// engine's $SYS (any case) and the gateway's own namespace.
func internalTopic(t string) bool {
	return (len(t) >= 4 && strings.EqualFold(t[:4], "$SYS")) || strings.HasPrefix(t, mqtttopic.Internal)
}

func propsOf(p *packets.Properties) *Props {
	if !p.PayloadFormatFlag && p.ContentType == "" && p.ResponseTopic == "" && len(p.CorrelationData) == 0 && len(p.User) == 0 {
		return nil
	}
	out := &Props{PayloadFormat: p.PayloadFormat, PayloadFormatSet: p.PayloadFormatFlag, ContentType: p.ContentType,
		ResponseTopic: p.ResponseTopic, CorrelationData: p.CorrelationData}
	if len(p.User) > 0 {
		out.User = make([]UserProperty, len(p.User))
		for i, u := range p.User {
			out.User[i] = UserProperty{Key: u.Key, Value: u.Val}
		}
	}
	return out
}

// clonedProps copies p's strings and bytes out of the packet they alias.
func clonedProps(p *Props) *Props {
	if p == nil {
		return nil
	}
	q := *p
	q.ContentType, q.ResponseTopic = strings.Clone(p.ContentType), strings.Clone(p.ResponseTopic)
	q.CorrelationData = append([]byte(nil), p.CorrelationData...)
	if p.User != nil {
		q.User = make([]UserProperty, len(p.User))
		for i, u := range p.User {
			q.User[i] = UserProperty{Key: strings.Clone(u.Key), Value: strings.Clone(u.Value)}
		}
	}
	return &q
}
