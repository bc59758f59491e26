// Package brokertest is the conformance suite of core.Broker, shared by every
// engine as net/http/httptest is shared by HTTP tests: an engine's own test
// calls Run with a Factory that opens it, and every case below runs against
// that engine as a subtest.
//
//	func TestConformance(t *testing.T) {
//		brokertest.Run(t, brokertest.Factory{
//			Open:   func(t *testing.T) core.Broker { … },
//			Reopen: func(t *testing.T, b core.Broker) core.Broker { … },
//		})
//	}
//
// The cases assert the contract written in the doc comments of core.Broker,
// core.Message, core.ReadRequest and the core errors, never an engine's
// internals: no file names, no ID layout, no exact record sizes. Where the
// contract leaves a choice open (the exact size of a stored record, whether a
// failed batch left some messages stored) the suite accepts either.
//
// Each case opens a fresh engine of its own, waits with require.Eventually
// where it must wait, and never sleeps; the whole suite runs in a few seconds
// against the embedded engine. Cases run one after another, so a Factory need
// not support engines open side by side, except that the Get case opens a
// second engine to obtain an ID that is foreign to the first.
package brokertest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
)

// Factory opens the engine under test.
type Factory struct {
	// Open opens a fresh, empty engine for one subtest (a t.TempDir, a
	// server on port 0 — the factory's business) and registers its cleanup
	// with t.Cleanup. Required.
	Open func(t *testing.T) core.Broker
	// Reopen closes b (which the test may already have closed) and opens the
	// same engine again on the same data, as a restart does, returning the
	// new Broker; its cleanup is registered with t.Cleanup too. Optional:
	// when nil, the cases and checks that need a restart are skipped.
	Reopen func(t *testing.T, b core.Broker) core.Broker

	// Capabilities an engine may lack. Cases that need one are skipped with
	// a t.Skip that names it, or, where the contract says what an engine
	// without it does, check that instead. The zero value claims every
	// capability, so an engine that forgets to declare a lack fails rather
	// than skips. The embedded engine has them all.

	// NoDeleteTopic: the engine does not implement DeleteTopic.
	NoDeleteTopic bool
	// NoAutoCreate: the engine does not create topics on produce (both
	// engines' DisableAutoCreate option): Produce, ProduceBatch and
	// ProduceAsync to a topic that does not exist fail with
	// core.ErrTopicNotFound and create nothing. The AutoCreate case checks
	// that refusal instead of auto-creation; either way it fails, never
	// skips, when the engine does not do what the flag says.
	NoAutoCreate bool
	// NoResize: the engine does not implement ResizeTopic yet; the
	// ResizeTopic case checks that it refuses with errors.ErrUnsupported
	// and changes nothing.
	NoResize bool
	// SparseOffsets: queue offsets increase but are not dense: a topic's
	// queues share one sequence (the JetStream engine's stream sequence),
	// so other queues' messages take the offsets in between and a queue's
	// Range may span more offsets than it has messages. Cases that check
	// exact offsets and Ranges of many-queue topics then check what holds
	// for both: offsets strictly increasing per queue, Min ≤ offset < Max
	// for every stored message, Backlog counting exactly, Min == Max for an
	// empty queue (not 0 for a recreated topic). One-queue topics are dense
	// either way and keep their exact checks. The embedded engine's offsets
	// are dense: it leaves this false, and is held to the exact numbers.
	SparseOffsets bool
	// StoredAtSkew: SendResult.StoredAt is the producer's estimate of the
	// store time, within this much of the stored message's StoredAt (the
	// JetStream engine's acknowledgement carries no time: the stream stamps
	// the message, the producer notes when the acknowledgement came), and
	// store times never decrease per topic rather than across topics (each
	// stream stamps its own). Zero: they are equal, and monotonic across
	// topics, as the embedded engine's are.
	StoredAtSkew time.Duration
}

// Run runs every case of the suite against engines opened by f, each case as
// a subtest of t with a fresh engine.
func Run(t *testing.T, f Factory) {
	t.Helper()
	require.NotNil(t, f.Open, "brokertest: Factory.Open is required")
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(t, f) })
	}
}

// cases is the suite, in the order it runs.
var cases = []struct {
	name string
	run  func(t *testing.T, f Factory)
}{
	{"ProduceSendResult", testProduceSendResult},
	{"Sharding", testSharding},
	{"PerKeyOrderAsync", testPerKeyOrderAsync},
	{"ProduceBatch", testProduceBatch},
	{"ConcurrentProduce", testConcurrentProduce},
	{"Topics", testTopics},
	{"AutoCreate", testAutoCreate},
	{"Read", testRead},
	{"ReadQueues", testReadQueues},
	{"FindByKey", testFindByKey},
	{"OffsetAt", testOffsetAt},
	{"Backlog", testBacklog},
	{"CommittedOffsets", testCommittedOffsets},
	{"Arrivals", testArrivals},
	{"GetUnknownID", testGetUnknownID},
	{"Restart", testRestart},
	{"DeleteTopic", testDeleteTopic},
	{"ResizeTopic", testResizeTopic},
	{"Close", testClose},
	{"MaxBody", testMaxBody},
}

// wait bounds every wait of the suite: long enough for a loaded CI machine,
// short enough that a broken engine fails instead of hanging.
const (
	wait = 10 * time.Second
	tick = time.Millisecond
)
