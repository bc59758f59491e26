package auth

// ACL semantics
//
// An ACL is an ordered list of rules. Each rule has an action ("allow" or
// "deny"), a list of publish filters, a list of subscribe filters and,
// optionally, the usernames and client IDs it is limited to (empty = every
// client). Filters are MQTT topic filters in which "%c" stands for the
// client ID and "%u" for the username; no other "%" sequence is accepted,
// so a rule filter cannot hold a literal '%'.
//
// A check walks the rules in order. Rules limited to other users or clients
// are skipped; of the rest, the first one with a filter in the list for the
// direction being checked (Publish for a PUBLISH, Subscribe for a SUBSCRIBE
// or a retained message) that matches decides. If none matches, the
// credential's extra grants (for example JWT claims, templated the same
// way) are tried as allow filters; if none of those matches either, the
// request is denied. An ACL with no rules at all allows everything. A
// malformed topic or filter is always denied.
//
// What "matches" means:
//
//	PUBLISH topic T         a filter F matches when F matches T
//	SUBSCRIBE filter S      F matches when F covers S: every topic S can
//	                        match is matched by F
//	delivery of a message   as SUBSCRIBE with S = T (covering a topic name
//	on T (retained or not)  is matching it)
//
// A subscription is granted when the first rule covering its filter
// allows it, and every message is checked again on delivery against its
// concrete topic (the engine asks CanRead before it delivers or queues a
// message for a session, connected or not). So a deny rule
// shields its topics whatever the subscription: "deny devices/secret" then
// "allow devices/#" grants "devices/+" and "devices/#" — they receive
// every devices/… topic except devices/secret — while "devices/secret"
// itself (or "devices/secret/#" under "deny devices/secret/#") is refused
// in the SUBACK. Allow rules use cover for the same reason in reverse:
// "devices/car1/#" covers "devices/car1/cmd/+" but not "devices/+/cmd",
// "+/+/#" or "#". This is Mosquitto's model (grant, then filter on
// delivery). An earlier version refused any subscription merely
// overlapping a deny filter; that broke ordinary wildcards ("#" next to
// one denied topic) without protecting anything the delivery check does
// not.
//
// A shared subscription "$share/{group}/{filter}" is checked as {filter}
// [MQTT-4.8.2-1]; a malformed one is denied.
//
// Topics beginning with '$' are never matched by a filter whose first level
// is a wildcard [MQTT-4.7.2-1]: a rule "#" or "+/x" grants nothing under
// "$SYS/...". Such topics must be named literally in a rule.
//
// Templates are substituted only with an identity that is safe (see
// SafeForTemplates): non-empty, valid UTF-8, no '+', '#', '/' or NUL, and
// not beginning with '$' (a client ID "$SYS" would otherwise turn "%c/#"
// into "$SYS/#"). For an unsafe identity an allow filter using that
// template never matches, and a deny filter using it always matches (fail
// closed: a deny rule that cannot be evaluated denies). An empty identity
// (an anonymous client's username) is the exception: it has no subtree to
// grant or to shield, so templated filters, allow or deny, simply do not
// match it. The gateway should refuse at CONNECT any client for which
// TemplatesSafe reports false (it is true for every client when
// UsesTemplates is false).

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/ferrymq/ferrymq/gateway/mqtttopic"
)

// ErrInvalidACL is returned (joined, once per problem) by NewACL when a rule
// has an unknown action, an invalid filter, an unknown template or no
// filters at all.
var ErrInvalidACL = errors.New("auth: invalid acl rule")

// ACL actions.
const (
	ActionAllow = "allow"
	ActionDeny  = "deny"
)

// maxFilterBytes is the longest UTF-8 string MQTT can carry [MQTT-1.5.4].
const maxFilterBytes = 65535

