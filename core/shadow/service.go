package shadow

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/rs/zerolog"
)

// Options configure a Service. A zero field means its default.
type Options struct {
	Limits
	// Topic is the core topic every accepted change is appended to;
	// default DefaultTopic.
	Topic string
	// Logger gets one debug line per refused update, and the service's
	// warnings.
	Logger *zerolog.Logger
}

// Defaults of Options.
const (
	// DefaultTopic is the core topic of shadow events.
	DefaultTopic = "device-shadows"
	// MaxClientID bounds a client ID's length in bytes.
	MaxClientID = 256
	// maxRaces bounds how often one update reads the document again after
	// another writer changed it meanwhile.
	maxRaces = 32
)

func (o Options) withDefaults() Options {
	o.Limits = o.Limits.withDefaults()
	if o.Topic == "" {
		o.Topic = DefaultTopic
	}
	if o.Logger == nil {
		l := zerolog.Nop()
		o.Logger = &l
	}
	return o
}

func (o Options) validate() error {
	var errs []error
	if o.MaxBytes < 64 || o.MaxBytes > 1<<20 {
		errs = append(errs, fmt.Errorf("max bytes %d: want 64 to 1 MiB", o.MaxBytes))
	}
	if o.MaxDepth < 1 || o.MaxDepth > 32 {
		errs = append(errs, fmt.Errorf("max depth %d: want 1 to 32", o.MaxDepth))
	}
	if len(errs) > 0 {
		return fmt.Errorf("shadow: invalid options: %w", errors.Join(errs...))
	}
	return nil
}

// Backend keeps the latest event of every device and appends accepted
// changes to the topic: OpenLog's (the embedded engine), package bucket's
// (a JetStream key-value bucket). Safe for concurrent use.
type Backend interface {
	// Load returns id's latest event (nil: none) and its revision (0:
	// none); forChange says a change follows (a backend whose event may
	// lag its record appends a missing one first).
	Load(ctx context.Context, id string, forChange bool) (*Event, uint64, error)
	// Save makes ev id's latest if its revision is still rev (ErrStale
	// otherwise), durably, and gets it appended to the topic; once stored,
	// BackendEnv.Notify hears it (from Save, or for a backend shared by
	// nodes from its watcher, for every node's changes).
	Save(ctx context.Context, id string, rev uint64, ev *Event) error
	// Close stops what the backend started, after its last work.
	Close() error
}

// BackendEnv is what a Backend gets from the service it serves.
type BackendEnv struct {
	// Topic is the core topic of the events.
	Topic string
	// Notify tells the service's watchers of a stored change.
	Notify func(*Event)
	Log    zerolog.Logger
}

// ErrStale is returned by a Backend's Save when the device's record
// changed since its Load: the service reads it again and retries.
var ErrStale = errors.New("shadow: record changed meanwhile")

// Service serves device shadows over a Backend. Safe for concurrent use.
type Service struct {
	opts Options
	log  zerolog.Logger
	b    Backend

	wmu     sync.Mutex
	watches []func(*Event)

	ops    sync.RWMutex // held for reading by every request, for writing by Close: it waits for them
	closed bool         // guarded by ops

	cmu    sync.Mutex // guards counts
	counts map[RequestKind]int64
}

// RequestKind is a kind of request and its outcome, the key of
// Service.Requests.
type RequestKind struct {
	// Section is "desired", "reported" or "delete".
	Section string
	// Outcome is "accepted", "conflict", "too_large", "bad_request",
	// "not_found" or "error".
	Outcome string
}

// Log field names.
const (
	logComponent = "component"
	logClient    = "client"
	logSection   = "section"
	logOutcome   = "outcome"
	logVersion   = "version"
	logKey       = "key"
	logTopic     = "topic"
	logQueue     = "queue"
	logOffset    = "offset"
	logSnapshot  = "snapshot"
	logMin       = "min"
	logDevices   = "devices"
	logEvents    = "events"
)

// Outcomes of requests, the label of ferrymq_shadow_requests_total.
const (
	outcomeAccepted   = "accepted"
	outcomeConflict   = "conflict"
	outcomeTooLarge   = "too_large"
	outcomeBadRequest = "bad_request"
	outcomeNotFound   = "not_found"
	outcomeError      = "error"
)

