package auth

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/ferrymq/ferrymq/gateway/mqtttopic"
)

// deviceACL confines each device to its own subtree.
func deviceACL(t testing.TB) *ACL {
	t.Helper()
	a, err := NewACL([]ACLRule{{
		Action:    ActionAllow,
		Publish:   []string{"devices/%c/#"},
		Subscribe: []string{"devices/%c/commands/#"},
	}})
	require.NoError(t, err)
	return a
}

type aclCase struct {
	name     string
	clientID string
	username string
	topic    string
	write    bool
	extra    [][]string
	want     bool
}

func runACLCases(t *testing.T, a *ACL, cases []aclCase) {
	t.Helper()
	for _, tc := range cases {
		op := "sub"
		if tc.write {
			op = "pub"
		}
		t.Run(fmt.Sprintf("%s/%s/%s", tc.name, op, tc.topic), func(t *testing.T) {
			require.Equal(t, tc.want, a.Check(tc.clientID, tc.username, tc.topic, tc.write, tc.extra...))
		})
	}
}

func TestACLDeviceConfinement(t *testing.T) {
	a := deviceACL(t)
	sub := func(topic string, want bool) aclCase {
		return aclCase{name: "car1", clientID: "car1", username: "u1", topic: topic, want: want}
	}
	pub := func(topic string, want bool) aclCase {
		return aclCase{name: "car1", clientID: "car1", username: "u1", topic: topic, write: true, want: want}
	}
	runACLCases(t, a, []aclCase{
		// subscriptions wider than the device's own command tree
		sub("#", false),
		sub("+", false),
		sub("+/+/#", false),
		sub("+/car1/commands/#", false),
		sub("devices/+/#", false),
		sub("devices/+/commands/#", false),
		sub("devices/#", false),
		sub("devices/car1/#", false),
		sub("devices/car1/+", false),
		sub("devices/car1/+/x", false),
		sub("devices/other/commands/x", false),
		sub("devices/other/commands/#", false),
		sub("$share/g/devices/other/#", false),
		sub("$SHARE/g/devices/other/#", false), // mochi reads the share prefix in any case
		sub("$share/g/devices/+/commands/#", false),
		sub("$share/g/#", false),
		sub("$SYS/#", false),
		sub("$SYS/broker/uptime", false),
		// its own command tree
		sub("devices/car1/commands/#", true),
		sub("devices/car1/commands", true), // "x/#" matches its parent "x"
		sub("devices/car1/commands/+", true),
		sub("devices/car1/commands/a/b", true),
		sub("devices/car1/commands/+/b/#", true),
		sub("$share/g/devices/car1/commands/+", true),
		sub("$share/g/devices/car1/commands/#", true),
		sub("$SHARE/g/devices/car1/commands/#", true),
		// malformed filters and shared subscriptions
		sub("", false),
		sub("devices/car1/commands/#/x", false),
		sub("devices/car1/commands/a+", false),
		sub("devices/car1/commands/#x", false),
		sub("devices/car1/commands/\x00", false),
		sub("devices/car1/commands/\xff", false),
		sub("$share/g", false),
		sub("$share/g/", false),
		sub("$share//devices/car1/commands/#", false),
		sub("$share/g+/devices/car1/commands/#", false),
		sub("$share/#/devices/car1/commands/#", false),
		// publishing
		pub("devices/car1/telemetry", true),
		pub("devices/car1", true),
		pub("devices/car1/a/b/c", true),
		pub("devices/other/x", false),
		pub("devices/car10/x", false),
		pub("devices/car/x", false),
		pub("devices", false),
		pub("$SYS/x", false),
		pub("$SYS/devices/car1/x", false),
		pub("x", false),
		pub("devices/car1/+", false), // a topic name has no wildcards
		pub("devices/car1/#", false),
		pub("", false),
		pub("devices/car1/commands/x", true), // publish rules are separate from subscribe rules
	})
}

