package jetstream

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// LeaseOptions configure an Election.
type LeaseOptions struct {
	// Name is what is elected (one key in the bucket), e.g. "core".
	Name string
	// Holder names this candidate (node name); shown to the others.
	Holder string
	// TTL is how long a lease lives without renewal: a holder that dies is
	// replaced within TTL plus one Retry. Default 10 s. Every candidate
	// must use the same TTL (it is the bucket's max age).
	TTL time.Duration
	// Retry is how often a candidate tries to take a free lease; default 1 s.
	Retry time.Duration
	// Bucket holds the leases; default "ferrymq_leases".
	Bucket string
	// OnChange is called (from the election's goroutine) with true when this
	// candidate becomes the holder and false when it stops being it. It
	// must return promptly — the lease is not renewed while it runs — so
	// slow work (starting services) belongs on a goroutine of the caller.
	OnChange func(held bool)
	// Eligible, when set, says whether this candidate should hold the
	// lease now (e.g. rendezvous hashing over the live nodes names it): it
	// tries to take the lease only while Eligible() is true, and a holder
	// for whom it turns false gives the lease up at its next renewal, so
	// the lease follows the placement. Nil: always eligible. Called from
	// the election's goroutine; it must return promptly.
	Eligible func() bool
	Logger   *zerolog.Logger
}

// Election keeps one candidate in the running for a lease kept in a
// key-value bucket whose entries expire after TTL. The holder renews its
// entry every TTL/3 with a revision-checked update, so two candidates never
// both succeed in holding it; a holder that cannot renew for 2/3 of the
// TTL gives it up (OnChange(false)) before the others can take it. A holder
// paused longer than that (GC, a frozen VM) may still act for a moment
// after another took over: leases fence time, not writes.
type Election struct {
	kv   jetstream.KeyValue
	opts LeaseOptions
	log  zerolog.Logger

	mu     sync.Mutex
	held   bool
	holder string // last known holder ("" unknown)

	resign chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
}

// Elect starts campaigning. Close stops it (giving up a held lease).
func (e *Engine) Elect(ctx context.Context, opts LeaseOptions) (*Election, error) {
	if opts.Name == "" || opts.Holder == "" {
		return nil, errors.New("jetstream: election needs a name and a holder")
	}
	if opts.TTL == 0 {
		opts.TTL = 10 * time.Second
	}
	if opts.Retry == 0 {
		opts.Retry = time.Second
	}
	if opts.Bucket == "" {
		opts.Bucket = "ferrymq_leases"
	}
	if opts.OnChange == nil {
		opts.OnChange = func(bool) {}
	}
	if opts.Logger == nil {
		opts.Logger = &e.log
	}
	rctx, cancel := e.reqCtx(ctx)
	defer cancel()
	kv, err := e.js.CreateOrUpdateKeyValue(rctx, jetstream.KeyValueConfig{
		Bucket: opts.Bucket, Description: "ferrymq leases", History: 1, TTL: opts.TTL,
		Storage: jetstream.FileStorage, Replicas: e.opts.Replicas,
	})
	if err != nil {
		return nil, e.unavailable("lease bucket", err)
	}
	el := &Election{kv: kv, opts: opts, done: make(chan struct{}), resign: make(chan struct{}, 1),
		log: opts.Logger.With().Str("lease", opts.Name).Str("holder", opts.Holder).Logger()}
	// Learn who holds the lease now, so that Holder names it from the start
	// rather than "" until the first attempt to take it.
	if ent, err := kv.Get(rctx, leaseKey(opts.Name)); err == nil {
		el.holder = string(ent.Value())
	}
	var lctx context.Context
	lctx, el.cancel = context.WithCancel(context.Background())
	go el.run(lctx)
	return el, nil
}

// Held reports whether this candidate holds the lease.
func (el *Election) Held() bool {
	el.mu.Lock()
	defer el.mu.Unlock()
	return el.held
}

// Holder is the holder last seen ("" when unknown or free).
func (el *Election) Holder() string {
	el.mu.Lock()
	defer el.mu.Unlock()
	return el.holder
}

// Resign gives a held lease up now (OnChange(false)) so another candidate
// takes it, and waits a few Retry periods before campaigning again: for a
// holder that cannot do what the lease is for. No-op when not held.
func (el *Election) Resign() {
	select {
	case el.resign <- struct{}{}:
	default:
	}
}

// Close stops campaigning; a held lease is given up (OnChange(false)) and
// deleted so another candidate takes it at once.
func (el *Election) Close() error {
	el.cancel()
	<-el.done
	return nil
}

