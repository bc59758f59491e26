package auth

import (
	"strings"
	"time"

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
	Logger   *zerolog.Logger
}

// Hook is auth on the gateway engine (engine.go): authentication at
// CONNECT, the ACL on every publish, subscription and delivery (retained
// messages and offline sessions' queues included), and quotas (per-IP
// admission before a byte is read, per-client rates, subscription and
// topic limits). It is safe for concurrent use.
type Hook struct {
	o   HookOptions
	log zerolog.Logger
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
