package main

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"
)

// The torture run in CI: the binary under 60 s of mixed load with a
// SIGKILL every ~15 s, a full disk, cut devices and malformed packets; the
// checker must pass. scripts/torture.sh runs the 10-minute version.
func TestBinaryTorture(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary for a minute")
	}
	bin := buildBinary(t)
	o := defaultTortureOptions(t)
	o.bin = bin
	o.dir = t.TempDir()
	o.drain = 25 * time.Second
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel).With().Timestamp().Logger()
	rep, err := o.run(t.Context(), &log)
	require.NoError(t, err)
	var out bytes.Buffer
	require.NoError(t, writeTortureReport(&out, &rep))
	t.Logf("\n%s", out.String())
	require.True(t, rep.Passed, "the torture checks failed:\n%s", out.String())
	// The run did what it says: faults happened and traffic got through them.
	require.GreaterOrEqual(t, rep.Server.Kills, 2)
	require.Positive(t, rep.Uplink.Acked)
	require.Positive(t, rep.Downlink.Delivered)
	require.Positive(t, rep.Run.Disconnects)
	require.NotEmpty(t, rep.Run.Malformed)
}

// defaultTortureOptions are the flags' defaults.
func defaultTortureOptions(t *testing.T) *tortureOptions {
	t.Helper()
	o := &tortureOptions{}
	c := &cobra.Command{}
	o.AddFlags(c)
	require.NoError(t, c.Flags().Parse(nil))
	require.NoError(t, o.validate())
	return o
}

// goodObs is a run the checker must pass: two devices (one clean, one
// persistent), allowed duplicates, a lost QoS 0 message, commands
// delivered, expired and lost with a clean session at a crash, consumers
// complete.
func goodObs() *tortureObs {
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	obs := &tortureObs{
		Devices: []deviceObs{
			{ID: "a", Version: 4, Persistent: false, Commands: map[int64]int{1: 1, 4: 2}, Pubs: []pubObs{
				{Seq: 1, QoS: 1, Attempts: 1, Sends: 1, Acked: true},
				{Seq: 2, QoS: 2, Attempts: 2, Sends: 2, Acked: true}, // resent after a lost ack: two copies allowed
				{Seq: 3, QoS: 0, Attempts: 1, Sends: 1, Acked: true}, // lost: QoS 0 may be
				{Seq: 4, QoS: 1, Attempts: 1, Sends: 1, Acked: false},
			}},
			{ID: "b", Version: 5, Persistent: true, Commands: map[int64]int{2: 1}, Pubs: []pubObs{
				{Seq: 1, QoS: 0, Attempts: 1, Sends: 1, Acked: true},
				{Seq: 2, QoS: 1, Attempts: 1, Sends: 3, Acked: true}, // library resends on two reconnects
			}},
		},
		Stored: []storedObs{
			{Queue: 0, Offset: 0, ID: "m0", Key: "a", Device: "a", Seq: 1, Attempt: 1, QoS: 1},
			{Queue: 0, Offset: 1, ID: "m1", Key: "a", Device: "a", Seq: 2, Attempt: 1, QoS: 2},
			{Queue: 0, Offset: 2, ID: "m2", Key: "a", Device: "a", Seq: 2, Attempt: 2, QoS: 2},
			{Queue: 0, Offset: 3, ID: "m3", Key: "a", Device: "a", Seq: 4, Attempt: 1, QoS: 1},
			{Queue: 1, Offset: 0, ID: "n0", Key: "b", Device: "b", Seq: 1, Attempt: 1, QoS: 0},
			{Queue: 1, Offset: 1, ID: "n1", Key: "b", Device: "b", Seq: 2, Attempt: 1, QoS: 1},
			{Queue: 1, Offset: 2, ID: "n2", Key: "b", Device: "b", Seq: 2, Attempt: 1, QoS: 1},
		},
		Commands: []commandObs{
			{N: 1, Device: "a", ID: "c1", Acked: true, AckedAt: t0},
			{N: 2, Device: "b", ID: "c2", Acked: true, AckedAt: t0},
			{N: 3, Device: "b", ID: "c3", Acked: true, AckedAt: t0, TTL: time.Second}, // expired
			{N: 4, Device: "a", ID: "c4", Acked: true, AckedAt: t0},                   // delivered twice
			{N: 5, Device: "a", ID: "c5", Acked: true, AckedAt: t0.Add(time.Second)},  // clean session, killed after
			{N: 6, Device: "a", ID: "", Acked: false},                                 // never acknowledged: not checked
		},
		Receipts: []receiptObs{
			{MessageID: "c1", ClientID: "a", Outcome: "delivered"},
			{MessageID: "c2", ClientID: "b", Outcome: "delivered"},
			{MessageID: "c3", ClientID: "b", Outcome: "expired"},
		},
		Kills:  []time.Time{t0.Add(2 * time.Second)},
		RSS:    []rssSample{{At: t0, PID: 7, RSS: 40 << 20}, {At: t0, PID: 8, RSS: 60 << 20}},
		MaxRSS: 100 << 20,
	}
	all := func() []deliveryObs {
		var d []deliveryObs
		for _, s := range obs.Stored {
			d = append(d, deliveryObs{Queue: s.Queue, Offset: s.Offset, ID: s.ID})
		}
		return d
	}
	orderly := all()
	orderly = append(orderly[:3], append([]deliveryObs{orderly[1], orderly[2]}, orderly[3:]...)...) // a rewind after a restart
	obs.Consumers = []consumerObs{
		{Name: "orderly", Orderly: true, MustCover: true, Deliveries: orderly},
		{Name: "pop", MustCover: true, Deliveries: all()},
		{Name: "slow", Deliveries: all()[:1]},
	}
	return obs
}

