package engine_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// ruleRecorder is every hook at once; it records each call it gets, so a
// rule's test can say that no hook saw the packet that broke it.
// Authenticate refuses client IDs starting "refuse" (not authorized) and
// "reject" (identifier rejected); CanPublish refuses topics under "deny/";
// Uplink refuses "refuse/…" (quota exceeded), holds "hold/…" (never done)
// and delivers the rest.
type ruleRecorder struct {
	mu    sync.Mutex
	calls []string
}

func (r *ruleRecorder) note(format string, args ...any) {
	r.mu.Lock()
	r.calls = append(r.calls, fmt.Sprintf(format, args...))
	r.mu.Unlock()
}

// since returns the calls recorded after the first n.
func (r *ruleRecorder) since(n int) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls[n:]...)
}

func (r *ruleRecorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.calls)
}

func (r *ruleRecorder) Authenticate(_ context.Context, ci *engine.ConnectInfo) (engine.Identity, error) {
	r.note("authenticate %s", ci.ClientID)
	switch {
	case strings.HasPrefix(ci.ClientID, "refuse"):
		return engine.Identity{}, &engine.Refusal{Code: engine.NotAuthorized, Reason: "refused by the test"}
	case strings.HasPrefix(ci.ClientID, "reject"):
		return engine.Identity{}, &engine.Refusal{Code: engine.ClientIDNotValid, Reason: "rejected by the test"}
	}
	return engine.Identity{Username: ci.Username}, nil
}

func (r *ruleRecorder) CanPublish(c *engine.Client, topic string) bool {
	r.note("publish %s %s", c.ID(), topic)
	return !strings.HasPrefix(topic, "deny/")
}

func (r *ruleRecorder) CanSubscribe(c *engine.Client, filter string) bool {
	r.note("subscribe %s %s", c.ID(), filter)
	return true
}

func (r *ruleRecorder) CanRead(*engine.Client, string, string, string) bool { return true }

func (r *ruleRecorder) Publish(c *engine.Client, m *engine.Message, _ func(engine.Result)) (engine.Decision, engine.Result) {
	r.note("uplink %s %s", c.ID(), m.Topic)
	switch {
	case strings.HasPrefix(m.Topic, "refuse/"):
		return engine.Refuse, engine.Result{Code: engine.QuotaExceeded, Reason: "core full"}
	case strings.HasPrefix(m.Topic, "hold/"):
		return engine.Defer, engine.Result{}
	}
	return engine.Deliver, engine.Result{}
}

// What a rule's test allows the hooks to see.
const (
	noHook   = iota // nothing: the packet is refused before any hook
	authOnly        // Authenticate for the CONNECT, nothing for the bad packet
	anyHook         // the rule is about what a hook decided
)

// ruleReply is what the engine must answer the offending bytes with: typ
// 0 is nothing at all; open says the connection must stay open after it.
type ruleReply struct {
	typ  byte
	code byte
	open bool
}

var (
	closes        = ruleReply{}
	connack       = func(code byte) ruleReply { return ruleReply{typ: 0x20, code: code} }
	disconnect    = func(code byte) ruleReply { return ruleReply{typ: 0xE0, code: code} }
	answersOpen   = func(typ, code byte) ruleReply { return ruleReply{typ: typ, code: code, open: true} }
	v4connectBody = func(flags byte, payload ...[]byte) []byte {
		return packet(0x10, append([][]byte{str("MQTT"), {4, flags, 0, 60}}, payload...)...)
	}
	v5connectBody = func(flags byte, props []byte, payload ...[]byte) []byte {
		return packet(0x10, append([][]byte{str("MQTT"), {5, flags, 0, 60}, props}, payload...)...)
	}
	props = func(p ...byte) []byte { return append(remLen(len(p)), p...) }
)

// specRule is one normative statement of MQTT 3.1.1 or 5 and the bytes
// that break it. connect is the client's version (4 or 5), whose CONNECT
// is sent first and accepted; 0 means bad is the connection's first
// bytes.
type specRule struct {
	rule    string // the spec's tag, or its section where it has none
	what    string
	connect byte
	bad     []byte
	want    ruleReply
	hooks   int
}

