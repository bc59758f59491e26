package delay

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/rs/zerolog"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/follow"
	"github.com/ferrymq/ferrymq/core/trace"
)

// runLevel moves one level's copies on: it reads the level's queue of
// DelayTopic from DelayGroup's committed offset, waits for the head's exit
// time (its DeliverAt), then stores every copy that has come out either in
// its topic (due) or in the next level, and commits past them. Exit times
// never decrease within a level l ≥ 1 (exit = entry + hold); in level 0 they
// may, by less than a tick, which delays a copy by at most that much.
func (s *Service) runLevel(ctx context.Context, level int) {
	log := s.log.With().Int(fieldLevel, level).Logger()
	q := follow.Queue{Broker: s.b, Topic: DelayTopic, Queue: level, Group: DelayGroup, Batch: s.opts.BatchSize,
		Poll: s.opts.PollInterval, Log: log, Name: "delayed copies"}
	q.Run(ctx, func(ctx context.Context, timer *time.Timer, msgs []*core.StoredMessage) (int64, bool) {
		return s.moveOn(ctx, log, timer, msgs)
	})
}

// moveOn stores msgs (one level's, in queue order) in their topic or next
// level as they come out. It returns the offset after the last one handled
// and false once ctx is done.
func (s *Service) moveOn(ctx context.Context, log zerolog.Logger, timer *time.Timer, msgs []*core.StoredMessage) (int64, bool) {
	next := msgs[0].QueueOffset
	for len(msgs) > 0 {
		if wait := s.opts.Clock.Until(msgs[0].DeliverAt); wait > 0 {
			if !follow.Pause(ctx, timer, nil, min(wait, s.opts.PollInterval)) {
				return next, false
			}
			continue // look at the clock again
		}
		now := s.opts.Clock.Now()
		out := 0
		for out < len(msgs) && !msgs[out].DeliverAt.After(now) {
			out++
		}
		if out == 0 {
			continue // the clock went back between the two readings
		}
		if !s.step(ctx, log, timer, msgs[:out], now) {
			return next, false
		}
		next = msgs[out-1].QueueOffset + 1
		msgs = msgs[out:]
	}
	return next, true
}

// step moves copies that have come out of their level: cancelled ones are
// dropped, due ones delivered, the others copied to their next level, all
// in one batch. It retries until the batch is stored and returns false once
// ctx is done.
func (s *Service) step(ctx context.Context, log zerolog.Logger, timer *time.Timer, msgs []*core.StoredMessage, now time.Time) bool {
	out := make([]*core.Message, 0, len(msgs))
	var fire []core.MessageID
	var hops, drops int
	s.mu.Lock()
	for _, m := range msgs {
		w, err := parseWaiting(m)
		if err != nil {
			log.Error().Err(err).Str(fieldID, m.ID.String()).Int64(fieldOffset, m.QueueOffset).Msg("malformed delayed copy skipped")
			continue
		}
		if _, ok := s.cancelled[w.id]; ok {
			drops++
			continue
		}
		level, exit, deliver := s.route(w.due, now)
		if deliver {
			s.firing[w.id] = struct{}{}
			fire = append(fire, w.id)
			out = append(out, deliverable(m, w))
			continue
		}
		hops++
		out = append(out, s.nextCopy(m, w, level, exit))
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		for _, id := range fire {
			delete(s.firing, id)
		}
		s.mu.Unlock()
	}()
	s.dropped.Add(int64(drops))
	if len(out) == 0 {
		return true
	}
	for {
		res, err := s.b.ProduceBatch(ctx, out)
		if err == nil {
			s.traceDelivered(out, res)
			break
		}
		if ctx.Err() != nil {
			return false
		}
		if permanent(err) {
			// One message can fail the batch (its topic was deleted, or it
			// no longer fits the store's limits): store them one by one
			// and give up only on the ones that fail for good.
			s.oneByOne(ctx, log, out)
			break
		}
		log.Error().Err(err).Int(fieldCount, len(out)).Msg("move delayed messages on")
		if !follow.Pause(ctx, timer, nil, s.opts.PollInterval) {
			return false
		}
	}
	s.delivered.Add(int64(len(fire)))
	s.moved.Add(int64(hops))
	for _, m := range out[:min(len(out), 8)] {
		if m.Topic != DelayTopic {
			log.Debug().Str(fieldTopic, m.Topic).Str(fieldID, m.Properties[PropID]).Msg("delayed message delivered")
		}
	}
	return true
}