func TestACLUnsafeIDsNeverMatchTemplates(t *testing.T) {
	a := deviceACL(t)
	for _, id := range []string{"a/b", "a+", "a#", "+", "#", "", "a\x00", "\xff", "$SYS", "$x"} {
		t.Run(fmt.Sprintf("%q", id), func(t *testing.T) {
			require.False(t, SafeForTemplates(id))
			require.False(t, a.TemplatesSafe(id, ""))
			for _, topic := range []string{
				"devices/" + id + "/x", "devices/a/b/x", "devices/a/x", "devices/a",
			} {
				require.False(t, a.Check(id, "", topic, true), "publish %q", topic)
				require.False(t, a.CheckRetained(id, "", topic), "retained %q", topic)
			}
			for _, filter := range []string{
				"devices/" + id + "/commands/#", "devices/a/b/commands/#", "devices/+/commands/#", "#",
			} {
				require.False(t, a.Check(id, "", filter, false), "subscribe %q", filter)
			}
		})
	}
	require.True(t, SafeForTemplates("car-1.é"))
	require.True(t, a.TemplatesSafe("car1", ""))
}

func TestACLDollarClientIDCannotReachSys(t *testing.T) {
	a, err := NewACL([]ACLRule{{Action: ActionAllow, Publish: []string{"%c/#"}, Subscribe: []string{"%c/#"}}})
	require.NoError(t, err)
	require.False(t, a.Check("$SYS", "", "$SYS/#", false))
	require.False(t, a.Check("$SYS", "", "$SYS/x", true))
	require.True(t, a.Check("car1", "", "car1/#", false))
}

func TestACLUserTemplate(t *testing.T) {
	a, err := NewACL([]ACLRule{{Action: ActionAllow, Subscribe: []string{"users/%u/%c-in/#"}}})
	require.NoError(t, err)
	require.True(t, a.UsesTemplates())
	runACLCases(t, a, []aclCase{
		{name: "own", clientID: "c1", username: "alice", topic: "users/alice/c1-in/#", want: true},
		{name: "other user", clientID: "c1", username: "bob", topic: "users/alice/c1-in/#", want: false},
		{name: "other client", clientID: "c2", username: "alice", topic: "users/alice/c1-in/#", want: false},
		{name: "suffix", clientID: "c1", username: "alice", topic: "users/alice/c1-inx/#", want: false},
		{name: "anonymous", clientID: "c1", username: "", topic: "users//c1-in/#", want: false},
		{name: "slash user", clientID: "c1", username: "a/b", topic: "users/a/b/c1-in/#", want: false},
	})
	require.True(t, a.TemplatesSafe("c1", ""), "an empty username is admitted, it is granted nothing")
	require.False(t, a.TemplatesSafe("c1", "a+b"))
}

func TestACLDefaultDenyAndEmpty(t *testing.T) {
	a, err := NewACL([]ACLRule{{Action: ActionAllow, Users: []string{"admin"}, Publish: []string{"#"}, Subscribe: []string{"#"}}})
	require.NoError(t, err)
	require.True(t, a.Check("c", "admin", "x/y", true))
	require.True(t, a.Check("c", "admin", "#", false))
	require.False(t, a.Check("c", "admin", "$SYS/x", true), "# does not reach $ topics")
	require.False(t, a.Check("c", "admin", "$SYS/#", false))
	require.False(t, a.Check("c", "bob", "x/y", true), "default deny")
	require.False(t, a.Check("c", "bob", "x/y", false))
	require.False(t, a.UsesTemplates())

	for name, empty := range map[string]*ACL{"no rules": mustACL(t), "nil": nil} {
		t.Run(name, func(t *testing.T) {
			require.True(t, empty.Check("c", "u", "#", false))
			require.True(t, empty.Check("c", "u", "$SYS/x", true))
			require.True(t, empty.CheckRetained("c", "u", "a/b"))
			require.True(t, empty.Check("a/b", "", "devices/x", true), "no rules, no templates")
			require.False(t, empty.Check("c", "u", "a/+", true), "malformed is always denied")
			require.False(t, empty.Check("c", "u", "a/#/b", false))
			require.False(t, empty.UsesTemplates())
			require.True(t, empty.TemplatesSafe("a/b", "#"))
		})
	}
}

