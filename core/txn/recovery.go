package txn

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"unique"

	"github.com/ferrymq/ferrymq/core"
)

// recoveryBatch is how many HalfTopic records recovery reads at once.
const recoveryBatch = 256

// recovered is what recovery found in HalfTopic.
type recovered struct {
	halves    map[core.MessageID]*half
	resolved  []resolvedHalf // in log order
	from, end int64          // the offsets read: [from, end)
}

type resolvedHalf struct {
	id  core.MessageID
	res resolution
}

// recover reads HalfTopic from TxnGroup's committed offset to its end. A
// half message makes a pending half, due StoredAt+FirstCheck; a check
// record sets its check count and moves its next check to the record's
// store time plus CheckInterval; a commit, rollback or discard record
// resolves it. Op records about halves below the committed offset (resolved
// long ago) only feed the memory of recent resolutions.
func (s *Service) recover(ctx context.Context) (*recovered, error) {
	off, err := s.b.CommittedOffset(ctx, TxnGroup, HalfTopic, 0)
	if errors.Is(err, core.ErrNoCommittedOffset) {
		off, err = 0, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s offset on %s: %w", TxnGroup, HalfTopic, err)
	}
	rec := &recovered{halves: make(map[core.MessageID]*half), from: off}
	s.committed = off
	for {
		res, err := s.b.Read(ctx, core.ReadRequest{Topic: HalfTopic, Queue: 0, Offset: off, MaxCount: recoveryBatch})
		if err != nil {
			var ce *core.CorruptError
			if errors.As(err, &ce) && ce.QueueOffset >= off {
				s.log.Error().Err(err).Int64(fieldOffset, ce.QueueOffset).Msg("corrupt transaction record skipped")
				off = ce.QueueOffset + 1
				continue
			}
			return nil, fmt.Errorf("recover %s at %d: %w", HalfTopic, off, err)
		}
		if res.Clamped && off < res.Range.Min {
			s.log.Warn().Int64(fieldOffset, off).Int64("min_offset", res.Range.Min).
				Msg("transaction records removed by retention before recovery")
		}
		for _, m := range res.Messages {
			s.replay(rec, m)
		}
		if len(res.Messages) == 0 && res.NextOffset == off {
			break
		}
		off = res.NextOffset
	}
	rec.end = off
	return rec, nil
}

// replay applies one HalfTopic record to rec.
func (s *Service) replay(rec *recovered, m *core.StoredMessage) {
	op := m.Properties[PropOp]
	if op == "" {
		topic := m.Properties[PropTopic]
		if topic == "" {
			s.log.Warn().Str(fieldID, m.ID.String()).Int64(fieldOffset, m.QueueOffset).
				Msg("record without transaction properties ignored")
			return
		}
		rec.halves[m.ID] = &half{
			id:        m.ID,
			group:     unique.Make(m.Properties[PropGroup]),
			topic:     unique.Make(topic),
			offset:    m.QueueOffset,
			storedAt:  m.StoredAt.UnixNano(),
			nextCheck: m.StoredAt.Add(s.opts.FirstCheck).UnixNano(),
			checkIdx:  -1, offsetIdx: -1, parkIdx: -1,
		}
		return
	}
	id, err := core.ParseMessageID(m.Properties[PropHalfID])
	if err != nil {
		s.log.Warn().Err(err).Str(fieldID, m.ID.String()).Int64(fieldOffset, m.QueueOffset).
			Msg("op record with a bad half ID ignored")
		return
	}
	h := rec.halves[id]
	if op == OpCheck {
		n, err := strconv.Atoi(m.Properties[PropChecks])
		if h != nil && err == nil && n >= h.checks {
			h.checks = n
			h.nextCheck = m.StoredAt.Add(s.opts.CheckInterval).UnixNano()
		}
		return
	}
	state, ok := opState[op]
	if !ok {
		s.log.Warn().Str(fieldID, m.ID.String()).Str("op", op).Msg("unknown op record ignored")
		return
	}
	delete(rec.halves, id)
	rec.resolved = append(rec.resolved, resolvedHalf{id: id, res: resolution{state: state, group: unique.Make(m.Properties[PropGroup])}})
}

// installLocked makes what recovery found the Service's state.
func (s *Service) installLocked(rec *recovered) {
	for _, r := range rec.resolved {
		s.recent.add(r.id, r.res)
	}
	for _, h := range rec.halves {
		if s.halves[h.id] == nil {
			s.addLocked(h)
		}
	}
	s.tail = max(s.tail, rec.end)
	s.log.Info().Int(fieldCount, len(rec.halves)).Int64("from", rec.from).Int64("end", rec.end).
		Msg("pending transactions recovered")
}