func TestTortureCheckerPasses(t *testing.T) {
	rep := checkTorture(goodObs())
	require.True(t, rep.Passed, "%+v", rep.Failures)
	u, d := rep.Uplink, rep.Downlink
	require.Equal(t, 6, u.Published)
	require.Equal(t, 3, u.Acked)
	require.Equal(t, 7, u.Stored)
	require.Equal(t, 5, u.StoredDistinct)
	require.Equal(t, 2, u.Duplicates)
	require.Equal(t, [3]int{0, 1, 1}, u.DuplicatesByQoS)
	require.Equal(t, map[string]int{"clean": 1, "persistent": 1}, u.DuplicatesBySess)
	require.Equal(t, 1, u.LostQoS0)
	require.Equal(t, 1, u.UnackedStored)
	require.Equal(t, 5, d.Produced)
	require.Equal(t, 1, d.Unacked)
	require.Equal(t, 3, d.Delivered)
	require.Equal(t, 1, d.DuplicateDeliv)
	require.Equal(t, 1, d.Expired)
	require.Equal(t, 1, d.LostCleanAtCrash)
	require.Equal(t, 0, d.Undelivered)
	require.Equal(t, 2, rep.Consumers[0].Redelivered)
	require.Equal(t, 6, rep.Consumers[2].Missing) // the slow one need not keep up
	require.Equal(t, int64(60<<20), rep.Server.PeakRSS)
	var out bytes.Buffer
	require.NoError(t, writeTortureReport(&out, &rep))
	require.Contains(t, out.String(), "PASS")
	out.Reset()
	require.NoError(t, writeTortureJSON(&out, &rep))
	require.Contains(t, out.String(), `"passed":true`)
}