func mustACL(t testing.TB, rules ...ACLRule) *ACL {
	t.Helper()
	a, err := NewACL(rules)
	require.NoError(t, err)
	return a
}

func TestACLClientsRestriction(t *testing.T) {
	a := mustACL(t, ACLRule{Action: ActionAllow, Clients: []string{"bridge-1"}, Subscribe: []string{"devices/+/telemetry"}})
	require.True(t, a.Check("bridge-1", "", "devices/+/telemetry", false))
	require.False(t, a.Check("bridge-2", "", "devices/+/telemetry", false))
}

func TestACLDenyBeforeAllow(t *testing.T) {
	a := mustACL(t,
		ACLRule{Action: ActionDeny, Publish: []string{"devices/admin/#"}, Subscribe: []string{"devices/admin/#"}},
		ACLRule{Action: ActionAllow, Publish: []string{"devices/#"}, Subscribe: []string{"devices/#"}},
	)
	runACLCases(t, a, []aclCase{
		{name: "deny", topic: "devices/admin/x", write: true, want: false},
		{name: "deny parent", topic: "devices/admin", write: true, want: false},
		{name: "allow", topic: "devices/x", write: true, want: true},
		// Overlapping the denied subtree is granted: deliveries from it are
		// refused one by one (the same check on the concrete topic).
		{name: "overlap #", topic: "devices/#", want: true},
		{name: "overlap +", topic: "devices/+/status", want: true},
		{name: "overlap shared", topic: "$share/g/devices/+", want: true},
		{name: "delivery from the denied subtree", topic: "devices/admin/status", want: false},
		{name: "inside", topic: "devices/admin/x", want: false},
		{name: "covered #", topic: "devices/admin/#", want: false},
		{name: "covered +", topic: "devices/admin/+", want: false},
		{name: "covered shared", topic: "$share/g/devices/admin/+", want: false},
		{name: "disjoint", topic: "devices/x/#", want: true},
		{name: "disjoint +", topic: "devices/x/+", want: true},
	})
	// Retained messages are checked on their concrete topic, so a
	// subscription allowed elsewhere never carries a denied retained one.
	require.False(t, a.CheckRetained("c", "", "devices/admin/state"))
	require.True(t, a.CheckRetained("c", "", "devices/x/state"))
}

func TestACLFirstMatchWins(t *testing.T) {
	a := mustACL(t,
		ACLRule{Action: ActionAllow, Subscribe: []string{"devices/#"}},
		ACLRule{Action: ActionDeny, Subscribe: []string{"devices/admin/#"}},
	)
	require.True(t, a.Check("c", "", "devices/admin/x", false), "an earlier allow decides")
}

func TestACLDenyTemplateFailsClosed(t *testing.T) {
	a := mustACL(t,
		ACLRule{Action: ActionDeny, Subscribe: []string{"devices/%c/secret"}},
		ACLRule{Action: ActionAllow, Subscribe: []string{"#"}},
	)
	require.True(t, a.Check("car1", "", "x", false))
	require.False(t, a.Check("car1", "", "devices/car1/secret", false))
	require.True(t, a.Check("car1", "", "devices/car2/secret", false))
	require.False(t, a.Check("a/b", "", "x", false), "an unsafe ID cannot be checked against the deny rule")

	u := mustACL(t,
		ACLRule{Action: ActionDeny, Subscribe: []string{"users/%u/private/#"}},
		ACLRule{Action: ActionAllow, Subscribe: []string{"users/#"}},
	)
	require.True(t, u.Check("c", "", "users/x", false), "anonymous: no subtree to shield")
	require.True(t, u.Check("c", "alice", "users/bob/private/x", false))
	require.False(t, u.Check("c", "alice", "users/alice/private/x", false))
	require.False(t, u.Check("c", "a+", "users/x", false), "unsafe username fails closed")
}