// Open returns a service over the backend open returns; open gets the
// service's topic, logger and the function that tells its watchers of a
// change.
func Open(o Options, open func(BackendEnv) (Backend, error)) (*Service, error) {
	s, err := newService(o)
	if err != nil {
		return nil, err
	}
	if s.b, err = open(BackendEnv{Topic: s.opts.Topic, Notify: s.tell, Log: s.log}); err != nil {
		return nil, err
	}
	return s, nil
}

func newService(o Options) (*Service, error) {
	o = o.withDefaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	return &Service{opts: o, log: o.Logger.With().Str(logComponent, "shadow").Logger(), counts: map[RequestKind]int64{}}, nil
}

// Backend is the backend the service runs over.
func (s *Service) Backend() Backend { return s.b }

// Limits are the service's limits, with defaults filled in.
func (s *Service) Limits() Limits { return s.opts.Limits }

// Topic is the core topic of the service's events.
func (s *Service) Topic() string { return s.opts.Topic }

// Watch calls fn with every accepted change from now on — with a backend
// shared by nodes (package bucket), every node's, a change possibly
// twice. fn runs on the goroutine that stored the change (the embedded
// backend: under the device's lock, so one device's changes in order), or
// on the bucket watcher's: it must not block nor call the service.
func (s *Service) Watch(fn func(*Event)) {
	s.wmu.Lock()
	s.watches = append(s.watches, fn)
	s.wmu.Unlock()
}

func (s *Service) tell(ev *Event) {
	s.wmu.Lock()
	ws := s.watches
	s.wmu.Unlock()
	for _, fn := range ws {
		fn(ev)
	}
}

// ValidClientID checks a client ID: 1 to MaxClientID bytes of UTF-8.
func ValidClientID(id string) error {
	if id == "" || len(id) > MaxClientID || !utf8.ValidString(id) {
		return fmt.Errorf("%w: client ID of %d bytes: want 1 to %d bytes of UTF-8", ErrBadRequest, len(id), MaxClientID)
	}
	return nil
}