// Each case breaks one guarantee in goodObs; the checker must fail with
// that check, and only that one.
func TestTortureCheckerFails(t *testing.T) {
	cases := []struct {
		name  string
		check string
		spoil func(o *tortureObs)
	}{
		{"acked message lost", checkLost, func(o *tortureObs) {
			o.Stored = append(o.Stored[:0:0], o.Stored[1:]...) // a seq 1, acknowledged, not stored
			o.Consumers = nil
		}},
		{"reordered pair", checkOrder, func(o *tortureObs) {
			o.Stored[0].Seq, o.Stored[0].QoS, o.Stored[3].Seq, o.Stored[3].QoS = 4, 1, 1, 1 // a: 4, 2, 2, 1
		}},
		{"duplicate after a later message", checkOrder, func(o *tortureObs) {
			o.Stored[1], o.Stored[3] = o.Stored[3], o.Stored[1] // a: 1, 4, 2, 2
			o.Stored[1].Offset, o.Stored[3].Offset = 1, 3
			o.Consumers = nil
		}},
		{"duplicate without a resend", checkDuplicate, func(o *tortureObs) {
			o.Devices[0].Pubs[0].Sends = 1
			o.Stored[1].Seq, o.Stored[1].QoS = 1, 1 // a seq 1 twice, sent once
			o.Stored[2].Seq, o.Stored[2].QoS, o.Stored[2].Attempt = 2, 2, 1
			o.Devices[0].Pubs[1].Sends, o.Devices[0].Pubs[1].Attempts = 1, 1
		}},
		{"more copies than sends", checkDuplicate, func(o *tortureObs) {
			o.Devices[1].Pubs[1].Sends = 1 // b seq 2 stored twice, sent once
		}},
		{"QoS 2 of a persistent MQTT 5 session stored twice", checkQoS2Once, func(o *tortureObs) {
			o.Devices[1].Pubs = append(o.Devices[1].Pubs, pubObs{Seq: 3, QoS: 2, Attempts: 1, Sends: 2, Acked: true})
			o.Stored = append(o.Stored,
				storedObs{Queue: 1, Offset: 3, ID: "n3", Key: "b", Device: "b", Seq: 3, Attempt: 1, QoS: 2},
				storedObs{Queue: 1, Offset: 4, ID: "n4", Key: "b", Device: "b", Seq: 3, Attempt: 1, QoS: 2})
			o.Consumers = nil
		}},
		{"QoS 0 duplicated", checkDuplicate, func(o *tortureObs) {
			o.Devices[1].Pubs[1].QoS = 0
			o.Stored[5].QoS, o.Stored[6].QoS = 0, 0
		}},
		{"stored message nobody published", checkPhantom, func(o *tortureObs) {
			o.Stored = append(o.Stored, storedObs{Queue: 1, Offset: 3, ID: "n3", Key: "b", Device: "b", Seq: 9, Attempt: 1, QoS: 1})
			o.Consumers = nil
		}},
		{"unparseable message", checkPhantom, func(o *tortureObs) {
			o.Stored = append(o.Stored, storedObs{Queue: 1, Offset: 3, ID: "n3", Key: "b"})
			o.Consumers = nil
		}},
		{"attempt never made", checkPhantom, func(o *tortureObs) { o.Stored[3].Attempt = 2 }},
		{"wrong sharding key", checkKey, func(o *tortureObs) { o.Stored[0].Key = "b" }},
		{"command undelivered", checkUndelivered, func(o *tortureObs) {
			delete(o.Devices[1].Commands, 2)
			o.Receipts = o.Receipts[2:] // and no receipt for it
		}},
		{"command to a persistent session lost at a crash", checkUndelivered, func(o *tortureObs) {
			o.Commands[4].Device = "b" // b is persistent: a crash is no excuse
		}},
		{"command to a clean session lost without a crash", checkUndelivered, func(o *tortureObs) { o.Kills = nil }},
		{"command to a clean session lost long before a crash", checkUndelivered, func(o *tortureObs) {
			o.Kills[0] = o.Commands[4].AckedAt.Add(time.Minute)
		}},
		{"delivered receipt for an undelivered command", checkFalseReceipt, func(o *tortureObs) {
			delete(o.Devices[1].Commands, 2)
			o.Receipts = append(o.Receipts, receiptObs{MessageID: "c2", Outcome: "expired"})
		}},
		{"command to the wrong device", checkMisrouted, func(o *tortureObs) { o.Devices[0].Misrouted = 1 }},
		{"persistent session forgotten", checkSessionLost, func(o *tortureObs) { o.Devices[1].SessionsLost = 1 }},
		{"consumer missed a message", checkCoverage, func(o *tortureObs) {
			o.Consumers[1].Deliveries = o.Consumers[1].Deliveries[1:]
		}},
		{"consumer saw a message the store lost", checkDeliveredLost, func(o *tortureObs) {
			o.Consumers[1].Deliveries[0].ID = "gone"
		}},
		{"orderly consumer skipped ahead", checkOrderly, func(o *tortureObs) {
			// offset 2 right after 0 (what follows, a rewind to 0, is fine)
			o.Consumers[0].Deliveries = append([]deliveryObs{{Queue: 0, Offset: 0, ID: "m0"}, {Queue: 0, Offset: 2, ID: "m2"}},
				o.Consumers[0].Deliveries...)
		}},
		{"rss over the bound", checkRSS, func(o *tortureObs) { o.MaxRSS = 50 << 20 }},
		{"known gap with strict", knownReceiptLost, func(o *tortureObs) {
			o.Strict = true
			o.Receipts = o.Receipts[:2] // c3 (ttl 1 s, to b): its expired receipt lost
			o.Refusing = []timeSpan{{From: o.Commands[2].AckedAt, To: o.Commands[2].AckedAt.Add(5 * time.Second)}}
		}},
		{"server fault", checkFault, func(o *tortureObs) { o.Faults = []string{"serve exited by itself"} }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := goodObs()
			tc.spoil(o)
			rep := checkTorture(o)
			require.False(t, rep.Passed)
			var checks []string
			for _, f := range rep.Failures {
				checks = append(checks, f.Check)
				require.NotEmpty(t, f.Examples)
			}
			require.Equal(t, []string{tc.check}, checks, "%+v", rep.Failures)
			var out bytes.Buffer
			require.NoError(t, writeTortureReport(&out, &rep))
			require.Contains(t, out.String(), "FAIL:\n  "+tc.check)
		})
	}
}