func TestACLExtraGrants(t *testing.T) {
	a := mustACL(t,
		ACLRule{Action: ActionDeny, Subscribe: []string{"secret/#"}},
		ACLRule{Action: ActionAllow, Subscribe: []string{"devices/%c/commands/#"}},
	)
	grants := []string{"fleet/%u/#", "bad/#/x", "%x/y", "broadcast"}
	runACLCases(t, a, []aclCase{
		{name: "templated", clientID: "car1", username: "f1", topic: "fleet/f1/cmd", extra: [][]string{grants}, want: true},
		{name: "templated wildcard", clientID: "car1", username: "f1", topic: "fleet/f1/#", extra: [][]string{grants}, want: true},
		{name: "other fleet", clientID: "car1", username: "f1", topic: "fleet/f2/cmd", extra: [][]string{grants}, want: false},
		{name: "plain", clientID: "car1", username: "f1", topic: "broadcast", extra: [][]string{grants}, want: true},
		{name: "second list", clientID: "car1", username: "f1", topic: "x", extra: [][]string{nil, {"x"}}, want: true},
		{name: "no grants", clientID: "car1", username: "f1", topic: "fleet/f1/cmd", want: false},
		{name: "rules still apply", clientID: "car1", username: "f1", topic: "devices/car1/commands/x", extra: [][]string{grants}, want: true},
		{name: "deny wins", clientID: "car1", username: "f1", topic: "secret/x", extra: [][]string{{"#"}}, want: false},
		{name: "unsafe username", clientID: "car1", username: "f/1", topic: "fleet/f/1/cmd", extra: [][]string{grants}, want: false},
		{name: "invalid grant ignored", clientID: "car1", username: "f1", topic: "bad/#/x", extra: [][]string{grants}, want: false},
		{name: "grant # not $", clientID: "car1", username: "f1", topic: "$SYS/x", extra: [][]string{{"#"}}, want: false},
	})
	require.True(t, a.CheckRetained("car1", "f1", "fleet/f1/x", grants))
	require.False(t, a.CheckRetained("car1", "f1", "fleet/f2/x", grants))
}

func TestACLCheckRetained(t *testing.T) {
	a := deviceACL(t)
	require.True(t, a.CheckRetained("car1", "", "devices/car1/commands/reboot"))
	require.True(t, a.CheckRetained("car1", "", "devices/car1/commands"))
	require.False(t, a.CheckRetained("car1", "", "devices/car2/commands/reboot"))
	require.False(t, a.CheckRetained("car1", "", "devices/car1/telemetry"), "read rules, not write rules")
	require.False(t, a.CheckRetained("car1", "", "devices/car1/commands/+"), "a topic name has no wildcards")
	require.False(t, a.CheckRetained("car1", "", "$share/g/devices/car1/commands/x"), "not stripped on a topic name")

	all := mustACL(t, ACLRule{Action: ActionAllow, Subscribe: []string{"#"}})
	require.True(t, all.CheckRetained("c", "", "a/b"))
	require.False(t, all.CheckRetained("c", "", "$SYS/broker/uptime"))
}

func TestNewACLValidation(t *testing.T) {
	_, err := NewACL([]ACLRule{
		{Action: "permit", Publish: []string{"a"}},
		{Action: ActionAllow},
		{Action: ActionAllow, Publish: []string{"a/#/b", "a/b+", ""}},
		{Action: ActionDeny, Subscribe: []string{"%x/a", "a/%", "$share/g/a", "a/%%c"}},
		{Action: ActionAllow, Publish: []string{"ok/%c/%u"}, Users: []string{""}, Clients: []string{""}},
		{Action: ActionAllow, Subscribe: []string{"a\x00", "\xff", strings.Repeat("a", maxFilterBytes+1)}},
	})
	require.ErrorIs(t, err, ErrInvalidACL)
	msg := err.Error()
	for _, want := range []string{
		`rule 0: action "permit"`,
		"rule 1: no publish or subscribe filters",
		`rule 2: publish filter "a/#/b"`,
		`rule 2: publish filter "a/b+"`,
		`rule 2: publish filter ""`,
		`rule 3: subscribe filter "%x/a"`,
		`rule 3: subscribe filter "a/%"`,
		`rule 3: subscribe filter "$share/g/a"`,
		`rule 3: subscribe filter "a/%%c"`,
		"rule 4: empty username",
		"rule 4: empty client ID",
		`rule 5: subscribe filter "a\x00"`,
		`rule 5: subscribe filter "\xff"`,
		"rule 5: subscribe filter \"aaaa",
	} {
		require.Contains(t, msg, want)
	}
	var joined interface{ Unwrap() []error }
	require.True(t, errors.As(err, &joined))
	require.Len(t, joined.Unwrap(), 14)
}