// specRules are the rules of docs/conformance.md "Rules the engine
// enforces" that a packet sent by a client can break. Each row's name
// starts with its rule, so grepping a tag finds its test.
func specRules() []specRule {
	pub := func(first byte, topic string, rest ...[]byte) []byte {
		return packet(first, append([][]byte{str(topic)}, rest...)...)
	}
	return []specRule{
		// ---- MQTT 3.1.1 ----
		{"[MQTT-3.1.0-1]", "3.1.1 first packet not CONNECT", 0, pub(0x30, "a", []byte("x")), closes, noHook},
		{"[MQTT-3.1.0-2]", "3.1.1 second CONNECT", 4, connectV4("again"), closes, authOnly},
		{"[MQTT-2.2.2-2]", "3.1.1 CONNECT with reserved header flags", 0, append([]byte{0x11}, v4connectBody(0x02, str("c1"))[1:]...), closes, noHook},
		{"[MQTT-3.1.2-1]", "3.1.1 protocol name not MQTT", 0, packet(0x10, str("MQTX"), []byte{4, 0x02, 0, 60}, str("c2")), closes, noHook},
		{"[MQTT-3.1.2-2]", "3.1.1 protocol level 6", 0, packet(0x10, str("MQTT"), []byte{6, 0x02, 0, 60}, str("c3")), connack(0x01), noHook},
		{"[MQTT-3.1.2-3] [MQTT-3.1.4-1] [MQTT-3.2.2-6]", "3.1.1 CONNECT reserved flag", 0, v4connectBody(0x03, str("c4")), closes, noHook},
		{"[MQTT-3.1.2-11] [MQTT-3.1.2-13]", "3.1.1 will QoS without a will", 0, v4connectBody(0x0A, str("c5")), closes, noHook},
		{"[MQTT-3.1.2-11] [MQTT-3.1.2-15]", "3.1.1 will retain without a will", 0, v4connectBody(0x22, str("c6")), closes, noHook},
		{"[MQTT-3.1.2-14]", "3.1.1 will QoS 3", 0, v4connectBody(0x1E, str("c7"), str("w"), str("bye")), closes, noHook},
		{"[MQTT-3.1.2-22]", "3.1.1 password without a user name", 0, v4connectBody(0x42, str("c8"), str("secret")), closes, noHook},
		{"[MQTT-3.1.2-9]", "3.1.1 will flag without a will topic", 0, v4connectBody(0x06, str("c9")), closes, noHook},
		{"[MQTT-3.1.2-19]", "3.1.1 user name flag without a user name", 0, v4connectBody(0x82, str("c10")), closes, noHook},
		{"[MQTT-3.1.2-21]", "3.1.1 password flag without a password", 0, v4connectBody(0xC2, str("c11"), str("u")), closes, noHook},
		{"[MQTT-3.1.3-10]", "3.1.1 will topic not UTF-8", 0, v4connectBody(0x06, str("c12"), str("w/\xff"), str("bye")), closes, noHook},
		{"[MQTT-3.1.3-11]", "3.1.1 user name not UTF-8", 0, v4connectBody(0x82, str("c13"), str("u\xff")), closes, noHook},
		{"[MQTT-1.5.3-1]", "3.1.1 client ID not UTF-8", 0, v4connectBody(0x02, str("c\xff")), closes, noHook},
		{"[MQTT-1.5.3-2]", "3.1.1 client ID with U+0000", 0, v4connectBody(0x02, str("c\x00")), closes, noHook},
		{"[MQTT-3.1.3-8]", "3.1.1 empty client ID without clean session", 0, v4connectBody(0x00, str("")), connack(0x02), noHook},
		{"[MQTT-3.1.3-9]", "3.1.1 client ID rejected: CONNACK 2 then close", 0, connectV4("reject-me"), connack(0x02), authOnly},
		{"[MQTT-3.1.4-6]", "3.1.1 nothing after a refused CONNECT is processed", 0,
			append(connectV4("refuse-me"), pub(0x32, "after/refusal", []byte{0, 1}, []byte("x"))...), connack(0x05), authOnly},
		{"[MQTT-3.2.2-4] [MQTT-3.2.2-5]", "3.1.1 a CONNACK refusing closes the connection", 0, connectV4("refuse-too"), connack(0x05), authOnly},
		{"[MQTT-3.3.1-4] [MQTT-4.8.0-1]", "3.1.1 PUBLISH QoS 3", 4, pub(0x36, "a", []byte{0, 1}, []byte("x")), closes, authOnly},
		{"[MQTT-3.3.1-2]", "3.1.1 DUP on QoS 0", 4, pub(0x38, "a", []byte("x")), closes, authOnly},
		{"[MQTT-2.3.1-1]", "3.1.1 QoS 1 PUBLISH with packet identifier 0", 4, pub(0x32, "a", []byte{0, 0}, []byte("x")), closes, authOnly},
		{"[MQTT-4.7.3-1]", "3.1.1 PUBLISH with an empty topic", 4, pub(0x30, "", []byte("x")), closes, authOnly},
		{"[MQTT-3.3.2-2]", "3.1.1 PUBLISH topic with a wildcard", 4, pub(0x30, "a/+", []byte("x")), closes, authOnly},
		{"[MQTT-1.5.3-1]", "3.1.1 PUBLISH topic not UTF-8", 4, pub(0x30, "a/\xed\xa0\x80", []byte("x")), closes, authOnly},
		{"[MQTT-3.3.5-2]", "3.1.1 unauthorized QoS 1 PUBLISH closes, no PUBACK", 4, pub(0x32, "deny/x", []byte{0, 1}, []byte("x")), closes, anyHook},
		{"[MQTT-4.8.0-2]", "3.1.1 a publish the core cannot take closes, no PUBACK", 4, pub(0x32, "refuse/x", []byte{0, 1}, []byte("x")), closes, anyHook},
		{"[MQTT-2.2.2-2]", "3.1.1 PUBACK with reserved flags", 4, packet(0x41, []byte{0, 1}), closes, authOnly},
		{"[MQTT-3.6.1-1]", "3.1.1 PUBREL flags not 0010", 4, packet(0x60, []byte{0, 1}), closes, authOnly},
		{"§3.4.1", "3.1.1 PUBACK remaining length not 2", 4, packet(0x40, []byte{0, 1, 0}), closes, authOnly},
		{"[MQTT-3.8.1-1]", "3.1.1 SUBSCRIBE flags not 0010", 4, packet(0x80, []byte{0, 1}, str("a"), []byte{1}), closes, authOnly},
		{"[MQTT-3.8.3-3]", "3.1.1 SUBSCRIBE without a filter", 4, packet(0x82, []byte{0, 1}), closes, authOnly},
		{"[MQTT-3.8.3-4]", "3.1.1 SUBSCRIBE reserved bits of the requested QoS", 4, packet(0x82, []byte{0, 1}, str("a"), []byte{0x04}), closes, authOnly},
		{"[MQTT-3.8.3-4]", "3.1.1 SUBSCRIBE requested QoS 3", 4, packet(0x82, []byte{0, 1}, str("a"), []byte{0x03}), closes, authOnly},
		{"[MQTT-2.3.1-1]", "3.1.1 SUBSCRIBE with packet identifier 0", 4, packet(0x82, []byte{0, 0}, str("a"), []byte{1}), closes, authOnly},
		{"[MQTT-3.8.3-1]", "3.1.1 SUBSCRIBE filter not UTF-8", 4, packet(0x82, []byte{0, 1}, str("a/\xff"), []byte{1}), closes, authOnly},
		{"[MQTT-3.9.3-2]", "3.1.1 invalid filter gets SUBACK 0x80", 4, packet(0x82, []byte{0, 1}, str("a/#/b"), []byte{1}), answersOpen(0x90, 0x80), authOnly},
		{"[MQTT-3.10.1-1]", "3.1.1 UNSUBSCRIBE flags not 0010", 4, packet(0xA0, []byte{0, 1}, str("a")), closes, authOnly},
		{"[MQTT-3.10.3-2]", "3.1.1 UNSUBSCRIBE without a filter", 4, packet(0xA2, []byte{0, 1}), closes, authOnly},
		{"[MQTT-3.10.3-1]", "3.1.1 UNSUBSCRIBE filter not UTF-8", 4, packet(0xA2, []byte{0, 1}, str("a/\xff")), closes, authOnly},
		{"[MQTT-2.3.1-1]", "3.1.1 UNSUBSCRIBE with packet identifier 0", 4, packet(0xA2, []byte{0, 0}, str("a")), closes, authOnly},
		{"[MQTT-3.12.4-1]", "3.1.1 PINGREQ gets PINGRESP", 4, []byte{0xC0, 0}, answersOpen(0xD0, 0), authOnly},
		{"[MQTT-2.2.2-2]", "3.1.1 PINGREQ with reserved flags", 4, []byte{0xC1, 0}, closes, authOnly},
		{"§3.12.1", "3.1.1 PINGREQ with a body", 4, []byte{0xC0, 1, 0}, closes, authOnly},
		{"[MQTT-3.14.1-1]", "3.1.1 DISCONNECT with reserved flags", 4, []byte{0xE1, 0}, closes, authOnly},
		{"[MQTT-3.14.4-2]", "3.1.1 nothing after a DISCONNECT is processed", 4,
			append([]byte{0xE0, 0}, pub(0x30, "after/disconnect", []byte("x"))...), closes, authOnly},
		{"§3.14.1", "3.1.1 DISCONNECT with a body", 4, []byte{0xE0, 1, 0}, closes, authOnly},
		{"§2.2.1", "3.1.1 reserved packet type 0", 4, []byte{0x00, 0}, closes, authOnly},
		{"§2.2.1", "3.1.1 reserved packet type 15", 4, []byte{0xF0, 0}, closes, authOnly},
		{"§2.2.1", "3.1.1 CONNACK from a client", 4, []byte{0x20, 2, 0, 0}, closes, authOnly},
		{"§2.2.3", "3.1.1 remaining length of five bytes", 4, []byte{0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01}, closes, authOnly},

		// ---- MQTT 5 ----
		{"[MQTT-3.1.0-1]", "5 first packet not CONNECT", 0, pub(0x30, "a", []byte{0}, []byte("x")), closes, noHook},
		{"[MQTT-3.1.0-2] [MQTT-3.2.0-2]", "5 second CONNECT (no second CONNACK)", 5, connectV5("again"), disconnect(0x82), authOnly},
		{"[MQTT-2.1.3-1]", "5 CONNECT with reserved header flags", 0, append([]byte{0x11}, v5connectBody(0x02, props(), str("d1"))[1:]...), closes, noHook},
		{"[MQTT-3.1.2-1]", "5 protocol name not MQTT", 0, packet(0x10, str("MQTX"), []byte{5, 0x02, 0, 60, 0}, str("d2")), closes, noHook},
		{"[MQTT-3.1.2-2]", "5 protocol level 6: CONNACK in the 3.1.1 form", 0, packet(0x10, str("MQTT"), []byte{6, 0x02, 0, 60, 0}, str("d0")), connack(0x01), noHook},
		{"[MQTT-3.1.2-3] [MQTT-3.1.4-1]", "5 CONNECT reserved flag", 0, v5connectBody(0x03, props(), str("d3")), closes, noHook},
		{"[MQTT-3.1.2-11]", "5 will QoS without a will", 0, v5connectBody(0x0A, props(), str("d4")), closes, noHook},
		{"[MQTT-3.1.2-13]", "5 will retain without a will", 0, v5connectBody(0x22, props(), str("d5")), closes, noHook},
		{"[MQTT-3.1.2-12]", "5 will QoS 3", 0, v5connectBody(0x1E, props(), str("d6"), props(), str("w"), str("bye")), closes, noHook},
		{"[MQTT-3.1.2-9]", "5 will flag without a will topic", 0, v5connectBody(0x06, props(), str("d20"), props()), connack(0x81), noHook},
		{"[MQTT-3.1.2-17]", "5 user name flag without a user name", 0, v5connectBody(0x82, props(), str("d21")), connack(0x81), noHook},
		{"[MQTT-3.1.2-19]", "5 password flag without a password", 0, v5connectBody(0xC2, props(), str("d22"), str("u")), connack(0x81), noHook},
		{"[MQTT-3.1.3-11]", "5 will topic not UTF-8", 0, v5connectBody(0x06, props(), str("d23"), props(), str("w/\xff"), str("bye")), connack(0x81), noHook},
		{"[MQTT-3.1.3-12]", "5 user name not UTF-8", 0, v5connectBody(0x82, props(), str("d24"), str("u\xff")), closes, noHook},
		{"[MQTT-1.5.4-1]", "5 client ID not UTF-8", 0, v5connectBody(0x02, props(), str("d\xff")), connack(0x81), noHook},
		{"[MQTT-1.5.4-2]", "5 client ID with U+0000", 0, v5connectBody(0x02, props(), str("d\x00")), connack(0x81), noHook},
		{"[MQTT-3.1.3-11]", "5 will topic with a wildcard", 0, v5connectBody(0x06, props(), str("d7"), props(), str("w/#"), str("bye")), connack(0x90), noHook},
		{"§3.1.3.2.3", "5 will payload format indicator 2", 0, v5connectBody(0x06, props(), str("d8"), props(0x01, 2), str("w"), str("bye")), connack(0x82), noHook},
		{"§3.1.3.2.3", "5 will payload not UTF-8 as it says", 0, v5connectBody(0x06, props(), str("d9"), props(0x01, 1), str("w"), str("\xff")), connack(0x99), noHook},
		{"§3.1.3.2.8", "5 will response topic with a wildcard", 0, v5connectBody(0x06, props(), str("d10"), props(append([]byte{0x08}, str("r/+")...)...), str("w"), str("bye")), connack(0x82), noHook},
		{"[MQTT-4.12.0-1]", "5 unsupported authentication method", 0, v5connectBody(0x02, props(append([]byte{0x15}, str("SCRAM")...)...), str("d11")), connack(0x8C), noHook},
		{"§3.1.2.11.10", "5 authentication data without a method", 0, v5connectBody(0x02, props(0x16, 0, 1, 'x'), str("d12")), connack(0x82), noHook},
		{"§3.1.2.11.7", "5 request problem information 2", 0, v5connectBody(0x02, props(0x17, 2), str("d13")), connack(0x82), noHook},
		{"§3.1.2.11.6", "5 request response information 2", 0, v5connectBody(0x02, props(0x19, 2), str("d14")), connack(0x82), noHook},
		{"§3.1.2.11.3", "5 receive maximum 0", 0, v5connectBody(0x02, props(0x21, 0, 0), str("d15")), connack(0x82), noHook},
		{"§3.1.2.11.4", "5 maximum packet size 0", 0, v5connectBody(0x02, props(0x27, 0, 0, 0, 0), str("d16")), connack(0x82), noHook},
		{"§2.2.2.2", "5 a property CONNECT may not carry", 0, v5connectBody(0x02, props(0x23, 0, 1), str("d17")), connack(0x81), noHook},
		{"§2.2.2.2", "5 a CONNECT property twice", 0, v5connectBody(0x02, props(0x11, 0, 0, 0, 1, 0x11, 0, 0, 0, 2), str("d18")), connack(0x82), noHook},
		{"§2.2.2.2", "5 a will property twice", 0, v5connectBody(0x06, props(), str("d19"), props(0x01, 0, 0x01, 0), str("w"), str("bye")), connack(0x82), noHook},
		{"[MQTT-3.1.4-6]", "5 nothing after a refused CONNECT is processed", 0,
			append(connectV5("refuse-me5"), pub(0x32, "after/refusal", []byte{0, 1, 0}, []byte("x"))...), connack(0x87), authOnly},
		{"[MQTT-3.2.2-6] [MQTT-3.2.2-7] [MQTT-4.13.2-1]", "5 a CONNACK of 0x80 or more closes the connection", 0, connectV5("reject-me5"), connack(0x85), authOnly},
		{"[MQTT-3.3.1-4] [MQTT-4.13.1-1]", "5 PUBLISH QoS 3", 5, pub(0x36, "a", []byte{0, 1, 0}, []byte("x")), disconnect(0x81), authOnly},
		{"[MQTT-3.3.1-2]", "5 DUP on QoS 0", 5, pub(0x38, "a", []byte{0}, []byte("x")), disconnect(0x81), authOnly},
		{"[MQTT-2.2.1-3]", "5 QoS 1 PUBLISH with packet identifier 0", 5, pub(0x32, "a", []byte{0, 0, 0}, []byte("x")), disconnect(0x82), authOnly},
		{"[MQTT-3.3.2-1]", "5 PUBLISH without a topic or an alias", 5, pub(0x30, "", []byte{0}, []byte("x")), disconnect(0x82), authOnly},
		{"[MQTT-3.3.2-2]", "5 PUBLISH topic with a wildcard", 5, pub(0x30, "a/#", []byte{0}, []byte("x")), disconnect(0x90), authOnly},
		{"[MQTT-1.5.4-1]", "5 PUBLISH topic not UTF-8", 5, pub(0x30, "a/\xff", []byte{0}, []byte("x")), disconnect(0x81), authOnly},
		{"[MQTT-1.5.4-2]", "5 PUBLISH topic with U+0000", 5, pub(0x30, "a/\x00", []byte{0}, []byte("x")), disconnect(0x81), authOnly},
		{"[MQTT-3.3.2-8]", "5 topic alias 0", 5, pub(0x30, "a", props(0x23, 0, 0), []byte("x")), disconnect(0x94), authOnly},
		{"[MQTT-3.3.2-9]", "5 topic alias over the maximum", 5, pub(0x30, "a", props(0x23, 0xFF, 0xFF), []byte("x")), disconnect(0x94), authOnly},
		{"§3.3.2.3.4", "5 topic alias never set", 5, pub(0x30, "", props(0x23, 0, 9), []byte("x")), disconnect(0x82), authOnly},
		{"[MQTT-3.3.2-14]", "5 response topic with a wildcard", 5, pub(0x30, "a", props(append([]byte{0x08}, str("r/#")...)...), []byte("x")), disconnect(0x82), authOnly},
		{"§3.3.2.3.2", "5 payload format indicator 2", 5, pub(0x30, "a", props(0x01, 2), []byte("x")), disconnect(0x82), authOnly},
		{"§3.3.2.3.2", "5 payload not UTF-8 as it says: PUBACK 0x99", 5, pub(0x32, "a", []byte{0, 1}, props(0x01, 1), []byte("\xff")), answersOpen(0x40, 0x99), authOnly},
		{"[MQTT-3.3.4-6]", "5 PUBLISH with a subscription identifier", 5, pub(0x30, "a", props(0x0B, 1), []byte("x")), disconnect(0x82), authOnly},
		{"§2.2.2.2", "5 a property PUBLISH may not carry", 5, pub(0x30, "a", props(0x11, 0, 0, 0, 1), []byte("x")), disconnect(0x81), authOnly},
		{"§2.2.2.2", "5 a PUBLISH property twice", 5, pub(0x30, "a", props(0x01, 0, 0x01, 0), []byte("x")), disconnect(0x82), authOnly},
		{"[MQTT-3.3.4-7]", "5 more QoS 1 publishes in flight than Receive Maximum", 5,
			append(append(pub(0x32, "hold/1", []byte{0, 1, 0}, []byte("x")), pub(0x32, "hold/2", []byte{0, 2, 0}, []byte("x"))...),
				pub(0x32, "hold/3", []byte{0, 3, 0}, []byte("x"))...), disconnect(0x93), anyHook},
		{"§3.4.2.1", "5 unauthorized PUBLISH gets PUBACK 0x87", 5, pub(0x32, "deny/x", []byte{0, 1, 0}, []byte("x")), answersOpen(0x40, 0x87), anyHook},
		{"[MQTT-2.1.3-1]", "5 PUBACK with reserved flags", 5, packet(0x41, []byte{0, 1}), disconnect(0x81), authOnly},
		{"[MQTT-3.6.1-1]", "5 PUBREL flags not 0010", 5, packet(0x60, []byte{0, 1}), disconnect(0x81), authOnly},
		{"§2.2.1", "5 PUBACK with packet identifier 0", 5, packet(0x40, []byte{0, 0}), disconnect(0x82), authOnly},
		{"[MQTT-3.4.2-1]", "5 PUBACK reason code not a PUBACK's", 5, packet(0x40, []byte{0, 1, 0x05}), disconnect(0x82), authOnly},
		{"[MQTT-3.5.2-1]", "5 PUBREC reason code not a PUBREC's", 5, packet(0x50, []byte{0, 1, 0x05}), disconnect(0x82), authOnly},
		{"[MQTT-3.6.2-1]", "5 PUBREL reason code not a PUBREL's", 5, packet(0x62, []byte{0, 1, 0x10}), disconnect(0x82), authOnly},
		{"[MQTT-3.7.2-1]", "5 PUBCOMP reason code not a PUBCOMP's", 5, packet(0x70, []byte{0, 1, 0x10}), disconnect(0x82), authOnly},
		{"§2.2.2", "5 PUBACK properties overrun the packet", 5, packet(0x40, []byte{0, 1, 0, 5}), disconnect(0x81), authOnly},
		{"§3.6.2.1", "5 PUBREL of an unknown ID gets PUBCOMP 0x92", 5, packet(0x62, []byte{0, 7}), answersOpen(0x70, 0x92), authOnly},
		{"[MQTT-3.8.1-1]", "5 SUBSCRIBE flags not 0010", 5, packet(0x80, []byte{0, 1, 0}, str("a"), []byte{1}), disconnect(0x81), authOnly},
		{"[MQTT-3.8.3-2]", "5 SUBSCRIBE without a filter", 5, packet(0x82, []byte{0, 1, 0}), disconnect(0x82), authOnly},
		{"[MQTT-3.8.3-5]", "5 SUBSCRIBE reserved option bits", 5, packet(0x82, []byte{0, 1, 0}, str("a"), []byte{0x41}), disconnect(0x81), authOnly},
		{"§3.8.3.1", "5 SUBSCRIBE maximum QoS 3", 5, packet(0x82, []byte{0, 1, 0}, str("a"), []byte{0x03}), disconnect(0x82), authOnly},
		{"§3.8.3.1", "5 SUBSCRIBE retain handling 3", 5, packet(0x82, []byte{0, 1, 0}, str("a"), []byte{0x31}), disconnect(0x82), authOnly},
		{"[MQTT-3.8.3-4]", "5 no local on a shared subscription", 5, packet(0x82, []byte{0, 1, 0}, str("$share/g/a"), []byte{0x05}), disconnect(0x82), authOnly},
		{"§3.8.2.1.2", "5 subscription identifier twice", 5, packet(0x82, []byte{0, 1}, props(0x0B, 1, 0x0B, 2), str("a"), []byte{1}), disconnect(0x82), authOnly},
		{"§3.8.2.1.2", "5 subscription identifier 0", 5, packet(0x82, []byte{0, 1}, props(0x0B, 0), str("a"), []byte{1}), disconnect(0x82), authOnly},
		{"[MQTT-2.2.1-3]", "5 SUBSCRIBE with packet identifier 0", 5, packet(0x82, []byte{0, 0, 0}, str("a"), []byte{1}), disconnect(0x82), authOnly},
		{"[MQTT-3.8.3-1]", "5 SUBSCRIBE filter not UTF-8", 5, packet(0x82, []byte{0, 1, 0}, str("a/\xff"), []byte{1}), disconnect(0x81), authOnly},
		{"§2.2.2", "5 SUBSCRIBE properties overrun the packet", 5, packet(0x82, []byte{0, 1, 9}, str("a"), []byte{1}), disconnect(0x81), authOnly},
		{"[MQTT-3.9.3-2]", "5 invalid filter gets SUBACK 0x8F", 5, packet(0x82, []byte{0, 1, 0}, str("a/#/b"), []byte{1}), answersOpen(0x90, 0x8F), authOnly},
		{"[MQTT-3.10.1-1]", "5 UNSUBSCRIBE flags not 0010", 5, packet(0xA0, []byte{0, 1, 0}, str("a")), disconnect(0x81), authOnly},
		{"[MQTT-3.10.3-2]", "5 UNSUBSCRIBE without a filter", 5, packet(0xA2, []byte{0, 1, 0}), disconnect(0x82), authOnly},
		{"[MQTT-2.2.1-3]", "5 UNSUBSCRIBE with packet identifier 0", 5, packet(0xA2, []byte{0, 0, 0}, str("a")), disconnect(0x82), authOnly},
		{"[MQTT-3.10.3-1]", "5 UNSUBSCRIBE filter not UTF-8", 5, packet(0xA2, []byte{0, 1, 0}, str("a/\xff")), disconnect(0x81), authOnly},
		{"[MQTT-3.11.3-1]", "5 UNSUBACK says no subscription existed", 5, packet(0xA2, []byte{0, 1, 0}, str("none")), answersOpen(0xB0, 0x11), authOnly},
		{"[MQTT-3.12.4-1]", "5 PINGREQ gets PINGRESP", 5, []byte{0xC0, 0}, answersOpen(0xD0, 0), authOnly},
		{"[MQTT-2.1.3-1]", "5 PINGREQ with reserved flags", 5, []byte{0xC1, 0}, disconnect(0x81), authOnly},
		{"[MQTT-3.14.1-1]", "5 DISCONNECT with reserved flags", 5, []byte{0xE1, 0}, disconnect(0x81), authOnly},
		{"[MQTT-3.14.4-1]", "5 nothing after a DISCONNECT is processed", 5,
			append([]byte{0xE0, 0}, pub(0x30, "after/disconnect", []byte{0}, []byte("x"))...), closes, authOnly},
		{"[MQTT-3.14.2-1]", "5 DISCONNECT reason code not a DISCONNECT's", 5, []byte{0xE0, 1, 0x05}, disconnect(0x82), authOnly},
		{"[MQTT-3.14.2-2]", "5 DISCONNECT sets a session expiry after 0", 5, packet(0xE0, []byte{0}, props(0x11, 0, 0, 0, 9)), disconnect(0x82), authOnly},
		{"§2.2.2", "5 DISCONNECT properties overrun the packet", 5, []byte{0xE0, 2, 0, 7}, disconnect(0x81), authOnly},
		{"[MQTT-4.12.0-7]", "5 AUTH without an authentication method", 5, packet(0xF0, []byte{0x18, 0}), disconnect(0x82), authOnly},
		{"[MQTT-3.15.1-1]", "5 AUTH with reserved flags", 5, packet(0xF1, []byte{0x18, 0}), disconnect(0x81), authOnly},
		{"§2.1.2", "5 reserved packet type 0", 5, []byte{0x00, 0}, disconnect(0x81), authOnly},
		{"§2.1.2", "5 SUBACK from a client", 5, packet(0x90, []byte{0, 1, 0, 0}), disconnect(0x81), authOnly},
		{"§1.5.5", "5 remaining length of five bytes", 5, []byte{0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01}, disconnect(0x81), authOnly},
		{"[MQTT-1.5.5-1]", "5 remaining length not in the fewest bytes", 5, []byte{0xC0, 0x80, 0x00}, disconnect(0x81), authOnly},
		{"[MQTT-3.2.2-15]", "5 packet over the Maximum Packet Size", 5, append([]byte{0x30}, remLen(1<<20)...), disconnect(0x95), authOnly},
	}
}

