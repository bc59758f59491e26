package bridge

import (
	"fmt"
	"strings"
)

// validFilter checks an MQTT topic filter: not empty, '#' only as the whole
// last level, '+' only as a whole level [MQTT-4.7.1-1] [MQTT-4.7.1-2].
func validFilter(f string) error {
	if f == "" {
		return fmt.Errorf("%w: empty filter", ErrBadRule)
	}
	levels := strings.Split(f, "/")
	for i, l := range levels {
		if strings.Contains(l, "#") && (l != "#" || i != len(levels)-1) {
			return fmt.Errorf("%w: filter %q: '#' must be the whole last level", ErrBadRule, f)
		}
		if strings.Contains(l, "+") && l != "+" {
			return fmt.Errorf("%w: filter %q: '+' must be a whole level", ErrBadRule, f)
		}
	}
	return nil
}

// matchFilter reports whether topic matches filter. Topics starting with
// '$' are not matched by a filter starting with a wildcard [MQTT-4.7.2-1].
func matchFilter(filter, topic string) bool {
	if topic != "" && topic[0] == '$' && filter != "" && (filter[0] == '+' || filter[0] == '#') {
		return false
	}
	for {
		fl, frest, fmore := strings.Cut(filter, "/")
		if fl == "#" {
			return true
		}
		tl, trest, tmore := strings.Cut(topic, "/")
		if fl != "+" && fl != tl {
			return false
		}
		if !fmore || !tmore {
			if fmore && !tmore {
				// "a/#" matches "a" [MQTT-4.7.1-2]
				return frest == "#"
			}
			return fmore == tmore
		}
		filter, topic = frest, trest
	}
}