func (el *Election) run(ctx context.Context) {
	defer close(el.done)
	key := leaseKey(el.opts.Name)
	var rev uint64
	var renewed time.Time
	renew := el.opts.TTL / 3
	for first := true; ; first = false {
		wait := el.opts.Retry
		if el.Held() {
			wait = renew
		}
		if first {
			wait = 0 // try at once
		}
		giveUp := func(why string) {
			el.set(false, "")
			dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = el.kv.Delete(dctx, key, jetstream.LastRevision(rev))
			cancel()
			el.log.Info().Msg(why)
		}
		select {
		case <-ctx.Done():
			if el.Held() {
				giveUp("lease given up")
			}
			return
		case <-el.resign:
			if el.Held() {
				giveUp("lease resigned")
				select { // let another candidate take it
				case <-ctx.Done():
					return
				case <-time.After(5 * el.opts.Retry):
				}
			}
			continue
		case <-time.After(jitter(wait, rev)):
		}
		eligible := el.opts.Eligible == nil || el.opts.Eligible()
		if !el.Held() {
			if !eligible {
				el.learnHolder(ctx, key) // Holder names the current one all the same
				continue
			}
			r, err := el.try(ctx, key)
			if err == nil {
				rev, renewed = r, time.Now()
				el.set(true, el.opts.Holder)
				el.log.Info().Msg("lease taken")
			}
			continue
		}
		if !eligible {
			giveUp("lease handed over: another candidate is placed to hold it")
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, renew)
		r, err := el.kv.Update(rctx, key, []byte(el.opts.Holder), rev)
		cancel()
		switch {
		case err == nil:
			rev, renewed = r, time.Now()
		case errors.Is(err, jetstream.ErrKeyExists) || isWrongSequence(err):
			el.set(false, "")
			el.log.Warn().Err(err).Msg("lease lost: another holder")
		case time.Since(renewed) > 2*el.opts.TTL/3:
			el.set(false, "")
			el.log.Warn().Err(err).Msg("lease lost: not renewed in time")
		default:
			el.log.Debug().Err(err).Msg("lease renewal failed; retrying")
		}
	}
}

// learnHolder records who holds the lease now ("" when nobody does).
func (el *Election) learnHolder(ctx context.Context, key string) {
	rctx, cancel := context.WithTimeout(ctx, el.opts.Retry+time.Second)
	defer cancel()
	holder := ""
	ent, err := el.kv.Get(rctx, key)
	switch {
	case err == nil:
		holder = string(ent.Value())
	case !errors.Is(err, jetstream.ErrKeyNotFound):
		return // unknown: keep what is known
	}
	el.mu.Lock()
	el.holder = holder
	el.mu.Unlock()
}

// try takes the lease if it is free, else records who holds it.
func (el *Election) try(ctx context.Context, key string) (uint64, error) {
	rctx, cancel := context.WithTimeout(ctx, el.opts.Retry+time.Second)
	defer cancel()
	r, err := el.kv.Create(rctx, key, []byte(el.opts.Holder))
	if err == nil {
		return r, nil
	}
	el.learnHolder(ctx, key)
	return 0, fmt.Errorf("lease %s: %w", el.opts.Name, err)
}

func (el *Election) set(held bool, holder string) {
	el.mu.Lock()
	changed := el.held != held
	el.held, el.holder = held, holder
	el.mu.Unlock()
	if changed {
		el.opts.OnChange(held)
	}
}

// leaseKey is the bucket key of the lease name.
func leaseKey(name string) string { return "lease." + token(name) }

func isWrongSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// jitter spreads candidates' attempts by up to a tenth of d.
func jitter(d time.Duration, seed uint64) time.Duration {
	n := uint64(time.Now().UnixNano()) ^ seed
	return d + time.Duration(n%uint64(d/10+1))
}

// Holders lists the leases in bucket (default "ferrymq_leases") whose name
// starts with prefix: key → holder. Expired leases are gone from it.
func (e *Engine) Holders(ctx context.Context, bucket, prefix string) (map[string]string, error) {
	if bucket == "" {
		bucket = "ferrymq_leases"
	}
	ctx, cancel := e.reqCtx(ctx)
	defer cancel()
	kv, err := e.js.KeyValue(ctx, bucket)
	if err != nil {
		return nil, e.unavailable("lease bucket", err)
	}
	want := leaseKey(prefix) // token() escapes byte by byte: a name's prefix is its key's prefix
	vals, err := values(ctx, kv, "lease.*", func(k string) bool { return strings.HasPrefix(k, want) })
	if err != nil {
		return nil, e.unavailable("list leases", err)
	}
	out := make(map[string]string, len(vals))
	for k, v := range vals {
		out[k] = string(v)
	}
	return out, nil
}

// values returns the values of kv's keys that match filter (a subject
// pattern) and that keep accepts; a key deleted or expired between the
// listing and its read is left out.
func values(ctx context.Context, kv jetstream.KeyValue, filter string, keep func(key string) bool) (map[string][]byte, error) {
	l, err := kv.ListKeysFiltered(ctx, filter)
	if err != nil {
		return nil, err
	}
	defer func() { _ = l.Stop() }()
	out := map[string][]byte{}
	for k := range l.Keys() {
		if !keep(k) {
			continue
		}
		if ent, err := kv.Get(ctx, k); err == nil {
			out[k] = ent.Value()
		}
	}
	return out, nil
}

// LeaseHolders is Holders by lease name: name → holder, for the leases in
// the default bucket whose name starts with prefix.
func (e *Engine) LeaseHolders(ctx context.Context, prefix string) (map[string]string, error) {
	byKey, err := e.Holders(ctx, "", prefix)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(byKey))
	for k, holder := range byKey {
		if name, ok := untoken(strings.TrimPrefix(k, "lease.")); ok {
			out[name] = holder
		}
	}
	return out, nil
}