// TestSpecRules breaks each rule of specRules on a fresh connection to a
// real engine and checks what the spec requires: the reason code of the
// CONNACK, DISCONNECT or ack the client gets (nothing for MQTT 3.1.1, which
// has no server DISCONNECT [MQTT-4.8.0-1], and nothing before a CONNACK),
// that the connection is then closed [MQTT-4.13.1-1] [MQTT-4.13.2-1] (or
// stays open, where the rule wants an answer), and that no hook saw the
// offending packet.
func TestSpecRules(t *testing.T) {
	rec := &ruleRecorder{}
	_, addr := start(t, engine.Options{MaxPacketBytes: 64 << 10, ReceiveMaximum: 2,
		Hooks: engine.Hooks{Auth: rec, ACL: rec, Uplink: rec}})
	for i, r := range specRules() {
		t.Run(r.rule+" "+r.what, func(t *testing.T) {
			n := rec.count()
			c, err := net.DialTimeout("tcp", addr, 5*time.Second)
			require.NoError(t, err)
			defer c.Close()
			v5 := r.connect == 5
			switch r.connect {
			case 4:
				c = connectOn(t, c, connectV4(fmt.Sprintf("rule-%d", i)))
			case 5:
				c = connectOn(t, c, connectV5(fmt.Sprintf("rule-%d", i)))
			default:
				v5 = len(r.bad) > 8 && r.bad[0]>>4 == 1 && r.bad[8] == 5
			}
			_, err = c.Write(r.bad)
			require.NoError(t, err)
			if r.want.open {
				require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
				first, body := readFrame(t, c)
				require.Equal(t, r.want.typ, first&0xF0, "packet type")
				require.Equal(t, r.want.code, replyCode(first, body, v5), "reason code")
				_, err = c.Write([]byte{0xC0, 0})
				require.NoError(t, err)
				first, _ = readFrame(t, c)
				require.Equal(t, byte(0xD0), first, "still open: PINGRESP")
			} else {
				got := closedWithin(t, c, 5*time.Second)
				if r.want.typ == 0 {
					require.Empty(t, got, "nothing is sent before the close")
				} else {
					require.NotEmpty(t, got, "a %#x is sent before the close", r.want.typ)
					first, body := readFrame(t, strings.NewReader(string(got)))
					require.Equal(t, r.want.typ, first&0xF0, "packet type")
					require.Equal(t, r.want.code, replyCode(first, body, v5), "reason code")
					if first == 0x20 {
						require.Equal(t, byte(0), body[0], "a refusing CONNACK has Session Present 0 [MQTT-3.2.2-4] [MQTT-3.2.2-6]")
					}
				}
			}
			calls := rec.since(n)
			switch r.hooks {
			case noHook:
				require.Empty(t, calls, "no hook sees a refused CONNECT")
			case authOnly:
				require.Len(t, calls, 1, "only Authenticate, for the CONNECT: %v", calls)
				require.True(t, strings.HasPrefix(calls[0], "authenticate "), "%v", calls)
			}
		})
	}
}

