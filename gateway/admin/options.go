package admin

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/group"
	"github.com/ferrymq/ferrymq/core/retry"
	"github.com/ferrymq/ferrymq/core/shadow"
	"github.com/ferrymq/ferrymq/gateway"
	"github.com/ferrymq/ferrymq/gateway/rpc"
	"github.com/ferrymq/ferrymq/session"
)

// Defaults and bounds.
const (
	// DefaultPage is the size of a page when the request gives no max.
	DefaultPage = 100
	// DefaultMaxPage is Options.MaxPage's default: a larger max is cut to it.
	DefaultMaxPage = 1000
	// DefaultMaxBodyBytes is Options.MaxBodyBytes's default.
	DefaultMaxBodyBytes = 64 << 10
	// DefaultRedrive is how many dead letters a redrive without max moves.
	DefaultRedrive = 100
	// MaxRedrive caps the max of one redrive; call again for more.
	MaxRedrive = 10_000
	// MaxQueues is the most queues POST /api/v1/topics creates a topic with
	// (the embedded engine's own limit).
	MaxQueues = 1024
	// PreviewBytes bounds the body of a dead letter and the payload of a
	// retained message shown in a listing; longer ones are cut (with
	// "truncated": true). GET /api/v1/messages/{id} has a dead letter whole.
	PreviewBytes = 1024
)

// EngineEmbedded is Options.Engine's default: the commit-log store in this
// process.
const EngineEmbedded = "embedded"

// Options configure the handler New returns. A zero field means its
// default; every dependency is optional, and the endpoints that need a
// missing one answer 501 with a code naming it.
type Options struct {
	// Broker serves the topic endpoints and reads dead letters: the store
	// (ferrymq serve's *store.Store). Nil: 501 store_disabled.
	Broker core.Broker
	// Groups serves the group endpoints (list, describe, lag, reset). Nil:
	// 501 groups_disabled.
	Groups *group.Coordinator
	// Retry redrives dead letters. Nil: 501 retry_disabled for redrive
	// (listing needs only Broker).
	Retry *retry.Service
	// Gateway serves the client, session and retained-message endpoints.
	// Nil: 501 mqtt_disabled.
	Gateway *gateway.Gateway
	// Calls serves POST /api/v1/devices/{id}/rpc, synchronous calls to
	// devices. Nil: 501 mqtt_disabled.
	Calls *rpc.Service
	// Sessions adds the session store's figures to GET /api/v1/node.
	Sessions *session.Store
	// Shadows serves /api/v1/devices/{id}/shadow. Nil: 501
	// shadows_disabled.
	Shadows *shadow.Service

	// Node names this node in GET /api/v1/node.
	Node string
	// Version is the build's version, shown in GET /api/v1/node.
	Version string
	// Engine names the storage engine; default EngineEmbedded.
	Engine string
	// Config is shown as "config" in GET /api/v1/node. It is marshalled
	// once, by New, with encoding/json, and must already be redacted: no
	// tokens, passwords or keys.
	Config any
	// Started is when the node started; default: when New was called.
	Started time.Time

	// AllowWrites lets every request that reaches the handler change
	// things (POST and DELETE). Leave it false when the handler is exposed
	// beyond loopback and use Authorize.
	AllowWrites bool
	// Authorize, when AllowWrites is false, decides whether a write may
	// proceed; it must not log or echo what it checks. BearerAuthorizer
	// checks the "Authorization: Bearer <token>" header. Nil with
	// AllowWrites false: the API is read-only (writes answer 403).
	Authorize func(*http.Request) bool

	// Logger receives one line per failed request and one per write; never
	// a header value, a body or a payload. Default: discard.
	Logger *zerolog.Logger
	// MaxPage caps the max of a listing; larger ones are cut to it.
	// Default 1000.
	MaxPage int
	// MaxBodyBytes bounds a request body (413 body_too_large beyond it).
	// Default 64 KiB.
	MaxBodyBytes int64
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// ErrBadOptions is returned by New for invalid Options; the error lists
// every problem.
var ErrBadOptions = errors.New("admin: invalid options")

func (o Options) withDefaults() Options {
	if o.Logger == nil {
		l := zerolog.Nop()
		o.Logger = &l
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Started.IsZero() {
		o.Started = o.Now()
	}
	if o.Engine == "" {
		o.Engine = EngineEmbedded
	}
	if o.MaxPage == 0 {
		o.MaxPage = DefaultMaxPage
	}
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	return o
}

// validate checks o and marshals Config.
func (o Options) validate() (json.RawMessage, error) {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if o.MaxPage < 0 {
		bad("max page %d: must be positive", o.MaxPage)
	}
	if o.MaxBodyBytes < 0 {
		bad("max body bytes %d: must be positive", o.MaxBodyBytes)
	}
	var cfg json.RawMessage
	if o.Config != nil {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(o.Config); err != nil {
			bad("config: %v", err)
		}
		cfg = bytes.TrimSpace(buf.Bytes())
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrBadOptions, errors.Join(errs...))
	}
	return cfg, nil
}

// BearerAuthorizer returns an Options.Authorize that accepts a request
// carrying "Authorization: Bearer <token>", compared in constant time. An
// empty token accepts nothing.
func BearerAuthorizer(token string) func(*http.Request) bool {
	if token == "" {
		return func(*http.Request) bool { return false }
	}
	want := []byte("Bearer " + token)
	return func(r *http.Request) bool {
		return subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) == 1
	}
}