// Get returns the device's shadow, ErrNotFound if it has none.
func (s *Service) Get(ctx context.Context, id string) (*Document, error) {
	s.ops.RLock()
	defer s.ops.RUnlock()
	if s.closed {
		return nil, ErrClosed
	}
	if err := ValidClientID(id); err != nil {
		return nil, err
	}
	ev, _, err := s.b.Load(ctx, id, false)
	if err != nil {
		return nil, fmt.Errorf("shadow of %s: %w", id, err)
	}
	if ev.deleted() {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return ev.Shadow.clone(), nil
}

// Update applies u to the device's shadow, creating it if it has none,
// and returns the new document once it is stored and its event appended.
// Errors: ErrVersionConflict, ErrTooLarge, ErrBadRequest, ErrBusy,
// ErrClosed, or the backend's.
func (s *Service) Update(ctx context.Context, id string, u Update) (*Document, error) {
	ev, err := s.change(ctx, id, string(u.Section), func(cur *Event, now int64) (*Event, error) {
		return s.apply(cur, id, u, now)
	})
	if err != nil {
		return nil, err
	}
	return ev.Shadow.clone(), nil
}

// Delete removes the device's shadow (version, when not 0, must be its
// current one) and returns the version the delete got; the next update
// creates a new document that goes on from there. ErrNotFound if it has
// none.
func (s *Service) Delete(ctx context.Context, id string, version int64) (int64, error) {
	ev, err := s.change(ctx, id, "delete", func(cur *Event, now int64) (*Event, error) {
		if cur.deleted() {
			return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
		}
		if version != 0 && version != cur.Version {
			return nil, fmt.Errorf("%w: version %d named, the shadow of %s is at %d", ErrVersionConflict, version, id, cur.Version)
		}
		return &Event{ClientID: id, Op: OpDelete, Version: cur.Version + 1, Timestamp: now}, nil
	})
	if err != nil {
		return 0, err
	}
	return ev.Version, nil
}

// Refused counts a request refused before it reached the service (it did
// not decode) and logs it at debug level.
func (s *Service) Refused(id string, section Section, err error) {
	s.count(id, string(section), err)
}

// change runs one read-modify-write of id's record, again while other
// writers race it.
func (s *Service) change(ctx context.Context, id, label string, next func(cur *Event, now int64) (*Event, error)) (*Event, error) {
	ev, err := s.changeOnce(ctx, id, next)
	s.count(id, label, err)
	return ev, err
}

func (s *Service) changeOnce(ctx context.Context, id string, next func(cur *Event, now int64) (*Event, error)) (*Event, error) {
	s.ops.RLock()
	defer s.ops.RUnlock()
	if s.closed {
		return nil, ErrClosed
	}
	if err := ValidClientID(id); err != nil {
		return nil, err
	}
	for range maxRaces {
		cur, rev, err := s.b.Load(ctx, id, true)
		if err != nil {
			return nil, fmt.Errorf("shadow of %s: %w", id, err)
		}
		ev, err := next(cur, time.Now().UnixMilli())
		if err != nil {
			return nil, err
		}
		switch err := s.b.Save(ctx, id, rev, ev); {
		case err == nil:
			return ev, nil
		case errors.Is(err, ErrStale):
			continue
		default:
			return nil, fmt.Errorf("store shadow of %s: %w", id, err)
		}
	}
	return nil, fmt.Errorf("%w: shadow of %s", ErrBusy, id)
}

// apply returns the event of u applied to cur (nil: no shadow).
func (s *Service) apply(cur *Event, id string, u Update, now int64) (*Event, error) {
	if u.Section != Desired && u.Section != Reported {
		return nil, fmt.Errorf("%w: section %q", ErrBadRequest, u.Section)
	}
	var version int64
	doc := &Document{}
	if cur != nil {
		version = cur.Version
		if !cur.deleted() {
			doc = cur.Shadow.clone()
		}
	}
	if u.Version != 0 && u.Version != version {
		return nil, fmt.Errorf("%w: version %d named, the shadow of %s is at %d", ErrVersionConflict, u.Version, id, version)
	}
	if !u.Clear {
		if d := depth(u.Patch); d > s.opts.MaxDepth {
			return nil, fmt.Errorf("%w: nested %d deep, limit %d", ErrBadRequest, d, s.opts.MaxDepth)
		}
	}
	var state, meta map[string]any
	if !u.Clear {
		state, meta = doc.section(u.Section)
		state, meta = merge(state, meta, u.Patch, now)
	}
	doc.setSection(u.Section, state, meta)
	doc.Version, doc.Timestamp = version+1, now
	doc.withDelta()
	if n := doc.stateBytes(); n > s.opts.MaxBytes {
		return nil, fmt.Errorf("%w: the shadow of %s would be %d bytes, limit %d", ErrTooLarge, id, n, s.opts.MaxBytes)
	}
	return &Event{ClientID: id, Op: OpUpdate, Section: u.Section, Version: doc.Version, Timestamp: now, Shadow: doc}, nil
}

// count records a request's outcome; refused ones get a debug line.
func (s *Service) count(id, label string, err error) {
	outcome := outcomeOf(err)
	s.cmu.Lock()
	s.counts[RequestKind{Section: label, Outcome: outcome}]++
	s.cmu.Unlock()
	if err != nil {
		s.log.Debug().Err(err).Str(logClient, id).Str(logSection, label).Str(logOutcome, outcome).Msg("shadow request refused")
	}
}

func outcomeOf(err error) string {
	switch {
	case err == nil:
		return outcomeAccepted
	case errors.Is(err, ErrVersionConflict):
		return outcomeConflict
	case errors.Is(err, ErrTooLarge):
		return outcomeTooLarge
	case errors.Is(err, ErrBadRequest):
		return outcomeBadRequest
	case errors.Is(err, ErrNotFound):
		return outcomeNotFound
	default:
		return outcomeError
	}
}

// Requests counts the requests since Open by section and outcome (what
// ferrymq_shadow_requests_total exports).
func (s *Service) Requests() map[RequestKind]int64 {
	s.cmu.Lock()
	defer s.cmu.Unlock()
	return maps.Clone(s.counts)
}

// Close waits for the requests in flight, then closes the backend (the
// embedded one writes its snapshot, a bucket's stops its watcher). Safe
// to call twice.
func (s *Service) Close() error {
	s.ops.Lock()
	was := s.closed
	s.closed = true
	s.ops.Unlock()
	if was {
		return nil
	}
	return s.b.Close()
}
