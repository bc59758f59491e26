// Package mqtttopic is MQTT topic names and filters as the gateway's packages
// share them: filter validation, matching, and the gateway's own namespace
// ($ferrymq/), which the bridge, the session store and auth all keep apart
// from what devices may use.
package mqtttopic

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The gateway's namespace. No client may subscribe or publish under
// Internal; every client has the internal subscription P2P+<its client ID>,
// through which point-to-point commands reach it.
const (
	Internal = "$ferrymq/"
	P2P      = Internal + "p2p/"
)

// P2PTarget names the client a point-to-point topic is addressed to.
func P2PTarget(name string) (clientID string, ok bool) {
	id, ok := strings.CutPrefix(name, P2P)
	return id, ok && id != ""
}

// Unshare splits a shared subscription "$share/{group}/{filter}" into its
// group and filter (either may come back empty for a malformed one);
// shared is false, and filter f itself, for any other filter. The prefix
// is matched in any case (as mochi and EMQX match it): "$SHARE/g/x" is shared too.
func Unshare(f string) (group, filter string, shared bool) {
	const prefix = "$share/"
	if len(f) < len(prefix) || !strings.EqualFold(f[:len(prefix)], prefix) {
		return "", f, false
	}
	group, filter, _ = strings.Cut(f[len(prefix):], "/")
	return group, filter, true
}

// DelayedPrefix starts a delayed publish, EMQX's convention: a publish to
// "$delayed/{seconds}/{topic}" is handled as a publish to {topic} that takes
// effect {seconds} later.
const DelayedPrefix = "$delayed/"

// ErrBadDelayed is returned by Delayed for a topic that starts with
// DelayedPrefix but does not go on with a delay and a topic name.
var ErrBadDelayed = errors.New("mqtttopic: malformed $delayed topic")

// maxDelayedSeconds bounds the number Delayed accepts (about 136 years);
// callers bound the delay further.
const maxDelayedSeconds = 1<<32 - 1

// Delayed splits a delayed publish topic "$delayed/{seconds}/{topic}".
// ok is false (and err nil) for a topic without the prefix. A topic with the
// prefix but not decimal seconds (no sign), or without a valid topic name
// after them (not empty, no wildcard, not itself under '$'), is an error
// wrapping ErrBadDelayed.
func Delayed(name string) (topic string, delay time.Duration, ok bool, err error) {
	rest, ok := strings.CutPrefix(name, DelayedPrefix)
	if !ok {
		return "", 0, false, nil
	}
	secs, topic, found := strings.Cut(rest, "/")
	if !found {
		return "", 0, true, fmt.Errorf("%w: %q: want $delayed/{seconds}/{topic}", ErrBadDelayed, name)
	}
	if secs == "" || strings.TrimLeft(secs, "0123456789") != "" {
		return "", 0, true, fmt.Errorf("%w: %q: the delay must be whole seconds, not %q", ErrBadDelayed, name, secs)
	}
	n, err := strconv.ParseUint(secs, 10, 64)
	if err != nil || n > maxDelayedSeconds {
		return "", 0, true, fmt.Errorf("%w: %q: delay %s s out of range", ErrBadDelayed, name, secs)
	}
	if topic == "" || strings.ContainsAny(topic, "+#\x00") || topic[0] == '$' {
		return "", 0, true, fmt.Errorf("%w: %q: %q is not a topic name a device may publish to", ErrBadDelayed, name, topic)
	}
	return topic, time.Duration(n) * time.Second, true, nil
}

// ValidFilter checks an MQTT topic filter: not empty, no NUL, '#' only as
// the whole last level, '+' only as a whole level [MQTT-4.7.1-1]
// [MQTT-4.7.1-2] [MQTT-4.7.3-2].
func ValidFilter(f string) error {
	if f == "" || strings.ContainsRune(f, 0) {
		return fmt.Errorf("filter %q: must be non-empty, without NUL", f)
	}
	levels := strings.Split(f, "/")
	for i, l := range levels {
		if strings.Contains(l, "#") && (l != "#" || i != len(levels)-1) {
			return fmt.Errorf("filter %q: '#' must be the whole last level", f)
		}
		if strings.Contains(l, "+") && l != "+" {
			return fmt.Errorf("filter %q: '+' must be a whole level", f)
		}
	}
	return nil
}

// Match reports whether the topic name matches filter. Names starting with
// '$' are not matched by a filter starting with a wildcard [MQTT-4.7.2-1].
func Match(filter, name string) bool {
	if name != "" && name[0] == '$' && filter != "" && (filter[0] == '+' || filter[0] == '#') {
		return false
	}
	for {
		fl, frest, fmore := strings.Cut(filter, "/")
		if fl == "#" {
			return true
		}
		nl, nrest, nmore := strings.Cut(name, "/")
		if fl != "+" && fl != nl {
			return false
		}
		if !fmore || !nmore {
			if fmore && !nmore {
				return frest == "#" // "a/#" matches "a" [MQTT-4.7.1-2]
			}
			return fmore == nmore
		}
		filter, name = frest, nrest
	}
}