func TestACLFromYAML(t *testing.T) {
	load := func(t *testing.T, path string) ([]ACLRule, error) {
		t.Helper()
		f, err := os.Open(path)
		require.NoError(t, err)
		defer f.Close()
		dec := yaml.NewDecoder(f)
		dec.KnownFields(true)
		var rules []ACLRule
		return rules, dec.Decode(&rules)
	}
	rules, err := load(t, "testdata/acl.yaml")
	require.NoError(t, err)
	a, err := NewACL(rules)
	require.NoError(t, err)
	require.True(t, a.UsesTemplates())
	require.True(t, a.Check("car1", "", "devices/car1/telemetry", true))
	require.False(t, a.Check("car1", "", "devices/car1/config", true))
	require.True(t, a.Check("car1", "", "devices/car1/commands/#", false))
	require.True(t, a.Check("ops-1", "ops", "devices/+/telemetry", false))
	require.False(t, a.Check("ops-1", "ops", "devices/#", false), "no allow rule covers it")
	require.False(t, a.Check("ops-1", "ops", "devices/car1/config", false), "a delivery from the denied config topics")
	require.True(t, a.Check("ops-1", "ops", "$SYS/broker/#", false))
	require.False(t, a.Check("car1", "", "$SYS/broker/#", false))

	rules, err = load(t, "testdata/acl_invalid.yaml")
	require.NoError(t, err)
	_, err = NewACL(rules)
	require.ErrorIs(t, err, ErrInvalidACL)
	require.Contains(t, err.Error(), `action "alow"`)
	require.Contains(t, err.Error(), `"devices/%d/#"`)

	_, err = load(t, "testdata/acl_unknown_key.yaml")
	require.ErrorContains(t, err, "field subscribes not found")
}

// matchRef is a plain reference matcher, straight from the spec, that the
// filter algebra is checked against: does filter match topic name?
func matchRef(filter, topic string) bool {
	f, t := strings.Split(filter, "/"), strings.Split(topic, "/")
	if strings.HasPrefix(topic, "$") && (f[0] == "+" || f[0] == "#") {
		return false // [MQTT-4.7.2-1]
	}
	for i, l := range f {
		if l == "#" {
			return true
		}
		if i == len(t) || (l != "+" && l != t[i]) {
			return false
		}
	}
	return len(f) == len(t)
}

