package engine

import "sync/atomic"

// metrics are the engine's counters, read by Stats (the gateway turns them
// into Prometheus metrics).
type metrics struct {
	connected        atomic.Int64
	accepted         atomic.Uint64
	connects         atomic.Uint64
	refused          atomic.Uint64
	admissionRefused atomic.Uint64
	authFailures     atomic.Uint64
	takeovers        atomic.Uint64
	protocolErrors   atomic.Uint64
	panics           atomic.Uint64
	packetsIn        atomic.Uint64
	bytesIn          atomic.Uint64
	bytesOut         atomic.Uint64
	published        atomic.Uint64
	refusedPublishes atomic.Uint64
	duplicates       atomic.Uint64
	paced            atomic.Uint64
	delivered        atomic.Uint64 // subscriptions a publish matched
	sent             atomic.Uint64 // PUBLISH packets written
	droppedSlow      atomic.Uint64 // QoS 0, write queue full
	droppedOffline   atomic.Uint64 // QoS 0 for an offline session
	droppedQueueFull atomic.Uint64 // QoS 1/2, session queue full
	droppedTooLarge  atomic.Uint64 // over the client's Maximum Packet Size
	wills            atomic.Uint64
	expired          atomic.Uint64
	disconnects      atomic.Uint64 // connections that ended after CONNACK
	connectTimeouts  atomic.Uint64 // sockets closed for sending no CONNECT in time
}

func (m *metrics) snapshot() map[string]uint64 {
	return map[string]uint64{
		"accepted": m.accepted.Load(), "connects": m.connects.Load(), "refused": m.refused.Load(),
		"admission_refused": m.admissionRefused.Load(), "auth_failures": m.authFailures.Load(),
		"takeovers": m.takeovers.Load(), "protocol_errors": m.protocolErrors.Load(), "panics": m.panics.Load(),
		"packets_in": m.packetsIn.Load(), "bytes_in": m.bytesIn.Load(), "bytes_out": m.bytesOut.Load(),
		"published": m.published.Load(), "refused_publishes": m.refusedPublishes.Load(),
		"duplicates": m.duplicates.Load(), "paced": m.paced.Load(), "delivered": m.delivered.Load(),
		"sent": m.sent.Load(), "dropped_slow": m.droppedSlow.Load(), "dropped_offline": m.droppedOffline.Load(),
		"dropped_queue_full": m.droppedQueueFull.Load(), "dropped_too_large": m.droppedTooLarge.Load(),
		"wills": m.wills.Load(), "sessions_expired": m.expired.Load(),
		"disconnects": m.disconnects.Load(), "connect_timeouts": m.connectTimeouts.Load(),
	}
}