// connectOn sends connect on c and reads its CONNACK, which must accept.
func connectOn(t testing.TB, c net.Conn, connect []byte) net.Conn {
	t.Helper()
	_, err := c.Write(connect)
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	first, body := readFrame(t, c)
	require.Equal(t, byte(0x20), first, "CONNACK")
	require.Equal(t, byte(0), body[1], "CONNECT accepted")
	require.NoError(t, c.SetReadDeadline(time.Time{}))
	return c
}

// replyCode is the return or reason code of a server's packet (0 where it
// has none, as a two-byte MQTT 5 ack means success).
func replyCode(first byte, body []byte, v5 bool) byte {
	switch first & 0xF0 {
	case 0x20: // CONNACK
		return body[1]
	case 0xE0: // DISCONNECT
		if len(body) == 0 {
			return 0
		}
		return body[0]
	case 0x40, 0x50, 0x60, 0x70: // PUBACK … PUBCOMP
		if len(body) > 2 {
			return body[2]
		}
		return 0
	case 0x90, 0xB0: // SUBACK, UNSUBACK: the first filter's code
		if !v5 {
			return body[2]
		}
		n, hdr := 0, 0
		for i, shift := 2, 0; ; i, shift = i+1, shift+7 {
			n |= int(body[i]&0x7F) << shift
			if body[i]&0x80 == 0 {
				hdr = i - 1
				break
			}
		}
		return body[2+hdr+n]
	}
	return 0
}