func TestCoversAndOverlaps(t *testing.T) {
	id := newIdent("car1", "alice")
	cases := []struct {
		f, q           string
		cover, overlap bool
	}{
		{"#", "#", true, true},
		{"#", "+", true, true},
		{"#", "a/b/c", true, true},
		{"#", "+/+/#", true, true},
		{"#", "$SYS/x", false, false},
		{"#", "$SYS/#", false, false},
		{"#", "+/$SYS", true, true}, // '$' matters only at the first level
		{"+/#", "#", true, true},
		{"+/#", "a", true, true},
		{"+/+/#", "#", false, true},
		{"+", "a", true, true},
		{"+", "+", true, true},
		{"+/x", "/x", true, true}, // an empty level
		{"+", "#", false, true},
		{"+", "a/b", false, false},
		{"+", "$SYS", false, false},
		{"+/x", "$SYS/x", false, false},
		{"$SYS/#", "$SYS/x", true, true},
		{"$SYS/#", "$SYS", true, true},
		{"$SYS/#", "#", false, false},
		{"$SYS/#", "+/#", false, false},
		{"$SYS/+", "$SYS/#", false, true},
		{"a/#", "a", true, true},
		{"a/#", "a/#", true, true},
		{"a/#", "#", false, true},
		{"a/#", "+", false, true},
		{"a/#", "+/b", false, true},
		{"a/#", "b/#", false, false},
		{"a/+", "a", false, false}, // two levels against one
		{"a", "a/#", false, true},
		{"a", "a/+", false, false},
		{"a/b", "a/b", true, true},
		{"a/b", "a/c", false, false},
		{"a/b", "a/+", false, true},
		{"a//b", "a/+/b", false, true},
		{"a/+/b", "a//b", true, true},
		{"devices/%c/#", "devices/car1/cmd/+", true, true},
		{"devices/%c/#", "devices/car1", true, true},
		{"devices/%c/#", "devices/+/cmd", false, true},
		{"devices/%c/#", "devices/car2/cmd", false, false},
		{"devices/%c/#", "devices/car10/cmd", false, false},
		{"devices/%c/#", "#", false, true},
		{"devices/%c/#", "+/+/#", false, true},
		{"devices/%c/commands/#", "devices/car1/#", false, true},
		{"u/%u-%c", "u/alice-car1", true, true},
		{"u/%u-%c", "u/alice-car", false, false},
		{"u/%u-%c", "u/+", false, true},
	}
	for _, tc := range cases {
		t.Run(tc.f+" vs "+tc.q, func(t *testing.T) {
			f, err := parseRuleFilter(tc.f)
			require.NoError(t, err)
			q, err := parseFilter(tc.q)
			require.NoError(t, err)
			require.Equal(t, tc.cover, covers(f.levels, q, &id), "covers")
			require.Equal(t, tc.overlap, overlaps(f.levels, q, &id), "overlaps")
		})
	}
}

func TestLevelEqual(t *testing.T) {
	id := newIdent("c1", "u1")
	for _, tc := range []struct {
		tmpl, s string
		want    bool
	}{
		{"a", "a", true},
		{"a", "b", false},
		{"%c", "c1", true},
		{"%c", "c1x", false},
		{"x%c", "xc1", true},
		{"%c%u", "c1u1", true},
		{"%c-%u-z", "c1-u1-z", true},
		{"%c-%u-z", "c1-u1-", false},
		{"%c", "", false},
		{"%", "%", false},
	} {
		require.Equal(t, tc.want, levelEqual(tc.tmpl, tc.s, &id), "%q vs %q", tc.tmpl, tc.s)
	}
}

