package jetstream

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// fences answers publishes to the subjects of epochs that ended.
//
// The stream itself is the fence: a resize removes the old epoch's
// subjects from it, so a node whose cache is stale cannot store a message
// under the old queue count. But a stream that stops listening to a
// subject does not answer a publish to it: on a single server the
// publisher's server answers "no responders" (which nats.go retries twice,
// 250 ms apart), and in a cluster a publish that another server forwarded
// to the stream's leader just before the leader's interest vanished is
// dropped, and the publisher waits for its acknowledgement until it times
// out (measured: a few per resize with two producers). So every engine
// that knows a topic was resized listens to its ended epochs' subjects, in
// one queue group, and answers each publish there at once with a
// JetStream error the producer recognises (fenceDescription): it learns
// the new epoch and publishes the message again.
//
// The resizing engine starts listening to the epoch it ends before the
// stream stops taking it (after its own publishes in flight were
// answered), so that no forwarded publish goes unanswered, and holds its
// answers until the epoch's marker is stored: everything the stream took
// before the swap is stored below the marker by then. It reads what was
// stored on those subjects from its start to the marker, and never
// answers a copy of one of those messages: on a loaded cluster the
// stream's acknowledgement may reach the producer after the fence's
// answer, which the producer would take for a refusal and send the
// message again.
//
// Any other publish is answered only once live says the topic's stream
// does not take its subject now: a topic deleted and created again takes
// the subjects of its predecessor's first epoch again, and a fence of the
// predecessor still listening there must not answer what the new stream
// stores (it lets go of such a subject instead).
type fences struct {
	nc   *nats.Conn
	log  zerolog.Logger
	in   chan *nats.Msg
	live func(subject string) (bool, error)

	mu     sync.Mutex
	subs   map[string]*fenceSub // by subject pattern
	closed bool
}

type fenceSub struct {
	sub  *nats.Subscription
	hold bool
	held []*nats.Msg // publishes awaiting an answer while hold is set
	// stored holds the payload hashes of the messages the stream took on
	// these subjects while a resize swapped them: copies of those are
	// never answered.
	stored map[uint64]bool
}

// fenceQueue is the queue group of every engine's fence subscriptions.
const fenceQueue = "ferrymq-fence"

// fenceDescription is the description of the error a fence answers with.
const fenceDescription = "ferrymq: epoch ended"

// fenceReply is that answer: a JetStream publish acknowledgement carrying
// an error (nats.go hands it to the producer as a *jetstream.APIError).
var fenceReply = []byte(`{"error":{"code":409,"err_code":0,"description":"` + fenceDescription + `"}}`)

func newFences(nc *nats.Conn, log zerolog.Logger, live func(subject string) (bool, error)) *fences {
	return &fences{nc: nc, log: log, in: make(chan *nats.Msg, 4096), live: live, subs: map[string]*fenceSub{}}
}

// run answers fenced publishes until close (the engine's goroutine).
func (f *fences) run(done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case m := <-f.in:
			if m.Reply == "" {
				continue
			}
			f.mu.Lock()
			fs := f.subs[m.Sub.Subject]
			if fs != nil && fs.hold {
				fs.held = append(fs.held, m)
				f.mu.Unlock()
				continue
			}
			stored := fs != nil && fs.stored[payloadHash(m.Data)]
			f.mu.Unlock()
			if stored {
				continue // the stream took it: its acknowledgement answers
			}
			live, err := f.live(m.Subject)
			switch {
			case err != nil:
				// Unknown: no answer is better than a false refusal.
				f.log.Warn().Err(err).Str("subject", m.Subject).Msg("fenced publish not answered")
			case live:
				f.log.Info().Str("subject", m.Sub.Subject).Msg("fence let go: its stream takes the subjects again")
				f.drop(m.Sub.Subject)
			default:
				_ = f.nc.Publish(m.Reply, fenceReply)
			}
		}
	}
}

// ensure listens to pattern (an ended epoch's queue subjects).
func (f *fences) ensure(pattern string) error {
	_, err := f.add(pattern, false)
	return err
}

// hold listens to pattern, the epoch a resize is about to end, holding the
// answers until release. The caller must call release or drop.
func (f *fences) hold(pattern string) error {
	_, err := f.add(pattern, true)
	return err
}

