package jetstream

import (
	"context"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core"
)

// Cancels keeps cancellations of delayed messages in a key-value bucket
// (delay.CancelStore): key = the original message ID in hex, value = its
// due time in unix nanoseconds. Entries expire after the bucket's max age,
// which must cover the longest delay plus how long a cancellation is kept
// after its due time. Whichever node holds the core lease reads them all
// when its delay service starts, so a cancellation outlives the node that
// took it.
type Cancels struct {
	kv  jetstream.KeyValue
	log zerolog.Logger
}

// DelayCancels opens (creating when missing) the bucket of cancellations;
// keep is the bucket's max age.
func (e *Engine) DelayCancels(ctx context.Context, keep time.Duration) (*Cancels, error) {
	rctx, cancel := e.reqCtx(ctx)
	defer cancel()
	kv, err := e.js.CreateOrUpdateKeyValue(rctx, jetstream.KeyValueConfig{
		Bucket: "ferrymq_delay_cancels", Description: "ferrymq cancelled delayed messages", History: 1,
		TTL: keep, Storage: jetstream.FileStorage, Replicas: e.opts.Replicas,
	})
	if err != nil {
		return nil, e.unavailable("delay cancels bucket", err)
	}
	return &Cancels{kv: kv, log: e.log}, nil
}

// Load implements delay.CancelStore. A malformed entry is skipped and
// logged: one damaged value must not keep the delay service from starting.
func (c *Cancels) Load(ctx context.Context) (map[core.MessageID]time.Time, error) {
	out := map[core.MessageID]time.Time{}
	l, err := c.kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("list cancellations: %w", err)
	}
	defer func() { _ = l.Stop() }()
	for k := range l.Keys() {
		id, err := core.ParseMessageID(k)
		if err != nil {
			continue // not ours
		}
		ent, err := c.kv.Get(ctx, k)
		if err != nil {
			continue // expired between list and get
		}
		ns, err := strconv.ParseInt(string(ent.Value()), 10, 64)
		if err != nil {
			c.log.Error().Str("key", k).Int("bytes", len(ent.Value())).Msg("malformed delay cancellation skipped")
			continue
		}
		out[id] = time.Unix(0, ns)
	}
	return out, nil
}

// Add implements delay.CancelStore.
func (c *Cancels) Add(ctx context.Context, id core.MessageID, due time.Time) error {
	if _, err := c.kv.Put(ctx, hex.EncodeToString(id[:]), []byte(strconv.FormatInt(due.UnixNano(), 10))); err != nil {
		return fmt.Errorf("store cancellation %s: %w", id, err)
	}
	return nil
}
