package bridge

import (
	"errors"
	"syscall"

	"github.com/ferrymq/ferrymq/core"
	"github.com/ferrymq/ferrymq/core/delay"
	"github.com/ferrymq/ferrymq/gateway/engine"
	"github.com/ferrymq/ferrymq/gateway/mqtttopic"
)

// resultOf is what the engine answers a publish the core took (nil) or
// refused. MQTT 5 gets the reason code in its PUBACK/PUBREC with the
// error as reason string (unless the client asked for none); MQTT 3 has no
// failure ack, so the engine disconnects the client without one and it
// publishes again [MQTT-4.4.0-1]. A message too large for the core gets
// DISCONNECT 0x95: a PUBACK cannot carry that code [MQTT-3.2.2-15].
func resultOf(err error) engine.Result {
	if err == nil {
		return engine.Result{}
	}
	reason := err.Error()
	if len(reason) > 200 {
		reason = reason[:200]
	}
	code := reasonCode(err)
	if code == engine.PacketTooLarge {
		return engine.Result{Code: code, Reason: reason, Disconnect: code}
	}
	return engine.Result{Code: code, Reason: reason}
}

// reasonCode is the MQTT 5 reason code for a publish the core refused.
func reasonCode(err error) engine.ReasonCode {
	switch {
	case errors.Is(err, core.ErrMessageTooLarge), errors.Is(err, core.ErrPropertiesTooLarge):
		return engine.PacketTooLarge // 0x95
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return engine.QuotaExceeded // 0x97
	case errors.Is(err, core.ErrTopicNotFound), errors.Is(err, core.ErrInvalidTopic), errors.Is(err, mqtttopic.ErrBadDelayed),
		errors.Is(err, delay.ErrDelayTooLong):
		return engine.TopicNameInvalid // 0x90
	case errors.Is(err, core.ErrInvalidMessage), errors.Is(err, core.ErrReadOnly):
		return engine.ImplementationSpecific // 0x83
	}
	return engine.UnspecifiedError // 0x80
}

// failureReason labels a refused publish in metrics.
func failureReason(err error) string {
	switch {
	case errors.Is(err, core.ErrMessageTooLarge), errors.Is(err, core.ErrPropertiesTooLarge):
		return "too_large"
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return "disk_full"
	case errors.Is(err, core.ErrStoreFailed):
		return "store_failed"
	case errors.Is(err, core.ErrClosed):
		return "closed"
	case errors.Is(err, core.ErrTopicNotFound), errors.Is(err, core.ErrInvalidTopic):
		return "topic"
	case errors.Is(err, core.ErrInvalidMessage):
		return "invalid_message"
	case errors.Is(err, core.ErrReadOnly):
		return "read_only"
	}
	return "other"
}