func (f *fences) add(pattern string, hold bool) (*fenceSub, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, fmt.Errorf("jetstream: fence %s: engine closed", pattern)
	}
	if fs := f.subs[pattern]; fs != nil {
		fs.hold = fs.hold || hold
		return fs, nil
	}
	sub, err := f.nc.ChanQueueSubscribe(pattern, fenceQueue, f.in)
	if err != nil {
		return nil, fmt.Errorf("jetstream: fence %s: %w", pattern, err)
	}
	fs := &fenceSub{sub: sub, hold: hold}
	f.subs[pattern] = fs
	if hold {
		// The servers must know of this subscription before the stream
		// lets go of the subjects.
		f.mu.Unlock()
		err = f.nc.Flush()
		f.mu.Lock()
		if err != nil {
			return nil, fmt.Errorf("jetstream: fence %s: %w", pattern, err)
		}
	}
	return fs, nil
}

// release stops holding the answers on pattern: the next publishes are
// answered as on any fence, except copies of the messages in stored (the
// payload hashes of what the stream took on these subjects during the
// swap). answer says whether the held ones are answered now, but those
// in stored (the marker is stored: every message the stream took is
// below it), or dropped (the resize failed before its marker: an answer
// might beat an acknowledgement still on its way).
func (f *fences) release(pattern string, answer bool, stored map[uint64]bool) {
	f.mu.Lock()
	fs := f.subs[pattern]
	if fs == nil || !fs.hold {
		f.mu.Unlock()
		return
	}
	held := fs.held
	fs.hold, fs.held, fs.stored = false, nil, stored
	f.mu.Unlock()
	if !answer {
		return
	}
	for _, m := range held {
		if !stored[payloadHash(m.Data)] {
			_ = f.nc.Publish(m.Reply, fenceReply)
		}
	}
}

// payloadHash identifies a stored record: records carry their producer's
// nanosecond clock, so two messages rarely share one.
func payloadHash(b []byte) uint64 {
	h := fnv.New64a()
	_, _ = h.Write(b)
	return h.Sum64()
}

// drop stops listening to pattern: a resize that did not happen (the
// stream still takes those subjects, and the producers their answers).
func (f *fences) drop(pattern string) {
	f.mu.Lock()
	fs := f.subs[pattern]
	delete(f.subs, pattern)
	f.mu.Unlock()
	if fs != nil {
		_ = fs.sub.Unsubscribe()
	}
}

// close stops every subscription; run's goroutine is stopped by the
// engine.
func (f *fences) close() {
	f.mu.Lock()
	f.closed = true
	subs := f.subs
	f.subs = map[string]*fenceSub{}
	f.mu.Unlock()
	for _, fs := range subs {
		_ = fs.sub.Unsubscribe()
	}
}

// subjectsTTL is how long the fence trusts what it read of a stream's
// subjects when it refuses: a stale node's whole pipeline is answered from
// one read. Letting go is never decided on a cached read (takes).
const subjectsTTL = 100 * time.Millisecond

type streamSubjects struct {
	subjects []string // nil: no such stream
	at       time.Time
}

// takes reports whether the topic stream of a queue subject takes it now.
// A cached answer that it does is looked at again: the cache may be from
// before a resize swapped these very subjects out (a fence that let go on
// it would leave the publish unanswered, its producer to time out), and
// letting go is rare while refusing is not.
func (e *Engine) takes(subject string) (bool, error) {
	rest, _ := strings.CutPrefix(subject, subjectPrefix)
	tok, _, _ := strings.Cut(rest, ".")
	stream := streamPrefix + tok
	e.fenceMu.Lock()
	c, ok := e.fenceSeen[stream]
	e.fenceMu.Unlock()
	if ok && time.Since(c.at) <= e.subjectsTTL && !subjectsMatch(c.subjects, subject) {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(e.ctx, e.opts.Timeout)
	defer cancel()
	c = streamSubjects{at: time.Now()}
	s, err := e.js.Stream(ctx, stream)
	switch {
	case err == nil:
		c.subjects = s.CachedInfo().Config.Subjects
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return false, fmt.Errorf("jetstream: subjects of stream %s: %w", stream, err)
	}
	e.fenceMu.Lock()
	e.fenceSeen[stream] = c
	e.fenceMu.Unlock()
	return subjectsMatch(c.subjects, subject), nil
}

// subjectsMatch reports whether one of patterns matches subject.
func subjectsMatch(patterns []string, subject string) bool {
	for _, p := range patterns {
		if subjectMatch(p, subject) {
			return true
		}
	}
	return false
}

// subjectMatch reports whether a NATS subject matches a pattern ('*' one
// token, '>' the rest).
func subjectMatch(pattern, subject string) bool {
	for {
		p, prest, pmore := strings.Cut(pattern, ".")
		s, srest, smore := strings.Cut(subject, ".")
		switch {
		case p == ">":
			return s != ""
		case p != "*" && p != s:
			return false
		case !pmore || !smore:
			return pmore == smore
		}
		pattern, subject = prest, srest
	}
}
