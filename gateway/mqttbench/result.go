package mqttbench

import (
	"encoding/json"
	"math"
	"time"
)

// Result is what a run measured. Counts are exact; latencies are
// quantiles of log-bucketed histograms (within 0.4 %).
type Result struct {
	Mode    Mode      `json:"mode"`
	Label   string    `json:"label,omitempty"`
	Addr    string    `json:"addr"`
	Version int       `json:"mqtt_version"`
	Started time.Time `json:"started"`
	// Seconds is the length of the measured phase: publishing (first
	// publish to last acknowledgement) or connecting (first dial to last
	// CONNACK).
	Seconds float64 `json:"seconds"`

	// Pubsub mode.
	Publishers  int     `json:"publishers,omitempty"`
	Subscribers int     `json:"subscribers,omitempty"`
	QoS         byte    `json:"qos"`
	SizeBytes   int     `json:"size_bytes,omitempty"`
	Inflight    int     `json:"inflight,omitempty"`
	Rate        float64 `json:"rate,omitempty"` // asked for; 0: as fast as possible
	// Sent counts messages handed to the client library; Acked those
	// acknowledged (QoS 1: PUBACK, QoS 2: PUBCOMP) or, at QoS 0, written;
	// Failed those that failed or were still unacknowledged at the end.
	Sent   int64 `json:"sent"`
	Acked  int64 `json:"acked"`
	Failed int64 `json:"failed"`
	// AckedPerSec is Acked over Seconds.
	AckedPerSec float64 `json:"acked_per_sec"`
	// DrainSeconds is how long the receivers were waited for after the
	// last acknowledgement.
	DrainSeconds float64 `json:"drain_seconds"`
	// AckLatency is from publish to acknowledgement (QoS 1, 2 only).
	AckLatency *Latency `json:"ack_latency,omitempty"`
	// MQTT sums what the subscribers received (nil without subscribers);
	// Core is what the core consumer received (nil without one).
	MQTT *Delivery `json:"mqtt,omitempty"`
	Core *Delivery `json:"core,omitempty"`
	// SlowSubscribers never read (Options.SlowSubscribers);
	// SlowDisconnected of them the broker had closed by the end.
	SlowSubscribers  int `json:"slow_subscribers,omitempty"`
	SlowDisconnected int `json:"slow_disconnected,omitempty"`

	// Connect and idle modes.
	Conns *Conns `json:"conns,omitempty"`

	// Errors are the first few distinct errors seen (connection losses,
	// failed publishes, refused connections), each with how often.
	Errors []ErrorCount `json:"errors,omitempty"`
}

// Delivery is what one kind of receiver got.
type Delivery struct {
	// Expected: Acked (QoS 1, 2) or Sent (QoS 0) times the number of
	// receivers (subscribers; the core consumer group counts as one).
	Expected int64 `json:"expected"`
	// Received counts distinct messages per receiver; Duplicates the
	// copies beyond the first; Foreign payloads that were not sent by this
	// run (another tool, an earlier run, a corrupted payload).
	Received   int64 `json:"received"`
	Duplicates int64 `json:"duplicates"`
	Foreign    int64 `json:"foreign"`
	// Lost is max(0, Expected − Received).
	Lost int64 `json:"lost"`
	// LossPct is Lost as a percentage of Expected.
	LossPct float64 `json:"loss_pct"`
	// PerSec is Received over the time from the first publish to the last
	// receipt.
	PerSec float64 `json:"per_sec"`
	// Latency is from publish (the payload's send time) to receipt.
	Latency Latency `json:"latency"`
}

// Conns is what a connect or idle run measured.
type Conns struct {
	// Asked is Options.Conns; Connected got a CONNACK with return code 0
	// (and, with Subscribe, a SUBACK granting it); Failed did not (dial,
	// TLS or WebSocket error, refusal, timeout).
	Asked     int   `json:"asked"`
	Connected int64 `json:"connected"`
	Failed    int64 `json:"failed"`
	// PerSec is Connected over Seconds.
	PerSec float64 `json:"per_sec"`
	// Latency is from writing CONNECT to reading CONNACK.
	Latency Latency `json:"latency"`
	// Held is how many were open when holding began; Alive how many the
	// server had not closed when it ended (0 for connect mode without Hold).
	Held  int `json:"held"`
	Alive int `json:"alive"`
	// HeldSeconds is how long they were held.
	HeldSeconds float64 `json:"held_seconds"`
	// Sources is the number of local addresses the connections used.
	Sources int `json:"sources"`
	// Subscribe is the filter each connection subscribed to once
	// (Options.Subscribe, %i unreplaced) at SubQoS; "": none.
	Subscribe string `json:"subscribe,omitempty"`
	SubQoS    byte   `json:"sub_qos,omitempty"`
}

// ErrorCount is an error message and how often it was seen.
type ErrorCount struct {
	Err   string `json:"err"`
	Count int64  `json:"count"`
}

// Latency summarises a latency distribution.
type Latency struct {
	N                   uint64
	P50, P99, P999, Max time.Duration
}

func latencyOf(h *Histogram) Latency {
	return Latency{N: h.Count(), P50: h.Quantile(0.50), P99: h.Quantile(0.99), P999: h.Quantile(0.999), Max: h.Quantile(1)}
}

// latencyJSON is Latency on the wire, in microseconds as `bench core` does.
type latencyJSON struct {
	N      uint64  `json:"n"`
	P50us  float64 `json:"p50_us"`
	P99us  float64 `json:"p99_us"`
	P999us float64 `json:"p999_us"`
	MaxUs  float64 `json:"max_us"`
}

// MarshalJSON writes the quantiles in microseconds.
func (l Latency) MarshalJSON() ([]byte, error) {
	us := func(d time.Duration) float64 { return math.Round(float64(d)/1e1) / 1e2 }
	return json.Marshal(latencyJSON{N: l.N, P50us: us(l.P50), P99us: us(l.P99), P999us: us(l.P999), MaxUs: us(l.Max)})
}

// UnmarshalJSON reads what MarshalJSON wrote.
func (l *Latency) UnmarshalJSON(b []byte) error {
	var j latencyJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	d := func(us float64) time.Duration { return time.Duration(math.Round(us * 1e3)) }
	*l = Latency{N: j.N, P50: d(j.P50us), P99: d(j.P99us), P999: d(j.P999us), Max: d(j.MaxUs)}
	return nil
}