// permanent reports whether a produce error will not go away by retrying.
func permanent(err error) bool {
	for _, e := range []error{core.ErrTopicNotFound, core.ErrInvalidTopic, core.ErrMessageTooLarge,
		core.ErrPropertiesTooLarge, core.ErrInvalidMessage} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func (s *Service) oneByOne(ctx context.Context, log zerolog.Logger, out []*core.Message) {
	for _, m := range out {
		for {
			_, err := s.b.Produce(ctx, m)
			if err == nil || ctx.Err() != nil {
				break
			}
			if permanent(err) {
				s.failed.Add(1)
				log.Error().Err(err).Str(fieldTopic, m.Topic).Str(fieldID, m.Properties[PropID]).
					Msg("delayed message could not be delivered: dropped")
				break
			}
			log.Error().Err(err).Msg("move delayed message on")
			t := time.NewTimer(s.opts.PollInterval)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
	}
}

// waiting is what a stored copy says about its message.
type waiting struct {
	id    core.MessageID // as the producer got it
	topic string
	due   time.Time
}

var errMalformedCopy = errors.New("delay: malformed delayed copy")

// parseWaiting reads a copy's properties; it never panics.
func parseWaiting(m *core.StoredMessage) (waiting, error) {
	w := waiting{id: m.ID, topic: m.Properties[PropTopic]}
	if v, ok := m.Properties[PropID]; ok {
		id, err := core.ParseMessageID(v)
		if err != nil {
			return w, errors.Join(errMalformedCopy, err)
		}
		w.id = id
	}
	if core.ValidateTopic(w.topic) != nil {
		return w, errMalformedCopy
	}
	due, err := time.Parse(time.RFC3339Nano, m.Properties[PropDue])
	if err != nil {
		return w, errors.Join(errMalformedCopy, err)
	}
	w.due = due
	return w, nil
}

// nextCopy is m copied into level: the original's ID becomes PropID and an
// index key, so that Cancel and queries find the newest copy once the first
// has aged out.
func (s *Service) nextCopy(m *core.StoredMessage, w waiting, level int, exit time.Time) *core.Message {
	c := m.Message
	c.Properties = maps.Clone(m.Properties)
	c.Properties[PropID] = w.id.String()
	if !slices.Contains(c.Keys, w.id.String()) {
		c.Keys = append(slices.Clip(c.Keys), w.id.String())
	}
	c.ShardingKey = s.keys[level]
	c.DeliverAt = exit
	return &c
}

// deliverable is the message its topic gets: sharding key restored, the
// waiting properties and index key removed, PropID naming the ID the
// producer got, DeliverAt the due time.
func deliverable(m *core.StoredMessage, w waiting) *core.Message {
	props := maps.Clone(m.Properties)
	key := props[PropShardingKey]
	delete(props, PropTopic)
	delete(props, PropDue)
	delete(props, PropShardingKey)
	props[PropID] = w.id.String()
	keys := m.Keys
	if i := slices.Index(keys, w.id.String()); i >= 0 {
		keys = slices.Delete(slices.Clone(keys), i, i+1)
	}
	return &core.Message{
		Topic:          w.topic,
		ShardingKey:    key,
		Tag:            m.Tag,
		Keys:           keys,
		Properties:     props,
		Body:           m.Body,
		DeliverAt:      w.due,
		BornAt:         m.BornAt,
		ReconsumeCount: m.ReconsumeCount,
	}
}

// traceDelivered records the "stored" hop of traced messages just delivered.
func (s *Service) traceDelivered(out []*core.Message, res []core.SendResult) {
	rec := s.opts.Trace
	if rec == nil {
		return
	}
	for i, m := range out {
		if m.Topic == DelayTopic || i >= len(res) || !rec.Enabled(m.Topic) {
			continue
		}
		id, err := core.ParseMessageID(m.Properties[PropID])
		if err != nil {
			continue
		}
		r := res[i]
		rec.Record(trace.Event{ID: id, Hop: trace.HopStored, At: r.StoredAt, Actor: "delay",
			Attrs: map[string]string{"topic": r.Topic, "queue": strconv.Itoa(r.Queue), "offset": strconv.FormatInt(r.QueueOffset, 10),
				"id": r.ID.String(), "due": m.DeliverAt.UTC().Format(time.RFC3339Nano)}})
	}
}