// ACLRule is one rule of an ACL, as written in a configuration file.
type ACLRule struct {
	Action    string   `yaml:"action"`    // "allow" or "deny"
	Publish   []string `yaml:"publish"`   // topic filters, may use %c and %u
	Subscribe []string `yaml:"subscribe"` // topic filters, may use %c and %u
	Users     []string `yaml:"users"`     // rule applies only to these usernames; empty = all
	Clients   []string `yaml:"clients"`   // rule applies only to these client IDs; empty = all
}

// ACL decides which topics a client may publish to and subscribe to.
// It is immutable after NewACL and safe for concurrent use. A nil *ACL
// allows everything, like an ACL with no rules.
type ACL struct {
	rules     []aclRule
	templates bool
}

type aclRule struct {
	allow   bool
	pub     []aclFilter
	sub     []aclFilter
	users   []string
	clients []string
}

// aclFilter is a parsed filter. Wildcards are whole levels; templates
// ("%c", "%u") may appear anywhere inside a literal level.
type aclFilter struct {
	levels   []string
	usesCID  bool
	usesUser bool
}

func (f aclFilter) templated() bool { return f.usesCID || f.usesUser }

// NewACL validates rules and returns the ACL they describe. Every problem
// is reported, joined; each wraps ErrInvalidACL.
func NewACL(rules []ACLRule) (*ACL, error) {
	a := &ACL{rules: make([]aclRule, 0, len(rules))}
	var errs []error
	bad := func(i int, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: rule %d: %s", ErrInvalidACL, i, fmt.Sprintf(format, args...)))
	}
	for i, r := range rules {
		var ar aclRule
		switch r.Action {
		case ActionAllow:
			ar.allow = true
		case ActionDeny:
		default:
			bad(i, "action %q is neither %q nor %q", r.Action, ActionAllow, ActionDeny)
		}
		if len(r.Publish) == 0 && len(r.Subscribe) == 0 {
			bad(i, "no publish or subscribe filters")
		}
		for _, list := range []struct {
			name string
			in   []string
			out  *[]aclFilter
		}{{"publish", r.Publish, &ar.pub}, {"subscribe", r.Subscribe, &ar.sub}} {
			for _, s := range list.in {
				f, err := parseRuleFilter(s)
				if err != nil {
					bad(i, "%s filter %q: %v", list.name, s, err)
					continue
				}
				a.templates = a.templates || f.templated()
				*list.out = append(*list.out, f)
			}
		}
		for _, u := range r.Users {
			if u == "" {
				bad(i, "empty username in users")
			}
		}
		for _, c := range r.Clients {
			if c == "" {
				bad(i, "empty client ID in clients")
			}
		}
		ar.users = slices.Clone(r.Users)
		ar.clients = slices.Clone(r.Clients)
		a.rules = append(a.rules, ar)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return a, nil
}

// UsesTemplates reports whether any rule filter uses %c or %u. When it does,
// the gateway should refuse clients for which TemplatesSafe is false.
func (a *ACL) UsesTemplates() bool { return a != nil && a.templates }

// TemplatesSafe reports whether the rules' templates can be filled in for
// this client: false if a rule uses %c and the client ID is not
// SafeForTemplates, or uses %u and a non-empty username is not. An empty
// username is accepted here; "%u" rules simply grant it nothing.
func (a *ACL) TemplatesSafe(clientID, username string) bool {
	if a == nil || !a.templates {
		return true
	}
	for _, r := range a.rules {
		for _, list := range [][]aclFilter{r.pub, r.sub} {
			for _, f := range list {
				if f.usesCID && !SafeForTemplates(clientID) {
					return false
				}
				if f.usesUser && username != "" && !SafeForTemplates(username) {
					return false
				}
			}
		}
	}
	return true
}

// SafeForTemplates reports whether id may be substituted for %c or %u: it is
// non-empty, valid UTF-8, holds no '+', '#', '/' or NUL, and does not begin
// with '$'.
func SafeForTemplates(id string) bool {
	return id != "" && id[0] != '$' && utf8.ValidString(id) && !strings.ContainsAny(id, "+#/\x00")
}

// Check reports whether the client may publish to topic (write = true; topic
// is a topic name) or subscribe to topic (write = false; topic is a filter,
// possibly "$share/{group}/{filter}"). extra holds additional allow filters
// granted by the client's credential for this direction (Identity.Publish
// when write, Identity.Subscribe otherwise; templated like rule filters,
// invalid ones ignored); they are tried after the rules, before the default
// deny.
func (a *ACL) Check(clientID, username, topic string, write bool, extra ...[]string) bool {
	var req []string
	var ok bool
	if write {
		req, ok = parseTopicName(topic)
	} else {
		req, ok = parseSubscription(topic)
	}
	if !ok {
		return false
	}
	return a.check(newIdent(clientID, username), req, write, extra)
}

// CheckRetained reports whether a retained message on topic (a topic name)
// may be delivered to the client: the read ACL applied to that concrete
// topic. extra holds the credential's subscribe grants.
func (a *ACL) CheckRetained(clientID, username, topic string, extra ...[]string) bool {
	req, ok := parseTopicName(topic)
	if !ok {
		return false
	}
	return a.check(newIdent(clientID, username), req, false, extra)
}

// ident is the client's identity with the safety of each part worked out
// once per check.
type ident struct {
	cid, user         string
	cidSafe, userSafe bool
}

func newIdent(clientID, username string) ident {
	return ident{cid: clientID, user: username, cidSafe: SafeForTemplates(clientID), userSafe: SafeForTemplates(username)}
}

// usable reports whether f's templates can be filled in for id.
func (id *ident) usable(f aclFilter) bool {
	return (!f.usesCID || id.cidSafe) && (!f.usesUser || id.userSafe)
}

// unsafe reports whether f uses a template for a part of id that is present
// but not safe (as opposed to empty).
func (id *ident) unsafe(f aclFilter) bool {
	return (f.usesCID && id.cid != "" && !id.cidSafe) || (f.usesUser && id.user != "" && !id.userSafe)
}

func (a *ACL) check(id ident, req []string, write bool, extra [][]string) bool {
	if a == nil || len(a.rules) == 0 {
		return true
	}
	for i := range a.rules {
		r := &a.rules[i]
		if !r.appliesTo(id) {
			continue
		}
		list := r.sub
		if write {
			list = r.pub
		}
		for _, f := range list {
			if !id.usable(f) {
				if !r.allow && id.unsafe(f) {
					return false // deny fails closed
				}
				continue // allow never matches; nor does deny for an absent identity
			}
			// A publish or delivery topic has no wildcards: covering it is
			// matching it.
			if covers(f.levels, req, &id) {
				return r.allow
			}
		}
	}
	for _, grants := range extra {
		for _, s := range grants {
			f, err := parseRuleFilter(s)
			if err != nil || !id.usable(f) {
				continue
			}
			if covers(f.levels, req, &id) {
				return true
			}
		}
	}
	return false
}

func (r *aclRule) appliesTo(id ident) bool {
	if len(r.users) > 0 && !slices.Contains(r.users, id.user) {
		return false
	}
	if len(r.clients) > 0 && !slices.Contains(r.clients, id.cid) {
		return false
	}
	return true
}

// parseRuleFilter parses a rule or grant filter: a valid MQTT filter, not a
// shared subscription, whose only '%' sequences are "%c" and "%u".
func parseRuleFilter(s string) (aclFilter, error) {
	var f aclFilter
	if _, _, shared := mqtttopic.Unshare(s); shared {
		return f, errors.New("a rule cannot be a shared subscription")
	}
	levels, err := parseFilter(s)
	if err != nil {
		return f, err
	}
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			continue
		}
		if i+1 == len(s) || (s[i+1] != 'c' && s[i+1] != 'u') {
			return f, errors.New("only %c and %u templates are allowed")
		}
		if s[i+1] == 'c' {
			f.usesCID = true
		} else {
			f.usesUser = true
		}
		i++
	}
	f.levels = levels
	return f, nil
}