// A command whose expired receipt was lost while the store refused writes
// is a known gap: reported, not a failure (unless strict); outside such a
// span the same loss is a failure.
func TestTortureCheckerKnownGap(t *testing.T) {
	o := goodObs()
	o.Receipts = o.Receipts[:2] // c3 (ttl 1 s, to b, not delivered): its expired receipt lost
	o.Refusing = []timeSpan{{From: o.Commands[2].AckedAt, To: o.Commands[2].AckedAt.Add(5 * time.Second)}}
	rep := checkTorture(o)
	require.True(t, rep.Passed, "%+v", rep.Failures)
	require.Len(t, rep.Known, 1)
	require.Equal(t, 1, rep.Known[0].Count)
	require.Equal(t, 1, rep.Downlink.ReceiptLostKnown)

	o.Refusing[0].From = o.Refusing[0].From.Add(time.Minute)
	o.Refusing[0].To = o.Refusing[0].To.Add(time.Minute)
	rep = checkTorture(o)
	require.False(t, rep.Passed)
	require.Equal(t, checkUndelivered, rep.Failures[0].Check)
}

func TestTorturePayloads(t *testing.T) {
	d := &tortureDevice{id: "tt-v3c-07", size: 64}
	b := d.payload(12345, 2, 3)
	require.Len(t, b, 64)
	dev, seq, qos, att, ok := parseTorturePayload(b)
	require.True(t, ok)
	require.Equal(t, []any{"tt-v3c-07", int64(12345), byte(2), 3}, []any{dev, seq, qos, att})
	d.size = 0 // never cut short
	_, _, _, _, ok = parseTorturePayload(d.payload(1, 0, 1))
	require.True(t, ok)
	for _, bad := range []string{"", "tt", "tt d=x s=1 q=1", "tt d=x s=y q=1 a=1", "tt d=x s=1 q=3 a=1", "xx d=x s=1 q=1 a=1"} {
		_, _, _, _, ok := parseTorturePayload([]byte(bad))
		require.False(t, ok, bad)
	}
	n, dev, ok := parseCommandPayload([]byte(commandPayload(42, "tt-v5p-03")))
	require.True(t, ok)
	require.Equal(t, int64(42), n)
	require.Equal(t, "tt-v5p-03", dev)
	_, _, ok = parseCommandPayload([]byte("cmd n=x d=y"))
	require.False(t, ok)
}

// The wire parser finds every acknowledgement in a stream however it is
// cut into reads, and skips other packets (a PUBLISH with a long body).
func TestTortureAckParser(t *testing.T) {
	var stream []byte
	stream = append(stream, 0x20, 0x02, 0x00, 0x00)           // CONNACK
	stream = append(stream, 0x40, 0x02, 0x01, 0x02)           // PUBACK 258
	stream = append(stream, 0x50, 0x03, 0x00, 0x07, 0x97)     // PUBREC 7, MQTT 5 code 0x97
	pub := append([]byte{0x32}, appendRemaining(nil, 300)...) // PUBLISH QoS 1, 300 bytes
	pub = append(pub, bytes.Repeat([]byte{0x40}, 300)...)     // a body that looks like acks
	stream = append(stream, pub...)
	stream = append(stream, 0x70, 0x02, 0xFF, 0xFE)             // PUBCOMP 65534
	stream = append(stream, 0xD0, 0x00)                         // PINGRESP
	stream = append(stream, 0x40, 0x04, 0x00, 0x09, 0x10, 0x00) // PUBACK 9, code 0x10, no properties
	want := "4/258/0 5/7/151 7/65534/0 4/9/16 "
	for _, chunk := range []int{1, 2, 3, 7, 64, len(stream)} {
		var p ackParser
		var got strings.Builder
		emit := func(typ byte, id uint16, code byte) { fmt.Fprintf(&got, "%d/%d/%d ", typ, id, code) }
		for i := 0; i < len(stream); i += chunk {
			p.feed(stream[i:min(i+chunk, len(stream))], emit)
		}
		require.Equal(t, want, got.String(), "reads of %d bytes", chunk)
	}
}

func TestTortureMalformedPackets(t *testing.T) {
	// The CONNECTs are well formed: remaining length = what follows.
	for _, level := range []byte{4, 5} {
		b := rawConnect(level, "MQTT", "tt-bad-1")
		require.Equal(t, len(b)-2, int(b[1]))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, k := range malformedKinds {
		require.NotEmpty(t, k.bytes(rng, "x"), k.name)
	}
}
