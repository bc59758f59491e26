package jetstream

import (
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"
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
// stream stops taking it, so that no forwarded publish goes unanswered,
// and holds its answers until the epoch's marker is stored: everything
// the stream took before the fence has been stored and acknowledged by
// then, so a late answer of ours to a message the stream took is ignored
// (the producer has its acknowledgement), never mistaken for a refusal.
type fences struct {
	nc  *nats.Conn
	log zerolog.Logger
	in  chan *nats.Msg

	mu     sync.Mutex
	subs   map[string]*fenceSub // by subject pattern
	closed bool
}

type fenceSub struct {
	sub  *nats.Subscription
	hold bool
	held []string // reply subjects awaiting an answer while hold is set
}

// fenceQueue is the queue group of every engine's fence subscriptions.
const fenceQueue = "ferrymq-fence"

// fenceDescription is the description of the error a fence answers with.
const fenceDescription = "ferrymq: epoch ended"

// fenceReply is that answer: a JetStream publish acknowledgement carrying
// an error (nats.go hands it to the producer as a *jetstream.APIError).
var fenceReply = []byte(`{"error":{"code":409,"err_code":0,"description":"` + fenceDescription + `"}}`)

func newFences(nc *nats.Conn, log zerolog.Logger) *fences {
	return &fences{nc: nc, log: log, in: make(chan *nats.Msg, 4096), subs: map[string]*fenceSub{}}
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
				fs.held = append(fs.held, m.Reply)
				f.mu.Unlock()
				continue
			}
			f.mu.Unlock()
			_ = f.nc.Publish(m.Reply, fenceReply)
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

// release answers the publishes held on pattern and answers the next ones
// at once.
func (f *fences) release(pattern string) {
	f.mu.Lock()
	fs := f.subs[pattern]
	if fs == nil {
		f.mu.Unlock()
		return
	}
	held := fs.held
	fs.hold, fs.held = false, nil
	f.mu.Unlock()
	for _, r := range held {
		_ = f.nc.Publish(r, fenceReply)
	}
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