// FuzzFilterCovers checks covers and overlaps against the reference matcher:
// if f covers q, every topic q matches f matches; if they do not overlap,
// no topic matches both.
func FuzzFilterCovers(f *testing.F) {
	for _, s := range [][3]string{
		{"#", "+/+/#", "a/b/c"},
		{"devices/car1/#", "devices/+/cmd", "devices/car2/cmd"},
		{"+/#", "#", "a"},
		{"#", "$SYS/#", "$SYS/x"},
		{"a/+", "a/#", "a"},
		{"a//b", "a/+/b", "a//b"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	id := newIdent("c", "u")
	f.Fuzz(func(t *testing.T, fs, qs, topic string) {
		if strings.Contains(fs, "%") {
			return // no templates here: the reference matcher has none
		}
		fl, err1 := parseFilter(fs)
		ql, err2 := parseFilter(qs)
		if err1 != nil || err2 != nil {
			return
		}
		cov, ovl := covers(fl, ql, &id), overlaps(fl, ql, &id)
		if cov {
			require.True(t, ovl, "covers without overlapping")
		}
		require.Equal(t, ovl, overlaps(ql, fl, &id), "overlaps is symmetric")
		if _, ok := parseTopicName(topic); !ok {
			return
		}
		mf, mq := matchRef(fs, topic), matchRef(qs, topic)
		if cov && mq {
			require.True(t, mf, "%q covers %q but misses %q", fs, qs, topic)
		}
		if mf && mq {
			require.True(t, ovl, "%q and %q both match %q", fs, qs, topic)
		}
		tl, _ := parseTopicName(topic)
		require.Equal(t, mf, covers(fl, tl, &id), "covers on a topic name is matching")
		require.Equal(t, mf, overlaps(fl, tl, &id), "overlaps on a topic name is matching")
	})
}

// FuzzACLCheck builds an ACL from arbitrary filters and checks arbitrary
// topics against it: it must never panic, and what it allows must be a
// well-formed request.
func FuzzACLCheck(f *testing.F) {
	f.Add("devices/%c/#", "devices/%c/commands/#", "secret/#", "car1", "u", "devices/car1/x", true)
	f.Add("devices/%c/#", "devices/%c/commands/#", "secret/#", "car1", "u", "$share/g/devices/car1/commands/+", false)
	f.Add("#", "#", "$SYS/#", "a/b", "", "$SYS/x", false)
	f.Add("%u/%c", "+/%u/#", "%c", "$SYS", "a+", "#", false)
	f.Fuzz(func(t *testing.T, pub, sub, deny, cid, user, topic string, write bool) {
		a, err := NewACL([]ACLRule{
			{Action: ActionDeny, Publish: []string{deny}, Subscribe: []string{deny}},
			{Action: ActionAllow, Publish: []string{pub}, Subscribe: []string{sub}},
		})
		if err != nil {
			return
		}
		ok := a.Check(cid, user, topic, write, []string{pub})
		retained := a.CheckRetained(cid, user, topic, []string{sub})
		_ = a.TemplatesSafe(cid, user)
		if ok && write || retained {
			_, valid := parseTopicName(topic)
			require.True(t, valid, "allowed a malformed topic name %q", topic)
		}
		if ok && !write {
			_, valid := parseSubscription(topic)
			require.True(t, valid, "allowed a malformed filter %q", topic)
		}
		if strings.HasPrefix(topic, "$") && !strings.Contains(pub+sub, "$") {
			// Only a rule naming a '$' topic literally can reach one.
			require.False(t, retained, "retained %q allowed", topic)
			if _, _, shared := mqtttopic.Unshare(topic); !shared {
				require.False(t, ok, "%q allowed", topic)
			}
		}
	})
}

func BenchmarkACLCheck(b *testing.B) {
	rules := make([]ACLRule, 0, 10)
	for i := range 9 {
		rules = append(rules, ACLRule{
			Action:    ActionAllow,
			Users:     []string{fmt.Sprintf("fleet-%d", i)},
			Publish:   []string{fmt.Sprintf("fleets/%d/%%u/%%c/#", i)},
			Subscribe: []string{fmt.Sprintf("fleets/%d/%%u/%%c/commands/#", i)},
		})
	}
	rules = append(rules, ACLRule{
		Action:    ActionAllow,
		Publish:   []string{"devices/%c/#"},
		Subscribe: []string{"devices/%c/commands/#"},
	})
	a := mustACL(b, rules...)
	b.Run("publish", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if !a.Check("car1", "driver", "devices/car1/telemetry/engine", true) {
				b.Fatal("denied")
			}
		}
	})
	b.Run("subscribe", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if !a.Check("car1", "driver", "$share/g/devices/car1/commands/+", false) {
				b.Fatal("denied")
			}
		}
	})
}

// overlaps (the reference for FuzzFilterCovers) reports whether some topic is
// matched by both filter f (which may
// hold templates, filled in from id) and filter q.
func overlaps(f, q []string, id *ident) bool {
	for i := 0; ; i++ {
		fDone, qDone := i == len(f), i == len(q)
		switch {
		case fDone && qDone:
			return true
		case fDone:
			return q[i] == "#" // "a/#" matches "a"
		case qDone:
			return f[i] == "#"
		}
		fl, ql := f[i], q[i]
		fWild := fl == "+" || fl == "#"
		qWild := ql == "+" || ql == "#"
		switch {
		case fWild && qWild:
			// both match any non-'$' level
		case fWild:
			if i == 0 && dollar(ql) {
				return false // [MQTT-4.7.2-1]
			}
		case qWild:
			// A template never expands to something starting with '$'
			// (SafeForTemplates), so the raw level tells.
			if i == 0 && dollar(fl) {
				return false
			}
		case !levelEqual(fl, ql, id):
			return false
		}
		if fl == "#" || ql == "#" {
			return true
		}
	}
}
