package auth

import (
	"context"
	"net"
	"strings"
	"time"

	"github.com/ferrymq/ferrymq/gateway/engine"
	"github.com/ferrymq/ferrymq/gateway/mqtttopic"
)

// The hook as the gateway engine's Authenticator, Authorizer and Limiter:
// authentication at CONNECT, the ACL on every publish, subscription and
// delivery (retained messages and offline sessions' queues included), and
// quotas (per-IP admission before a byte is read, per-client publish
// rates, subscription and topic limits).
//
// Per connection the hook keeps one clientState, handed to the engine as
// Identity.State and read back with Client.AuthState: no map of its own.
// Session ownership by identity (a client ID whose session exists may be
// taken only by the identity that owns it) is the engine's: it compares
// the usernames when authentication is on.

// clientState is what the hook knows of one authenticated connection.
type clientState struct {
	id      Identity
	lim     *ClientLimiter
	strikes int // MQTT 3 publish stalls in a row; the connection's turn only
}

var (
	_ engine.Authenticator = (*Hook)(nil)
	_ engine.Authorizer    = (*Hook)(nil)
	_ engine.Limiter       = (*Hook)(nil)
)

// Authenticate implements engine.Authenticator. A refusal answers CONNACK
// "bad user name or password" (0x86; 4 on MQTT 3). It also refuses a
// client ID or username unusable in the ACL's templates.
func (h *Hook) Authenticate(_ context.Context, ci *engine.ConnectInfo) (engine.Identity, error) {
	req := &Request{ClientID: ci.ClientID, Username: ci.Username, Password: ci.Password, Remote: ci.Remote, Now: time.Now(), TLS: ci.TLS}
	chain := h.o.Chain
	if chain == nil {
		chain = &Chain{AllowAnonymous: true}
	}
	id, err := chain.Authenticate(req)
	if err != nil {
		return engine.Identity{}, &engine.Refusal{Code: engine.BadUsernameOrPassword, Reason: err.Error()}
	}
	// The identity's username is what %u becomes (for HMAC and mTLS it is
	// not the CONNECT's username).
	if h.o.ACL.UsesTemplates() && !h.o.ACL.TemplatesSafe(ci.ClientID, id.Username) {
		return engine.Identity{}, &engine.Refusal{Code: engine.ClientIDNotValid,
			Reason: "client ID or username unusable in topic templates"}
	}
	st := &clientState{id: id}
	if h.o.Quotas != nil {
		st.lim = h.o.Quotas.NewClientLimiter()
	}
	return engine.Identity{Username: id.Username, State: st, Expires: id.Expires}, nil
}

func stateOf(c *engine.Client) *clientState {
	if c == nil {
		return nil
	}
	st, _ := c.AuthState().(*clientState)
	return st
}

// CanPublish implements engine.Authorizer. A delayed publish
// ("$delayed/{seconds}/{topic}") is a publish to its inner topic; a
// malformed one is left to the bridge, which refuses it with its own
// reason code. Nothing may be published into the internal namespace (the
// engine refuses $SYS and $ferrymq/ before it asks).
func (h *Hook) CanPublish(c *engine.Client, topic string) bool {
	if inner, _, ok, err := mqtttopic.Delayed(topic); ok {
		if err != nil {
			return true
		}
		topic = inner
	}
	if strings.HasPrefix(topic, mqtttopic.Internal) {
		return false
	}
	var extra []string
	if st := stateOf(c); st != nil {
		extra = st.id.Publish
	}
	return h.o.ACL.Check(c.ID(), c.Username(), topic, true, extra)
}

// CanSubscribe implements engine.Authorizer; filter may be a
// "$share/{group}/{filter}" subscription (the ACL decides its filter).
func (h *Hook) CanSubscribe(c *engine.Client, filter string) bool {
	if internal, _ := internalTopic(filter, false); internal {
		return false
	}
	var extra []string
	if st := stateOf(c); st != nil {
		extra = st.id.Subscribe
	}
	return h.o.ACL.Check(c.ID(), c.Username(), filter, false, extra)
}

// CanRead implements engine.Authorizer: the read ACL applied to the concrete
// topic of each delivery (a subscription can be granted that reaches some
// denied topics: a deny rule filters them out of every delivery, live,
// retained, or queued for an offline session). An offline session is
// checked by its username alone, without the grants its credential
// carried.
func (h *Hook) CanRead(c *engine.Client, clientID, username, topic string) bool {
	if internal, _ := internalTopic(topic, false); internal {
		return false
	}
	var extra []string
	if st := stateOf(c); st != nil {
		extra = st.id.Subscribe
	}
	return h.o.ACL.CheckRetained(clientID, username, topic, extra)
}

// Admit implements engine.Limiter: connection caps, connect rate and bans
// per IP, before a byte is read.
func (h *Hook) Admit(remote string) (func(), error) {
	if h.o.Quotas == nil {
		return func() {}, nil
	}
	ip := remote
	if host, _, err := net.SplitHostPort(remote); err == nil {
		ip = host
	}
	return h.o.Quotas.AdmitConnection(ip)
}

// AllowPublish implements engine.Limiter: the topic limits and the client's
// publish rate. MQTT 5 gets 0x96 (message rate too high) or 0x90; an MQTT
// 3 client is stalled for the wait (at most Slowdown), its packet dropped,
// and disconnected after Strikes stalls in a row.
func (h *Hook) AllowPublish(c *engine.Client, topic string, size int) (engine.ReasonCode, time.Duration, bool) {
	st := stateOf(c)
	if st == nil || h.o.Quotas == nil {
		return engine.Success, 0, false
	}
	if err := h.o.Quotas.CheckTopic(topic); err != nil {
		return engine.TopicNameInvalid, 0, false
	}
	ok, wait := st.lim.AllowPublish(size)
	if ok {
		st.strikes = 0
		return engine.Success, 0, false
	}
	if c.Protocol() < 5 {
		st.strikes++
		if st.strikes > h.o.Strikes {
			h.log.Info().Str(logClient, c.ID()).Msg("publish rate exceeded; disconnecting")
			return engine.MessageRateTooHigh, min(wait, h.o.Slowdown), true
		}
	}
	return engine.MessageRateTooHigh, max(min(wait, h.o.Slowdown), time.Millisecond), false
}

// AllowSubscription implements engine.Limiter: the subscription cap and the
// topic limits (SUBACK 0x97 / 0x8F; 0x80 on MQTT 3). A filter the client
// already holds takes no new place (the engine asks only for new ones).
func (h *Hook) AllowSubscription(_ *engine.Client, filter string, held int) engine.ReasonCode {
	if h.o.Quotas == nil {
		return engine.Success
	}
	_, inner, _ := mqtttopic.Unshare(filter)
	if h.o.Quotas.CheckTopic(inner) != nil {
		return engine.TopicFilterInvalid
	}
	if !h.o.Quotas.AllowSubscription(held) {
		return engine.QuotaExceeded
	}
	return engine.Success
}

// logClient is the log field naming a client.
const logClient = "client"
