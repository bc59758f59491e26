package bridge

import (
	"strings"

	"github.com/ferrymq/ferrymq/gateway/engine"
)

// Interceptor takes the publishes of a reserved topic space off the bridge:
// the gateway answers them itself ("$rpc/…" device answers to synchronous
// calls, "$shadow/…" device shadow requests). An intercepted publish is
// never stored in the core nor delivered to MQTT subscribers; the engine
// has checked it against the ACL before the bridge sees it. An
// Interceptor that is also an engine.Presence hears every connection come
// and go (the bridge being the engine's Presence), and one with an
// Attach(*engine.Engine) method gets the engine when the bridge does.
type Interceptor interface {
	// Prefix is the topic prefix taken, e.g. "$shadow/".
	Prefix() string
	// Intercept handles m from c. A zero Result acknowledges it (PUBACK /
	// PUBREC success); a Result with a code ≥ 0x80 refuses it (MQTT 5 gets
	// the code, an MQTT 3 client of QoS 1/2 is disconnected, QoS 0 is
	// dropped). It runs on the engine's work pool: it may block briefly,
	// never on the client itself.
	Intercept(c *engine.Client, m *engine.Message) engine.Result
}

// intercept hands m to the interceptor whose prefix its topic has, if any.
func (h *Hook) intercept(c *engine.Client, m *engine.Message) (engine.Decision, engine.Result, bool) {
	for _, i := range h.opts.Interceptors {
		if !strings.HasPrefix(m.Topic, i.Prefix()) {
			continue
		}
		res := i.Intercept(c, m)
		if res.Code >= 0x80 || res.Disconnect != 0 {
			if m.QoS == 0 {
				return engine.Consume, engine.Result{}, true
			}
			return engine.Refuse, res, true
		}
		return engine.Consume, engine.Result{}, true
	}
	return engine.Deliver, engine.Result{}, false
}
