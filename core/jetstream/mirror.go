package jetstream

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/trace"
)

// Failover mode 2: a read-only standby (Options.MirrorOf). The engine
// connects to servers of its own JetStream domain (another cluster, reached
// from the primary through a leaf node) and keeps there a mirror of each of
// the primary's topic streams — same name, same sequences (so the same
// queue offsets and message IDs), same metadata (the topic's name, queue
// count and epochs) — and of its key index. JetStream copies the messages
// asynchronously; the engine looks every MirrorEvery for topics the
// primary created and for metadata it changed (a resize), creating or
// updating the mirrors. Reads, queries and committed offsets (its own
// bucket) work as on any engine, also while the primary is gone; every
// write — produce, topic creation, resize, deletion — fails with
// core.ErrReadOnly. A topic the primary deletes keeps its mirror: the
// standby is the copy that outlives the primary. The system topics of the
// standby's own consumption (retry, dead letters) are its own, not
// mirrors: a group consuming there sends messages back there.
//
// What a mirror does not have: messages the primary acknowledged and had
// not yet sent over when it was lost (the mirror's lag, which JetStream
// reports), and the arrivals of new messages (a long poll there sees new
// messages at its next read, not at once: consumers poll).

// startMirroring mirrors the primary's topics once, then every
// MirrorEvery until Close.
func (e *Engine) startMirroring(ctx context.Context) error {
	primary, err := jetstream.NewWithDomain(e.nc, e.opts.MirrorOf, jetstream.WithDefaultTimeout(e.opts.Timeout))
	if err != nil {
		return fmt.Errorf("jetstream: domain %s: %w", e.opts.MirrorOf, err)
	}
	if err := e.mirrorOnce(ctx, primary); err != nil {
		// The primary may be down: the standby serves what it has.
		e.log.Warn().Err(err).Str("domain", e.opts.MirrorOf).Msg("primary's topics not listed; serving the mirrors there are")
	}
	e.wg.Go(func() {
		t := time.NewTicker(e.opts.MirrorEvery)
		defer t.Stop()
		for {
			select {
			case <-e.ctx.Done():
				return
			case <-t.C:
			}
			if err := e.mirrorOnce(e.ctx, primary); err != nil && e.ctx.Err() == nil {
				e.log.Debug().Err(err).Str("domain", e.opts.MirrorOf).Msg("primary's topics not listed")
			}
		}
	})
	return nil
}

// mirrorOnce creates a mirror for each topic stream of the primary that
// has none here, and copies the metadata of those whose changed.
func (e *Engine) mirrorOnce(ctx context.Context, primary jetstream.JetStream) error {
	ctx, cancel := context.WithTimeout(ctx, 4*e.opts.Timeout)
	defer cancel()
	list := primary.ListStreams(ctx)
	var errs []error
	for info := range list.Info() {
		name := info.Config.Name
		topic := info.Config.Metadata[metaTopic]
		if !strings.HasPrefix(name, streamPrefix) || name == keysStream || topic == "" || !e.mirrored(topic) {
			continue
		}
		if err := e.mirrorStream(ctx, info); err != nil {
			errs = append(errs, err)
		}
	}
	if err := list.Err(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// mirrorStream makes the local mirror of the primary's stream src as src
// is: created, or its metadata brought up to date.
func (e *Engine) mirrorStream(ctx context.Context, src *jetstream.StreamInfo) error {
	md := ferrymqMetadata(src.Config.Metadata)
	s, err := e.js.Stream(ctx, src.Config.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		_, err = e.js.CreateStream(ctx, jetstream.StreamConfig{
			Name:        src.Config.Name,
			Description: "ferrymq topic " + md[metaTopic] + ", mirrored from domain " + e.opts.MirrorOf,
			Mirror:      &jetstream.StreamSource{Name: src.Config.Name, Domain: e.opts.MirrorOf},
			Storage:     jetstream.FileStorage,
			Replicas:    e.opts.Replicas,
			MaxAge:      src.Config.MaxAge,
			MaxBytes:    src.Config.MaxBytes,
			MaxMsgSize:  src.Config.MaxMsgSize,
			AllowDirect: true,
			Metadata:    md,
		})
		if err != nil {
			return fmt.Errorf("mirror of %s: %w", src.Config.Name, err)
		}
		e.log.Info().Str("topic", md[metaTopic]).Str("domain", e.opts.MirrorOf).Msg("topic mirrored")
		return nil
	case err != nil:
		return fmt.Errorf("mirror of %s: %w", src.Config.Name, err)
	}
	cfg := s.CachedInfo().Config
	if maps.Equal(ferrymqMetadata(cfg.Metadata), md) {
		return nil
	}
	if cfg.Metadata[metaCreated] != md[metaCreated] {
		// The primary's topic was deleted and created again: this mirror
		// holds its predecessor. Keep it (reads of the old incarnation),
		// and say so; an operator removes it to mirror the new one.
		e.log.Warn().Str("topic", md[metaTopic]).Msg("the primary's topic was created again: its mirror here holds the old one")
		return nil
	}
	cfg.Metadata = md
	if _, err := e.js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("mirror of %s: metadata: %w", src.Config.Name, err)
	}
	e.log.Info().Str("topic", md[metaTopic]).Msg("mirror's epochs brought up to date")
	return nil
}

// ferrymqMetadata is the part of stream metadata ferrymq wrote (the
// server adds keys of its own).
func ferrymqMetadata(md map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range md {
		if strings.HasPrefix(k, "ferrymq.") {
			out[k] = v
		}
	}
	return out
}

// mirrored reports whether topic is one a mirror engine mirrors (and
// refuses writes to): every topic but the system topics of the standby's
// own consumption — its groups' retry schedule, retry and dead-letter
// topics, delays — which are its own and writable; the trace topic is
// mirrored (a standby records no hops, and reads the primary's).
func (e *Engine) mirrored(topic string) bool {
	return e.opts.MirrorOf != "" && (!strings.HasPrefix(topic, "%") || topic == trace.Topic)
}

// readOnly is the error of a write to topic on a mirror engine (nil when
// the topic is writable here).
func (e *Engine) readOnly(topic, what string) error {
	if !e.mirrored(topic) {
		return nil
	}
	return fmt.Errorf("%w (%s; primary: domain %s)", core.ErrReadOnly, what, e.opts.MirrorOf)
}
