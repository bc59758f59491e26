package session

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Handover. A node's writes of a session are queued (kvwriter.go) and
// fenced by its owner record, so a claim by another node refuses those
// still on their way: a message this node queued for an offline session,
// acknowledged to its publisher a moment before the device connected
// elsewhere, would be lost with them. So before it claims a session held
// by another live process, a node asks that process to finish the
// session's writes made so far (a NATS request to the subject of its
// incarnation, answered once its lane is flushed) — the first half of
// EMQX's takeover, without its second (the old node buffering what is
// delivered to it during the claim itself: a message routed to the old
// node in the one round trip between the flush and the claim is refused
// there). A process that is gone has no responder: the claim goes on at
// once; one that does not answer in time costs Timeout, then the claim
// goes on.

// handoverWorkers bounds the requests answered at once.
const handoverWorkers = 32

// handoverSubject is where the process of incarnation inc answers.
func (k *kvBackend) handoverSubject(inc uint64) string {
	return fmt.Sprintf("ferrymq.session.%s.handover.%016x", k.bucket, inc)
}

// serveHandovers subscribes to this process's handover subject; the
// requests are answered until Close (owned by Store.wg).
func (k *kvBackend) serveHandovers() error {
	ch := make(chan *nats.Msg, 1024)
	sub, err := k.nc.ChanSubscribe(k.handoverSubject(k.inc), ch)
	if err != nil {
		return fmt.Errorf("%w: subscribe to handover requests: %w", ErrUnavailable, err)
	}
	if err := k.nc.Flush(); err != nil { // the subscription is known to the server
		_ = sub.Unsubscribe()
		return fmt.Errorf("%w: subscribe to handover requests: %w", ErrUnavailable, err)
	}
	s := k.s
	s.wg.Go(func() {
		defer func() { _ = sub.Unsubscribe() }()
		sem := make(chan struct{}, handoverWorkers)
		for {
			select {
			case <-s.stop:
				return
			case m := <-ch:
				select {
				case sem <- struct{}{}:
				case <-s.stop:
					return
				}
				s.wg.Go(func() {
					defer func() { <-sem }()
					k.answerHandover(m)
				})
			}
		}
	})
	return nil
}

// answerHandover flushes the writes of the session a request names, then
// answers (an empty reply: done; otherwise why not).
func (k *kvBackend) answerHandover(m *nats.Msg) {
	id := string(m.Data)
	ctx, cancel := context.WithTimeout(context.Background(), k.timeout)
	defer cancel()
	reply := []byte(nil)
	if err := k.s.Flush(ctx, id); err != nil {
		reply = []byte(err.Error())
		k.s.log.Warn().Err(err).Str(logClient, id).Msg("handover: the session's writes were not flushed")
	}
	_ = m.Respond(reply)
}

// askHandover asks the process that wrote owner record cur to finish its
// writes of session id; it returns when that one answered, is gone, or
// Timeout passed (ctx ending too). The claim goes on in every case.
func (k *kvBackend) askHandover(ctx context.Context, id string, cur jetstream.KeyValueEntry) {
	if cur == nil {
		return
	}
	o, err := decodeOwner(cur.Value())
	if err != nil || o.inc == k.inc {
		return
	}
	start := time.Now()
	rctx, cancel := k.requestCtx(ctx)
	defer cancel()
	r, err := k.nc.RequestWithContext(rctx, k.handoverSubject(o.inc), []byte(id))
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		// The process is gone: nothing of it is on its way.
	case err != nil:
		k.s.log.Warn().Err(err).Str(logClient, id).Str("from", o.node).Dur("after", time.Since(start)).
			Msg("handover: the node holding the session did not answer; claimed without it")
	case len(r.Data) > 0:
		k.s.log.Warn().Str(logClient, id).Str("from", o.node).Str("error", string(r.Data)).
			Msg("handover: the node holding the session could not flush it; claimed anyway")
	}
}
