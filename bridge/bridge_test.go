package bridge

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/gateway/engine"
)

// A bad filter in an uplink rule is refused with ErrBadRule.
func TestUplinkRuleFilterChecked(t *testing.T) {
	for _, f := range []string{"", "a#", "a/#/b", "a+", "a/b+/c", "#/a"} {
		_, err := NewUplink([]UplinkRule{{Filter: f, Topic: "t"}})
		require.ErrorIs(t, err, ErrBadRule, f)
	}
}

func TestTemplates(t *testing.T) {
	v := &vars{clientID: "car-7", username: "fleet", topic: "vehicles/car-7/telemetry/gps"}
	cases := map[string]string{
		"":                                 "",
		"plain":                            "plain",
		"${clientid}":                      "car-7",
		"${username}":                      "fleet",
		"${level:1}":                       "vehicles",
		"${level:4}":                       "gps",
		"${level:5}":                       "",
		"t-${level:3}.${clientid}":         "t-telemetry.car-7",
		"$$${clientid}$$":                  "$car-7$",
		"${level:2}/${level:1}/${level:2}": "car-7/vehicles/car-7",
	}
	for src, want := range cases {
		tpl, err := parseTemplate(src)
		require.NoError(t, err, src)
		require.Equal(t, want, tpl.expand(v), src)
	}
	for _, bad := range []string{"${", "${clientid", "${nope}", "${level:0}", "${level:x}", "${level:65}", "a$b", "$"} {
		_, err := parseTemplate(bad)
		require.ErrorIs(t, err, ErrBadTemplate, bad)
	}
}

func TestTopicLevel(t *testing.T) {
	require.Equal(t, "a", topicLevel("a", 1))
	require.Equal(t, "", topicLevel("a", 2))
	require.Equal(t, "", topicLevel("/a", 1))
	require.Equal(t, "a", topicLevel("/a", 2))
	require.Equal(t, "", topicLevel("a//c", 2))
	require.Equal(t, "c", topicLevel("a//c", 3))
}

func TestUplinkDefaultRule(t *testing.T) {
	u, err := NewUplink(nil)
	require.NoError(t, err)
	m, err := u.Map(&Publish{Topic: "telemetry/car-1/gps", ClientID: "car-1", Username: "u", QoS: 1, Retain: true,
		Payload: []byte("x"), User: []UserProperty{{"fw", "1"}, {"fw", "2"}, {PropClientID, "spoof"}}})
	require.NoError(t, err)
	require.Equal(t, "telemetry", m.Topic)
	require.Equal(t, "car-1", m.ShardingKey)
	require.Equal(t, map[string]string{
		PropTopic: "telemetry/car-1/gps", PropClientID: "car-1", PropUsername: "u", PropQoS: "1", PropRetain: "true", "fw": "2",
	}, m.Properties)

	_, err = u.Map(&Publish{Topic: "bad topic/x", ClientID: "c"})
	require.ErrorIs(t, err, ErrInvalidCoreTopic)
	_, err = u.Map(&Publish{Topic: "/leading-slash", ClientID: "c"})
	require.ErrorIs(t, err, ErrInvalidCoreTopic, "first level is empty")
	_, err = u.Map(&Publish{Topic: "$SYS/x", ClientID: "c"})
	require.ErrorIs(t, err, ErrNoRule)
}

func TestUplinkRulesInOrder(t *testing.T) {
	u, err := NewUplink([]UplinkRule{
		{Filter: "vehicles/+/telemetry/#", Topic: "telemetry", Key: "${level:2}", Tag: "${level:4}"},
		{Filter: "vehicles/#", Topic: "vehicle-${level:3}"},
	})
	require.NoError(t, err)
	m, err := u.Map(&Publish{Topic: "vehicles/car-9/telemetry/gps", ClientID: "gw-1"})
	require.NoError(t, err)
	require.Equal(t, [3]string{"telemetry", "car-9", "gps"}, [3]string{m.Topic, m.ShardingKey, m.Tag})
	m, err = u.Map(&Publish{Topic: "vehicles/car-9/status", ClientID: "gw-1"})
	require.NoError(t, err)
	require.Equal(t, [3]string{"vehicle-status", "gw-1", ""}, [3]string{m.Topic, m.ShardingKey, m.Tag})
	_, err = u.Map(&Publish{Topic: "phones/p1", ClientID: "p1"})
	require.ErrorIs(t, err, ErrNoRule)

	_, rule, err := u.MapRule(&Publish{Topic: "vehicles/car-9/status", ClientID: "gw-1"})
	require.NoError(t, err)
	require.Equal(t, UplinkRule{Filter: "vehicles/#", Topic: "vehicle-${level:3}", Key: "${clientid}"}, rule)
	_, rule, err = u.MapRule(&Publish{Topic: "phones/p1", ClientID: "p1"})
	require.ErrorIs(t, err, ErrNoRule)
	require.Zero(t, rule)
}

// A traced downlink message's Ref carries its trace; an untraced one's (and
// one stored before tracing existed) is the bare message ID and reads as
// untraced.
func TestDownlinkRefCarriesTrace(t *testing.T) {
	id := core.NewCommitLogID(1, 42, 100)
	traceID := core.NewCommitLogID(1, 7, 100)
	tr := downTrace{id: traceID, topic: "commands"}
	for _, c := range []struct {
		name, ref string
		want      downTrace
	}{
		{"untraced", id.String(), downTrace{}},
		{"traced", tr.ref(id.String()), tr},
		{"bad trace ID", id.String() + "~zz~commands", downTrace{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			gotID, got := splitRef(c.ref)
			require.Equal(t, id.String(), gotID)
			require.Equal(t, c.want, got)
		})
	}
	require.Equal(t, id.String(), downTrace{}.ref(id.String()))
}

