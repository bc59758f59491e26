// Package follow reads one queue of a broker from a group's committed
// offset for as long as a context lives: the loop behind every engine
// service that keeps its own work in a system topic and moves it on as it
// comes due (retry back-off levels, delayed-delivery levels).
//
// Queue.Run reads a batch, hands it to a step function, and commits the
// offset the step returns. It pauses on errors and on an empty queue until
// something arrives, skips a record that fails its checksum (reported and
// committed past), and reports messages that retention removed before they
// were handled. What is stored is the only state: a crash between a step's
// work and the commit repeats that work (at-least-once).
//
// Run is meant for one goroutine per queue; it returns when its context
// ends or the step says so.
package follow

import (
	"context"
	"errors"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core"
)

// Log field names.
const fieldOffset = "offset"

// Queue is one queue to follow and how.
type Queue struct {
	Broker core.Broker
	Topic  string
	Queue  int
	// Group is whose committed offset records the progress.
	Group string
	// Batch bounds the messages read at once.
	Batch int
	// Poll is the pause after a failure, and the longest wait on an empty
	// queue without an arrival.
	Poll time.Duration
	// Log gets one line per failure; Name says what the queue is in them
	// ("scheduled messages", "delayed copies").
	Log  zerolog.Logger
	Name string
}

// Step handles msgs (a batch in queue order) and returns the offset after
// the last one it finished, and false once ctx is done. It may use timer
// with Pause.
type Step func(ctx context.Context, timer *time.Timer, msgs []*core.StoredMessage) (next int64, ok bool)

// Run follows q until ctx ends or step returns false.
func (q Queue) Run(ctx context.Context, step Step) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()

	var offset int64
	for {
		o, err := q.Broker.CommittedOffset(ctx, q.Group, q.Topic, q.Queue)
		if err == nil || errors.Is(err, core.ErrNoCommittedOffset) {
			offset = o
			break
		}
		q.Log.Error().Err(err).Msg("read " + q.Name + " offset")
		if !Pause(ctx, timer, nil, q.Poll) {
			return
		}
	}
	for {
		arrivals := q.Broker.Arrivals(q.Topic) // before the read: no arrival is missed
		res, err := q.Broker.Read(ctx, core.ReadRequest{Topic: q.Topic, Queue: q.Queue, Offset: offset, MaxCount: q.Batch})
		if err != nil {
			var ce *core.CorruptError
			if errors.As(err, &ce) && ce.QueueOffset >= offset {
				q.Log.Error().Err(err).Int64(fieldOffset, ce.QueueOffset).Msg("corrupt " + q.Name + " skipped")
				offset = ce.QueueOffset + 1
				q.commit(ctx, offset)
				continue
			}
			if ctx.Err() != nil {
				return
			}
			q.Log.Error().Err(err).Int64(fieldOffset, offset).Msg("read " + q.Name)
			if !Pause(ctx, timer, nil, q.Poll) {
				return
			}
			continue
		}
		if res.Clamped && offset < res.Range.Min {
			q.Log.Error().Int64(fieldOffset, offset).Int64("min_offset", res.Range.Min).
				Msg(q.Name + " removed by retention before they were handled")
		}
		if len(res.Messages) == 0 {
			if res.NextOffset != offset {
				offset = res.NextOffset
				q.commit(ctx, offset)
			}
			if !Pause(ctx, timer, arrivals, q.Poll) {
				return
			}
			continue
		}
		next, ok := step(ctx, timer, res.Messages)
		if next > offset {
			offset = next
			q.commit(ctx, offset)
		}
		if !ok {
			return
		}
	}
}

func (q Queue) commit(ctx context.Context, offset int64) {
	if err := q.Broker.CommitOffset(ctx, q.Group, q.Topic, q.Queue, offset); err != nil && ctx.Err() == nil {
		q.Log.Error().Err(err).Int64(fieldOffset, offset).Msg("commit " + q.Name + " offset")
	}
}

// Pause waits for d, for wake (if not nil) or for ctx, on timer (stopped,
// and stopped again on return); it returns false once ctx is done.
func Pause(ctx context.Context, timer *time.Timer, wake <-chan struct{}, d time.Duration) bool {
	timer.Reset(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-wake:
		return true
	case <-timer.C:
		return true
	}
}