// parseFilter splits a topic filter into levels, checking it is valid:
// non-empty, at most 65535 bytes, valid UTF-8 without NUL, '+' and '#' only
// as whole levels and '#' only last [MQTT-4.7.1-1] [MQTT-4.7.1-2].
func parseFilter(s string) ([]string, error) {
	if s == "" {
		return nil, errors.New("empty filter") // [MQTT-4.7.3-1]
	}
	if len(s) > maxFilterBytes {
		return nil, errors.New("filter longer than 65535 bytes")
	}
	if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
		return nil, errors.New("filter is not valid UTF-8 without NUL") // [MQTT-1.5.4-1] [MQTT-1.5.4-2]
	}
	levels := strings.Split(s, "/")
	for i, l := range levels {
		if len(l) > 1 && strings.ContainsAny(l, "+#") {
			return nil, errors.New("wildcard inside a level")
		}
		if l == "#" && i != len(levels)-1 {
			return nil, errors.New("'#' not last")
		}
	}
	return levels, nil
}

// parseSubscription parses a SUBSCRIBE filter, stripping "$share/{group}/".
func parseSubscription(s string) ([]string, bool) {
	if group, filter, shared := mqtttopic.Unshare(s); shared {
		if group == "" || strings.ContainsAny(group, "+#") || filter == "" {
			return nil, false // [MQTT-4.8.2-1] [MQTT-4.8.2-2]
		}
		s = filter
	}
	levels, err := parseFilter(s)
	return levels, err == nil
}