func TestUplinkRejectsBadRules(t *testing.T) {
	_, err := NewUplink([]UplinkRule{
		{Filter: "a/#/b", Topic: "x"},
		{Filter: "a", Topic: ""},
		{Filter: "a", Topic: "not valid!"},
		{Filter: "a", Topic: "${what}"},
	})
	require.ErrorIs(t, err, ErrBadRule)
	require.ErrorIs(t, err, ErrBadTemplate)
	for i := 1; i <= 4; i++ {
		require.ErrorContains(t, err, fmt.Sprintf("uplink rule %d", i))
	}
}

func TestReasonCodes(t *testing.T) {
	disk := fmt.Errorf("%w: %w", core.ErrStoreFailed, syscall.ENOSPC)
	require.Equal(t, engine.QuotaExceeded, reasonCode(disk))
	require.Equal(t, "disk_full", failureReason(disk))
	require.Equal(t, engine.PacketTooLarge, reasonCode(fmt.Errorf("x: %w", core.ErrMessageTooLarge)))
	require.Equal(t, engine.Result{Code: 0x95, Reason: "x: core: message too large", Disconnect: 0x95}, resultOf(fmt.Errorf("x: %w", core.ErrMessageTooLarge)))
	require.Equal(t, engine.UnspecifiedError, reasonCode(fmt.Errorf("%w: %w", core.ErrStoreFailed, errors.New("eio"))))
	require.Equal(t, "store_failed", failureReason(fmt.Errorf("%w: eio", core.ErrStoreFailed)))
	require.Equal(t, engine.TopicNameInvalid, reasonCode(core.ErrTopicNotFound))
	require.Equal(t, engine.Result{}, resultOf(nil))
	require.Len(t, resultOf(errors.New(string(make([]byte, 300)))).Reason, 200, "reason strings are bounded")
}

// FuzzParseTemplate: template parsing (config input) never panics, and a
// template that parses expands without panicking.
func FuzzParseTemplate(f *testing.F) {
	for _, s := range []string{"${clientid}", "${level:3}-x", "$$", "${", "${level:99}", "a${username}b"} {
		f.Add(s, "a/b/c")
	}
	f.Fuzz(func(t *testing.T, src, topic string) {
		tpl, err := parseTemplate(src)
		if err != nil {
			require.ErrorIs(t, err, ErrBadTemplate)
			return
		}
		_ = tpl.expand(&vars{clientID: "c", username: "u", topic: topic})
	})
}

func TestEventJSONMatchesEncodingJSON(t *testing.T) {
	at := time.Date(2026, 11, 29, 12, 0, 0, 123456789, time.UTC)
	for _, e := range []Event{
		{Event: EventConnected, ClientID: "car-7", Username: "fleet", Seq: 1, Time: at, Node: "gw-1", Remote: "1.2.3.4:5",
			Listener: "tcp", Proto: 4, Clean: true, Keepalive: 60},
		{Event: EventDisconnected, ClientID: "c\"\\<>&\x01\u2028é", Seq: 1 << 60, Time: at, Reason: ReasonLost, Error: "read: \xff\xfe"},
		{Event: EventTakeover, ClientID: "x", Time: at, OldRemote: "a:1"},
		// Every field, each number at its widest: the size hint holds it.
		{Event: EventTakeover, ClientID: "car-7", Username: "fleet", Seq: 1<<64 - 1, Time: at, Node: "gw-1",
			Remote: "[2001:db8::1]:65535", Listener: "tcp", Proto: 255, Clean: true, Keepalive: 65535,
			Reason: ReasonKeepalive, Error: "read: reset", OldRemote: "[2001:db8::2]:65535"},
	} {
		want, err := json.Marshal(&e)
		require.NoError(t, err)
		require.Equal(t, string(want), string(e.appendJSON(nil)))
		if escaped := bytes.ContainsRune(want, '\\'); !escaped {
			require.LessOrEqual(t, len(want), e.jsonSizeHint(), "jsonSizeHint is short for %s", want)
		}
	}
}

// FuzzEventJSON: the hand-written encoder writes what encoding/json writes.
func FuzzEventJSON(f *testing.F) {
	f.Add("car-7", "fleet", "read: connection reset")
	f.Add("\xff<\u2029>", "", "\x00")
	f.Fuzz(func(t *testing.T, id, user, detail string) {
		e := Event{Event: EventDisconnected, ClientID: id, Username: user, Error: detail, Seq: 7,
			Time: time.Unix(1764417600, 5).UTC()}
		want, err := json.Marshal(&e)
		require.NoError(t, err)
		require.Equal(t, string(want), string(e.appendJSON(nil)))
		if !bytes.ContainsRune(want, '\\') {
			require.LessOrEqual(t, len(want), e.jsonSizeHint())
		}
	})
}

// A message whose key is not the client ID is indexed by the client ID too.
func TestUplinkIndexesClientID(t *testing.T) {
	u, err := NewUplink([]UplinkRule{{Filter: "fleet/+/pos", Topic: "pos", Key: "${level:2}"}, {Filter: "#", Topic: "${level:1}"}})
	require.NoError(t, err)
	m, err := u.Map(&Publish{Topic: "fleet/truck-1/pos", ClientID: "gw-7"})
	require.NoError(t, err)
	require.Equal(t, "truck-1", m.ShardingKey)
	require.Equal(t, []string{"gw-7"}, m.Keys)
	m, err = u.Map(&Publish{Topic: "tel/x", ClientID: "car-1"})
	require.NoError(t, err)
	require.Equal(t, "car-1", m.ShardingKey)
	require.Empty(t, m.Keys, "the key is the client ID already")
}
