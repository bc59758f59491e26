package jetstream

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core"
)

// indexer writes the index entries of acknowledged messages — one per key
// (sharding key and Keys) under "fmqk.<tok(T)>.<keytok>", holding the
// message's sequence — without holding back the produce's acknowledgement:
// the acker publishes them and moves on; the indexer's goroutine awaits
// them in order. FindByKey calls barrier first, so this node's produces are
// found as soon as they returned; another node's a moment later. An entry
// lost to a crash between the message's ack and the entry's leaves that
// message out of key lookups (it is still read, consumed and found by ID).
type indexer struct {
	js  jetstream.JetStream
	log zerolog.Logger

	q       chan []jetstream.PubAckFuture
	issued  atomic.Int64 // entries published
	settled atomic.Int64 // entries acknowledged or failed, in publish order
	failed  atomic.Int64

	mu      sync.Mutex
	changed chan struct{} // closed when settled moves
}

func newIndexer(js jetstream.JetStream, log zerolog.Logger) *indexer {
	return &indexer{js: js, log: log, q: make(chan []jetstream.PubAckFuture, 1024), changed: make(chan struct{})}
}

// add publishes the entries of p's messages (acker goroutine only).
func (x *indexer) add(p *pending, res []core.SendResult) {
	var futs []jetstream.PubAckFuture
	for i, m := range p.msgs {
		var seq [8]byte
		binary.BigEndian.PutUint64(seq[:], uint64(res[i].CommitLogOffset))
		done := map[string]bool{}
		for _, k := range append([]string{m.ShardingKey}, m.Keys...) {
			if k == "" || done[k] {
				continue
			}
			done[k] = true
			f, err := x.js.PublishMsgAsync(&nats.Msg{Subject: keySubject(p.ts[i].tok, k), Data: seq[:]})
			if err != nil {
				x.failed.Add(1)
				x.log.Warn().Err(err).Str("topic", p.ts[i].name).Msg("index entry not written: the message is not found by key")
				continue
			}
			futs = append(futs, f)
		}
	}
	if len(futs) > 0 {
		x.issued.Add(int64(len(futs)))
		x.q <- futs
	}
}

// run awaits the entries in order until the queue is closed and drained.
func (x *indexer) run() {
	for futs := range x.q {
		for _, f := range futs {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				x.failed.Add(1)
				x.log.Warn().Err(err).Msg("index entry not written: the message is not found by key")
			}
		}
		x.settled.Add(int64(len(futs)))
		x.mu.Lock()
		close(x.changed)
		x.changed = make(chan struct{})
		x.mu.Unlock()
	}
}

// barrier waits until every entry published before the call is settled.
func (x *indexer) barrier(ctx context.Context) error {
	want := x.issued.Load()
	for x.settled.Load() < want {
		x.mu.Lock()
		ch := x.changed
		x.mu.Unlock()
		if x.settled.Load() >= want {
			break
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("jetstream: waiting for index writes: %w", ctx.Err())
		}
	}
	return nil
}