// parseTopicName parses a PUBLISH topic name: a filter without wildcards
// [MQTT-3.3.2-2].
func parseTopicName(s string) ([]string, bool) {
	if strings.ContainsAny(s, "+#") {
		return nil, false
	}
	levels, err := parseFilter(s)
	return levels, err == nil
}

// covers reports whether every topic matched by filter q is also matched by
// filter f. f's literal levels may hold templates, filled in from id (the
// caller has checked they are usable); q is plain. When q has no wildcards
// this is "f matches the topic q".
func covers(f, q []string, id *ident) bool {
	for i := 0; ; i++ {
		if i < len(f) && f[i] == "#" {
			// "#" matches the rest, including nothing more (the parent)
			// [MQTT-4.7.1-2], but not a '$' topic from the first level.
			return i > 0 || !dollar(q[0])
		}
		if i == len(q) {
			return i == len(f)
		}
		if q[i] == "#" {
			// q matches every suffix, including the empty one (except at the
			// first level, where a topic needs at least one level). Only
			// "#" covers that, or "+/#" from the first level.
			return i == 0 && len(f) == 2 && f[0] == "+" && f[1] == "#"
		}
		if i == len(f) {
			return false
		}
		switch {
		case f[i] == "+":
			if i == 0 && dollar(q[0]) {
				return false // [MQTT-4.7.2-1]
			}
		case q[i] == "+":
			return false // a literal level cannot cover a wildcard
		case !levelEqual(f[i], q[i], id):
			return false
		}
	}
}

func dollar(level string) bool { return strings.HasPrefix(level, "$") }

// levelEqual reports whether the rule level tmpl, with %c and %u replaced by
// id's client ID and username, equals s. It does not allocate.
func levelEqual(tmpl, s string, id *ident) bool {
	for {
		i := strings.IndexByte(tmpl, '%')
		if i < 0 {
			return tmpl == s
		}
		if !strings.HasPrefix(s, tmpl[:i]) || i+1 == len(tmpl) {
			return false
		}
		s = s[i:]
		v := id.user
		if tmpl[i+1] == 'c' {
			v = id.cid
		}
		if !strings.HasPrefix(s, v) {
			return false
		}
		s = s[len(v):]
		tmpl = tmpl[i+2:]
	}
}
