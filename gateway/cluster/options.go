package cluster

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

// Defaults.
const (
	DefaultMaxPendingMessages = 65536
	DefaultMaxPendingBytes    = 64 << 20
	DefaultMaxSubjectBytes    = 1024
	DefaultCollateWait        = 2 * time.Millisecond
	DefaultRetryInterval      = 5 * time.Second
)

// maxChanMessages bounds the NATS client's buffer of delivered messages not
// yet read (Options.MaxPendingMessages, at most this).
const maxChanMessages = 8192

// Options configure a Router. A zero field means its default.
type Options struct {
	// Conn is the node's NATS connection (the JetStream engine's).
	// Required. The router does not close it.
	Conn *nats.Conn
	// Node names this gateway node: unique among the live nodes of the
	// cluster (the session store's node ID). Required.
	Node string
	// Prefix is the first token(s) of the subjects routed messages travel
	// under; DefaultPrefix when empty. Every node of a cluster uses the
	// same; plain tokens only ([A-Za-z0-9_-], dot-separated).
	Prefix string
	// LocalRetain: a retained message from another node is retained here
	// too, as a local one is. Leave it false when the nodes share retained
	// messages already — the session store on a key-value bucket does
	// (session.OpenKV) — or every node would write each one back (and
	// could put an older one back over a newer one). Either way the
	// message reaches this node's current subscribers with its retain flag
	// as MQTT says (RETAIN 1 only for retain-as-published subscriptions
	// [MQTT-3.3.1-12]).
	LocalRetain bool
	// MaxPendingMessages and MaxPendingBytes bound each of the router's
	// two queues — publishes waiting to go out to NATS, messages from
	// other nodes waiting to be delivered here — and MaxPendingMessages
	// the NATS client's buffer of messages not yet read (at most 8,192).
	// Past a bound a message is dropped and counted, never waited for.
	// Defaults DefaultMaxPendingMessages and DefaultMaxPendingBytes.
	MaxPendingMessages int
	MaxPendingBytes    int
	// MaxSubjectBytes: a topic whose subject would be longer is not routed
	// (counted), nor a filter whose subjects would be. Keep it well below
	// the servers' max_control_line (4 KiB by default, and a cluster route
	// adds queue names to the line). Default DefaultMaxSubjectBytes.
	MaxSubjectBytes int
	// CollateWait bounds how long a message from another node waits for
	// the other copies NATS may still hand this node — one per shared
	// group this node might serve — so that it is delivered here once.
	// Only messages on topics this node has shared subscribers for wait.
	// Default DefaultCollateWait.
	CollateWait time.Duration
	// RetryInterval is how often routes NATS refused to subscribe are
	// tried again. Default DefaultRetryInterval.
	RetryInterval time.Duration
	Logger        *zerolog.Logger
}

func (o Options) withDefaults() Options {
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if o.MaxPendingMessages == 0 {
		o.MaxPendingMessages = DefaultMaxPendingMessages
	}
	if o.MaxPendingBytes == 0 {
		o.MaxPendingBytes = DefaultMaxPendingBytes
	}
	if o.MaxSubjectBytes == 0 {
		o.MaxSubjectBytes = DefaultMaxSubjectBytes
	}
	if o.CollateWait == 0 {
		o.CollateWait = DefaultCollateWait
	}
	if o.RetryInterval == 0 {
		o.RetryInterval = DefaultRetryInterval
	}
	if o.Logger == nil {
		l := zerolog.Nop()
		o.Logger = &l
	}
	return o
}

func (o Options) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if o.Conn == nil {
		bad("no NATS connection")
	}
	if o.Node == "" {
		bad("node name is required")
	}
	if !validPrefix(o.Prefix) {
		bad("prefix %q: want dot-separated tokens of [A-Za-z0-9_-]", o.Prefix)
	}
	if o.MaxPendingMessages < 1 || o.MaxPendingBytes < 1 {
		bad("max pending messages %d and bytes %d: want at least 1", o.MaxPendingMessages, o.MaxPendingBytes)
	}
	if o.MaxSubjectBytes < len(o.Prefix)+2 {
		bad("max subject bytes %d: shorter than the prefix's subjects", o.MaxSubjectBytes)
	}
	if o.CollateWait < 0 || o.RetryInterval < 0 {
		bad("collate wait %v and retry interval %v must not be negative", o.CollateWait, o.RetryInterval)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrBadOptions, errors.Join(errs...))
	}
	return nil
}
