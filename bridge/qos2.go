package bridge

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/ferrymq/ferrymq/gateway/engine"
)

// QoS 2 exactly once into the core (docs/commands.md, "QoS 2: exactly once
// into the core"). The engine takes every inbound QoS 2 publish under a
// QoS2ID that it writes to the session store before the publish reaches
// the bridge; the bridge stores that ID with the message (PropQoS2ID). A
// crash after the core stored the message and before its PUBREC went out
// leaves the ID in the session, unanswered: after the restart the engine
// hands the client's resend over marked unsure, and the bridge looks in
// the core for a message of that client with that ID before it stores
// one. Found, the publish is answered as stored; not found (the crash came
// before the append), it is stored now.

// PropQoS2ID is the property holding the engine's QoS2ID of a bridged QoS
// 2 publish (decimal): with mqtt.clientid, it names the publish once and
// for all.
const PropQoS2ID = "mqtt.qos2_id"

// Bounds of the look for an unsure resend.
const (
	// qos2ClockSlack is how much earlier than its QoS2ID's time a message
	// may carry as its store time (another machine's clock: a remote core).
	qos2ClockSlack = 5 * time.Second
	// qos2Page and qos2MaxPages bound the messages of the client read.
	qos2Page     = 1024
	qos2MaxPages = 16
	// qos2LookTimeout bounds one look.
	qos2LookTimeout = 30 * time.Second
)

// produceQoS2 is produce for an unsure resend (engine.Message.QoS2Unsure):
// msg is stored unless a message of the client with its QoS2ID is stored
// already, in which case done gets that one. The look runs on its own
// goroutine, counted in h.produces (Drain waits for it) and bounded by
// qos2LookTimeout.
func (h *Hook) produceQoS2(clientID string, id uint64, msg *core.Message, tr *upTrace, done func(core.SendResult, error)) {
	h.produces.Add(1)
	go func() {
		defer h.produces.Done()
		ctx, cancel := context.WithTimeout(context.Background(), qos2LookTimeout)
		found, err := h.findQoS2(ctx, msg.Topic, clientID, msg.ShardingKey, id)
		if err == nil && found == nil && !msg.DeliverAt.IsZero() {
			// A delayed publish waits in the delay topic until it is due
			// (core/delay: its copies keep the message's keys and
			// properties).
			found, err = h.findQoS2ByKey(ctx, delay.DelayTopic, clientID, id)
		}
		cancel()
		switch {
		case err != nil:
			h.m.qos2Resends.WithLabelValues("error").Inc()
			done(core.SendResult{}, err)
		case found != nil:
			h.m.qos2Resends.WithLabelValues("stored").Inc()
			h.log.Debug().Str(logClient, clientID).Str("id", found.ID.String()).Msg("unsure qos 2 resend stored already; not stored again")
			done(core.SendResult{ID: found.ID, Topic: found.Topic, Queue: found.Queue, QueueOffset: found.QueueOffset,
				CommitLogOffset: found.CommitLogOffset, StoredAt: found.StoredAt}, nil)
		default:
			h.m.qos2Resends.WithLabelValues("not_stored").Inc()
			h.produce(msg, tr, done)
		}
	}()
}

// findQoS2ByKey returns the message of topic that clientID published under
// QoS2ID id, or nil. It reads the client's messages stored from the ID's
// time on (the client ID is always one of a bridged message's keys),
// page by page.
func (h *Hook) findQoS2ByKey(ctx context.Context, topic, clientID string, id uint64) (*core.StoredMessage, error) {
	want := strconv.FormatUint(id, 10)
	begin := time.Unix(0, int64(id)).Add(-qos2ClockSlack)
	seen := map[core.MessageID]bool{}
	for range qos2MaxPages {
		ms, err := h.core.FindByKey(ctx, topic, clientID, core.KeyQuery{Begin: begin, Max: qos2Page})
		if errors.Is(err, core.ErrTopicNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("look for qos 2 publish %s of %q in %s: %w", want, clientID, topic, err)
		}
		fresh := 0
		for _, sm := range ms {
			if seen[sm.ID] {
				continue
			}
			seen[sm.ID], fresh = true, fresh+1
			if sm.Properties[PropQoS2ID] == want && sm.Properties[PropClientID] == clientID {
				return sm, nil
			}
			if sm.StoredAt.After(begin) {
				begin = sm.StoredAt // the next page starts here (inclusive: seen skips repeats)
			}
		}
		if len(ms) < qos2Page || fresh == 0 {
			return nil, nil
		}
	}
	// Not found among the client's next qos2Page×qos2MaxPages messages:
	// stored again rather than refused for ever.
	h.log.Warn().Str(logClient, clientID).Str("topic", topic).Msg("qos 2 resend after a restart: look ended unfinished; stored again")
	return nil, nil
}

// findQoS2 looks by key first (findQoS2ByKey), then, where the core can,
// in the queues of the message's sharding key (every queue without one):
// the JetStream engine's key index may miss a message whose process was
// killed right after storing it.
func (h *Hook) findQoS2(ctx context.Context, topic, clientID, shardingKey string, id uint64) (*core.StoredMessage, error) {
	found, err := h.findQoS2ByKey(ctx, topic, clientID, id)
	if err != nil || found != nil {
		return found, err
	}
	qs, ok := h.core.(queueScanner)
	if !ok {
		return nil, nil
	}
	want := strconv.FormatUint(id, 10)
	begin := time.Unix(0, int64(id)).Add(-qos2ClockSlack)
	found, err = qs.scanKeyQueues(ctx, topic, shardingKey, begin, qos2Page*qos2MaxPages, func(sm *core.StoredMessage) bool {
		return sm.Properties[PropQoS2ID] == want && sm.Properties[PropClientID] == clientID
	})
	if err != nil {
		return nil, fmt.Errorf("look for qos 2 publish %s of %q in %s's queues: %w", want, clientID, topic, err)
	}
	return found, nil
}

// qos2Of returns m's QoS2ID, for a QoS 2 publish.
func qos2Of(m *engine.Message) uint64 {
	if m.QoS == 2 {
		return m.QoS2ID
	}
	return 0
}