// TestDisconnectDecidesTheWill: a DISCONNECT discards the will
// [MQTT-3.14.4-3] (3.1.1, and MQTT 5 with reason code 0x00), an MQTT 5
// DISCONNECT 0x04 — a lone reason code, remaining length 1 — publishes it,
// and so does a connection lost without one [MQTT-3.1.2-8].
func TestDisconnectDecidesTheWill(t *testing.T) {
	_, addr := start(t, engine.Options{})
	sub := rawConnect(t, addr, connectV4("will-watcher"))
	_, err := sub.Write(packet(0x82, []byte{0, 1}, str("will/#"), []byte{0}))
	require.NoError(t, err)
	require.NoError(t, sub.SetReadDeadline(time.Now().Add(5*time.Second)))
	first, _ := readFrame(t, sub)
	require.Equal(t, byte(0x90), first, "SUBACK")

	withWill := func(version byte, id string) []byte {
		if version == 5 {
			return v5connectBody(0x06, props(), str(id), props(), str("will/"+id), str("bye"))
		}
		return v4connectBody(0x06, str(id), str("will/"+id), str("bye"))
	}
	leave := func(version byte, id string, last []byte) {
		c := rawConnect(t, addr, withWill(version, id))
		if last != nil {
			_, err := c.Write(last)
			require.NoError(t, err)
		}
		_ = c.Close()
	}
	leave(4, "v4-clean", []byte{0xE0, 0})        // discarded
	leave(5, "v5-clean", []byte{0xE0, 0})        // discarded
	leave(5, "v5-normal", []byte{0xE0, 1, 0})    // discarded: reason code 0x00
	leave(5, "v5-with-will", []byte{0xE0, 1, 4}) // published
	leave(4, "v4-lost", nil)                     // published: no DISCONNECT
	var got []string
	for range 2 {
		require.NoError(t, sub.SetReadDeadline(time.Now().Add(5*time.Second)))
		first, body := readFrame(t, sub)
		require.Equal(t, byte(0x30), first&0xF0, "PUBLISH")
		n := int(body[0])<<8 | int(body[1])
		got = append(got, string(body[2:2+n]))
	}
	// Two connections end independently: no order between their wills.
	require.ElementsMatch(t, []string{"will/v5-with-will", "will/v4-lost"}, got)
	require.NoError(t, sub.SetReadDeadline(time.Now().Add(200*time.Millisecond)))
	_, err = sub.Read(make([]byte, 1))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded, "no other will")
}

// TestKeepaliveTimeoutV5: an MQTT 5 client silent for 1.5 × its keepalive
// is told DISCONNECT 0x8D and closed [MQTT-3.1.2-22] (MQTT 3.1.1:
// TestKeepaliveTimeout).
func TestKeepaliveTimeoutV5(t *testing.T) {
	_, addr := start(t, engine.Options{})
	c := rawConnect(t, addr, packet(0x10, str("MQTT"), []byte{5, 0x02, 0, 1, 0}, str("ka5")))
	begun := time.Now()
	got := closedWithin(t, c, 5*time.Second)
	require.GreaterOrEqual(t, time.Since(begun), 1400*time.Millisecond, "not before 1.5 × keepalive")
	require.NotEmpty(t, got)
	first, body := readFrame(t, strings.NewReader(string(got)))
	require.Equal(t, byte(0xE0), first, "DISCONNECT")
	require.Equal(t, byte(0x8D), body[0], "keep alive timeout")
}
