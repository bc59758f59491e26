package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The checker of `ferrymq bench torture`: a pure function from what the run
// observed (tortureObs) to a verdict (tortureReport). It knows nothing of
// processes or sockets, so the unit tests feed it synthetic observations.
//
// What it proves, for the core topic the devices publish to:
//
//   - No acknowledged uplink message is lost: every QoS 1/2 publish whose
//     PUBACK/PUBCOMP the device received is stored at least once.
//   - Duplicates only where a resend explains them: a message (device, seq)
//     stored more than once must be QoS 1/2, must have been transmitted
//     more than once (its publish was in flight when a connection of the
//     device ended — server killed, device cut, server refused — and the
//     device or its client library sent it again), and has at most as many
//     copies as transmissions. QoS 0 is never stored twice.
//   - Per-device order in the core: along the device's queue, ignoring the
//     allowed duplicates, sequence numbers only grow; a copy of seq s never
//     comes after a later seq (a resent message is stored before the next
//     one is published, since a device has one QoS 1/2 message in flight).
//   - Nothing is invented: every stored message parses, names a device and
//     seq that device published, an attempt it made, and its sharding key
//     is the device.
//   - Downlink: every command the core acknowledged to the backend reached
//     its device, or got an "expired" receipt; a command to a clean-session
//     device may also end with a "dropped" receipt or, when the server was
//     killed within 10 s after it was acknowledged, vanish with the session
//     (clean session state is not durable) — both counted, neither a
//     failure.
//     A "delivered" receipt is never issued for a command the device did
//     not get, and no device gets another device's command.
//   - Consumers: each backend that must keep up (clustering, broadcast,
//     POP) received every stored message at least once; every delivery
//     names the message stored at that queue offset at the end (nothing a
//     consumer saw was later lost); the orderly group never skipped ahead in
//     a queue.
//   - Server health: no unexpected exit, failed restart or Go runtime panic.
//   - Memory: the server's peak VmRSS stayed within the bound.

// tortureObs is everything a run observed: the checker's input.
type tortureObs struct {
	Devices   []deviceObs
	Stored    []storedObs // the device topic at the end, queue by queue in offset order
	Commands  []commandObs
	Receipts  []receiptObs
	Consumers []consumerObs
	Kills     []time.Time // when the server was SIGKILLed
	// CleanWindow: a command to a clean-session device that vanished is
	// excused only by a kill at most this long after it was acknowledged
	// (0: cleanWindowDefault) — longer than a device is ever offline.
	CleanWindow time.Duration
	RSS         []rssSample
	MaxRSS      int64    // bytes; 0: no bound
	Faults      []string // unexpected exits, failed restarts, runtime panics
	// Refusing are the spans when the store refused writes: from the
	// moment the disk was filled until the server had restarted after it
	// was freed (a store that failed a write refuses writes until reopened).
	Refusing []timeSpan
	// Strict makes the known gaps failures too.
	Strict bool
}

// timeSpan is [From, To].
type timeSpan struct{ From, To time.Time }

// deviceObs is one device: what it published and which commands it got.
type deviceObs struct {
	ID         string
	Version    int  // MQTT 4 (3.1.1) or 5
	Persistent bool // clean session 0 / session expiry > 0
	Pubs       []pubObs
	// Commands counts deliveries by command number; Misrouted counts
	// commands addressed to another device.
	Commands  map[int64]int
	Misrouted int
	// SessionsLost counts reconnections of a persistent device answered
	// "session present 0": the server forgot its session.
	SessionsLost int
}

// pubObs is one message a device published (Seq from 1, one per message).
type pubObs struct {
	Seq      int64
	QoS      byte
	Attempts int  // publishes by the application (a new attempt after a failure)
	Sends    int  // transmissions: attempts plus client-library resends on reconnect
	Acked    bool // PUBACK (QoS 1) / PUBCOMP (QoS 2) received; QoS 0: written
}

// storedObs is one message of the device topic as stored.
type storedObs struct {
	Queue   int
	Offset  int64
	ID      string
	Key     string
	Device  string // from the payload; "" when it did not parse
	Seq     int64
	Attempt int
	QoS     byte
	// Raw describes a message whose payload did not parse (topic, client,
	// the start of the body).
	Raw string
}

// commandObs is one command produced to the core for a device.
type commandObs struct {
	N       int64 // the command number in its payload
	Device  string
	ID      string // message ID the core acknowledged ("" if not acknowledged)
	Acked   bool
	AckedAt time.Time
	TTL     time.Duration // 0: the rule's
}

// receiptObs is one receipt from the receipts topic.
type receiptObs struct {
	MessageID, ClientID, Outcome, Reason string
}

// consumerObs is one backend consumer: its deliveries in arrival order.
type consumerObs struct {
	Name       string
	Orderly    bool // clustering orderly: deliveries of a queue never skip ahead
	MustCover  bool // must have received every stored message
	Deliveries []deliveryObs
}

type deliveryObs struct {
	Queue  int
	Offset int64
	ID     string
}

// rssSample is one reading of the server's /proc/PID/status.
type rssSample struct {
	At                     time.Time
	PID                    int
	RSS, Anon, File, Shmem int64 // bytes
	Threads                int
}

// tortureReport is the checker's verdict with the counts behind it.
type tortureReport struct {
	Passed   bool             `json:"passed"`
	Failures []tortureFinding `json:"failures,omitempty"`
	// Known are violations of a known, documented gap (docs/torture.md):
	// reported, failures only with Strict.
	Known []tortureFinding `json:"known_gaps,omitempty"`

	Uplink    uplinkCounts     `json:"uplink"`
	Downlink  downlinkCounts   `json:"downlink"`
	Consumers []consumerCounts `json:"consumers"`
	Server    serverCounts     `json:"server"`
	Run       runCounts        `json:"run"`
}

// tortureFinding is one kind of failure: how many, and a few examples.
type tortureFinding struct {
	Check    string   `json:"check"`
	Count    int      `json:"count"`
	Examples []string `json:"examples"`
}

type uplinkCounts struct {
	Devices          int            `json:"devices"`
	Published        int            `json:"published"`
	PublishedByQoS   [3]int         `json:"published_by_qos"`
	Acked            int            `json:"acked"`
	Attempts         int            `json:"attempts"`
	Resent           int            `json:"resent"` // messages transmitted more than once
	Stored           int            `json:"stored"`
	StoredDistinct   int            `json:"stored_distinct"`
	Duplicates       int            `json:"duplicates"` // extra copies, all allowed
	DuplicatesByQoS  [3]int         `json:"duplicates_by_qos"`
	DuplicatesBySess map[string]int `json:"duplicates_by_session"` // clean / persistent
	LostQoS0         int            `json:"lost_qos0"`
	UnackedStored    int            `json:"unacked_stored"`
	UnackedAbsent    int            `json:"unacked_absent"`
	Lost             int            `json:"lost"` // acknowledged, not stored: a failure
}

type downlinkCounts struct {
	Produced          int `json:"produced"` // acknowledged by the core
	Unacked           int `json:"unacked"`  // produce failed (server down): not checked
	WithTTL           int `json:"with_ttl"`
	Delivered         int `json:"delivered"`
	DuplicateDeliv    int `json:"duplicate_deliveries"`
	Expired           int `json:"expired"` // receipted expired and not delivered
	DeliveredExpired  int `json:"delivered_and_expired"`
	DroppedClean      int `json:"dropped_clean"`
	LostCleanAtCrash  int `json:"lost_clean_at_crash"`
	Undelivered       int `json:"undelivered"` // a failure
	ReceiptLostKnown  int `json:"receipt_lost_while_refusing"`
	Receipts          int `json:"receipts"`
	ReceiptsDelivered int `json:"receipts_delivered"`
	ReceiptsExpired   int `json:"receipts_expired"`
	ReceiptsDropped   int `json:"receipts_dropped"`
	ReceiptsOther     int `json:"receipts_other"`
}

type consumerCounts struct {
	Name        string `json:"name"`
	Deliveries  int    `json:"deliveries"`
	Distinct    int    `json:"distinct"`
	Redelivered int    `json:"redelivered"`
	Missing     int    `json:"missing"`
	MustCover   bool   `json:"must_cover"`
}

type serverCounts struct {
	Kills       int   `json:"kills"`
	Faults      int   `json:"faults"`
	RSSSamples  int   `json:"rss_samples"`
	PeakRSS     int64 `json:"peak_rss_bytes"`
	PeakAnon    int64 `json:"peak_anon_bytes"`
	PeakShmem   int64 `json:"peak_shmem_bytes"`
	MaxRSS      int64 `json:"max_rss_bytes"`
	PeakThreads int   `json:"peak_threads"`
}

// runCounts are figures of the run itself, filled by the runner (the
// checker leaves them alone).
type runCounts struct {
	Started        time.Time      `json:"started"`
	Seconds        float64        `json:"seconds"`
	Disk           string         `json:"disk"`
	DiskFull       int            `json:"disk_full_windows"`
	Disconnects    int            `json:"disconnects"`
	Sleeps         int            `json:"sleeps"`
	Reconnects     int            `json:"reconnects"`
	Refused        int            `json:"refused_publishes"`
	Malformed      map[string]int `json:"malformed"`
	MalformedShut  int            `json:"malformed_closed_by_server"`
	SlowSubBytes   int64          `json:"slow_subscriber_bytes"`
	SlowSubDrops   int            `json:"slow_subscriber_dropped"`
	SlowBackend    int            `json:"slow_backend_deliveries"`
	AckP50, AckP99 time.Duration  `json:"-"`
	AckMax         time.Duration  `json:"-"`
	AckMillis      [3]float64     `json:"ack_ms_p50_p99_max"`
	// Metrics are selected server counters, summed over its lives.
	Metrics map[string]float64 `json:"metrics,omitempty"`
	Notes   []string           `json:"notes,omitempty"`
}

// maxExamples bounds the examples kept per failed check.
const maxExamples = 8

type findings struct {
	byCheck map[string]*tortureFinding
	order   []string
}

func (f *findings) add(check, format string, args ...any) {
	if f.byCheck == nil {
		f.byCheck = map[string]*tortureFinding{}
	}
	x := f.byCheck[check]
	if x == nil {
		x = &tortureFinding{Check: check}
		f.byCheck[check] = x
		f.order = append(f.order, check)
	}
	x.Count++
	if len(x.Examples) < maxExamples {
		x.Examples = append(x.Examples, fmt.Sprintf(format, args...))
	}
}

func (f *findings) list() []tortureFinding {
	out := make([]tortureFinding, 0, len(f.order))
	for _, c := range f.order {
		out = append(out, *f.byCheck[c])
	}
	return out
}

// Names of the checks, as reported.
const (
	checkLost          = "acknowledged uplink message not stored"
	checkDuplicate     = "duplicate not explained by a resend"
	checkQoS2Once      = "QoS 2 publish of a persistent MQTT 5 session stored twice"
	checkOrder         = "per-device order broken in the core"
	checkPhantom       = "stored message no device published"
	checkKey           = "stored message with the wrong sharding key"
	checkUndelivered   = "acknowledged command neither delivered nor receipted expired"
	checkFalseReceipt  = "delivered receipt for a command the device never got"
	checkMisrouted     = "command delivered to the wrong device"
	checkCoverage      = "consumer missed stored messages"
	checkDeliveredLost = "consumer got a message the store no longer has"
	checkOrderly       = "orderly consumer skipped ahead in a queue"
	checkSessionLost   = "server forgot a persistent session"
	// The known gap (docs/torture.md): a command whose TTL ran out while
	// the store refused writes was forgotten by the session, and its
	// expired receipt, refused by the store, was dropped.
	knownReceiptLost = "expired command's receipt lost while the store refused writes (known gap)"
	checkRSS         = "server RSS over the bound"
	checkFault       = "server fault"
)

// checkTorture runs every check over obs.
func checkTorture(obs *tortureObs) tortureReport {
	var f, known findings
	r := tortureReport{}
	r.Uplink = checkUplink(obs, &f)
	r.Downlink = checkDownlink(obs, &f, &known)
	r.Consumers = checkConsumers(obs, &f)
	r.Server = checkServer(obs, &f)
	r.Failures = f.list()
	r.Known = known.list()
	if obs.Strict {
		r.Failures = append(r.Failures, r.Known...)
	}
	r.Passed = len(r.Failures) == 0
	return r
}

type devSeq struct {
	dev string
	seq int64
}

func checkUplink(obs *tortureObs, f *findings) uplinkCounts {
	c := uplinkCounts{Devices: len(obs.Devices), DuplicatesBySess: map[string]int{}}
	devs := map[string]*deviceObs{}
	pubs := map[devSeq]*pubObs{}
	for i := range obs.Devices {
		d := &obs.Devices[i]
		devs[d.ID] = d
		if d.SessionsLost > 0 {
			f.add(checkSessionLost, "%s reconnected %d times to no session", d.ID, d.SessionsLost)
		}
		for j := range d.Pubs {
			p := &d.Pubs[j]
			pubs[devSeq{d.ID, p.Seq}] = p
			c.Published++
			c.PublishedByQoS[min(p.QoS, 2)]++
			c.Attempts += max(p.Attempts, 1)
			if p.Acked && p.QoS > 0 {
				c.Acked++
			}
			if p.Sends > 1 {
				c.Resent++
			}
		}
	}

	// Walk each device's messages in queue order (one device, one key, one
	// queue; a device found in several queues is walked per queue, and
	// its order is checked in each).
	type walk struct {
		maxSeq int64
		seen   map[int64]bool
	}
	copies := map[devSeq]int{}
	type devSeqAttempt struct {
		devSeq
		attempt int
	}
	qos2Copies := map[devSeqAttempt]int{} // QoS 2 of persistent MQTT 5 devices
	walks := map[string]*walk{}           // device/queue
	c.Stored = len(obs.Stored)
	for _, s := range obs.Stored {
		where := fmt.Sprintf("queue %d offset %d (id %s)", s.Queue, s.Offset, s.ID)
		if s.Device == "" {
			f.add(checkPhantom, "%s: payload is not a torture message: key %q %s", where, s.Key, s.Raw)
			continue
		}
		d := devs[s.Device]
		p := pubs[devSeq{s.Device, s.Seq}]
		switch {
		case d == nil:
			f.add(checkPhantom, "%s: unknown device %q", where, s.Device)
			continue
		case p == nil:
			f.add(checkPhantom, "%s: %s seq %d was never published", where, s.Device, s.Seq)
			continue
		case s.Attempt < 1 || s.Attempt > max(p.Attempts, 1):
			f.add(checkPhantom, "%s: %s seq %d attempt %d, but the device made %d", where, s.Device, s.Seq, s.Attempt, p.Attempts)
		case s.QoS != p.QoS:
			f.add(checkPhantom, "%s: %s seq %d stored as QoS %d, published as QoS %d", where, s.Device, s.Seq, s.QoS, p.QoS)
		}
		if s.Key != s.Device {
			f.add(checkKey, "%s: %s seq %d has key %q", where, s.Device, s.Seq, s.Key)
		}
		k := devSeq{s.Device, s.Seq}
		copies[k]++
		if s.QoS == 2 && d.Version == 5 && d.Persistent {
			// Exactly once (docs/commands.md): the library's resends of one
			// attempt are one publish; only the device's own new attempts
			// (after a failed one) may add copies.
			ka := devSeqAttempt{k, s.Attempt}
			if qos2Copies[ka]++; qos2Copies[ka] == 2 {
				f.add(checkQoS2Once, "%s: %s seq %d attempt %d stored twice", where, s.Device, s.Seq, s.Attempt)
			}
		}
		w := walks[s.Device+"\x00"+strconv.Itoa(s.Queue)]
		if w == nil {
			w = &walk{seen: map[int64]bool{}}
			walks[s.Device+"\x00"+strconv.Itoa(s.Queue)] = w
		}
		switch {
		case s.Seq > w.maxSeq:
			w.maxSeq = s.Seq
		case s.Seq == w.maxSeq:
			// an adjacent copy: judged by the duplicate check below
		case w.seen[s.Seq]:
			f.add(checkOrder, "%s: a copy of %s seq %d stored after seq %d", where, s.Device, s.Seq, w.maxSeq)
		default:
			f.add(checkOrder, "%s: %s seq %d stored after seq %d", where, s.Device, s.Seq, w.maxSeq)
		}
		w.seen[s.Seq] = true
	}
	c.StoredDistinct = len(copies)

	for i := range obs.Devices {
		d := &obs.Devices[i]
		sess := "clean"
		if d.Persistent {
			sess = "persistent"
		}
		for j := range d.Pubs {
			p := &d.Pubs[j]
			n := copies[devSeq{d.ID, p.Seq}]
			switch {
			case n == 0 && p.QoS == 0:
				c.LostQoS0++
			case n == 0 && p.Acked:
				c.Lost++
				f.add(checkLost, "%s seq %d (QoS %d, %d attempts, %d sends) acknowledged, not in the core", d.ID, p.Seq, p.QoS, p.Attempts, p.Sends)
			case n == 0:
				c.UnackedAbsent++
			case !p.Acked && p.QoS > 0:
				c.UnackedStored++
			}
			if n <= 1 {
				continue
			}
			if p.QoS == 0 || n > max(p.Sends, 1) {
				f.add(checkDuplicate, "%s seq %d (QoS %d) stored %d times, sent %d times", d.ID, p.Seq, p.QoS, n, p.Sends)
				continue
			}
			c.Duplicates += n - 1
			c.DuplicatesByQoS[min(p.QoS, 2)] += n - 1
			c.DuplicatesBySess[sess] += n - 1
		}
	}
	return c
}

func checkDownlink(obs *tortureObs, f, known *findings) downlinkCounts {
	c := downlinkCounts{Receipts: len(obs.Receipts)}
	byID := map[string][]receiptObs{}
	for _, r := range obs.Receipts {
		byID[r.MessageID] = append(byID[r.MessageID], r)
		switch r.Outcome {
		case "delivered":
			c.ReceiptsDelivered++
		case "expired":
			c.ReceiptsExpired++
		case "dropped":
			c.ReceiptsDropped++
		default:
			c.ReceiptsOther++
		}
	}
	devs := map[string]*deviceObs{}
	for i := range obs.Devices {
		devs[obs.Devices[i].ID] = &obs.Devices[i]
		if n := obs.Devices[i].Misrouted; n > 0 {
			f.add(checkMisrouted, "%s got %d commands addressed to other devices", obs.Devices[i].ID, n)
		}
	}
	for _, cmd := range obs.Commands {
		if !cmd.Acked {
			c.Unacked++
			continue
		}
		c.Produced++
		if cmd.TTL > 0 {
			c.WithTTL++
		}
		d := devs[cmd.Device]
		got := 0
		persistent := false
		if d != nil {
			got = d.Commands[cmd.N]
			persistent = d.Persistent
		}
		var expired, dropped, delivered bool
		for _, r := range byID[cmd.ID] {
			switch r.Outcome {
			case "expired":
				expired = true
			case "dropped":
				dropped = true
			case "delivered":
				delivered = true
			}
		}
		if delivered && got == 0 {
			f.add(checkFalseReceipt, "command %d (id %s) to %s: receipt delivered, the device never got it", cmd.N, cmd.ID, cmd.Device)
		}
		switch {
		case got > 0:
			c.Delivered++
			c.DuplicateDeliv += got - 1
			if expired {
				c.DeliveredExpired++
			}
		case expired:
			c.Expired++
		case !persistent && dropped:
			c.DroppedClean++
		case !persistent && killedWithin(obs.Kills, cmd.AckedAt, cmp.Or(obs.CleanWindow, cleanWindowDefault)):
			c.LostCleanAtCrash++
		case cmd.TTL > 0 && len(byID[cmd.ID]) == 0 && expiredWhileRefusing(obs.Refusing, cmd.AckedAt.Add(cmd.TTL)):
			c.ReceiptLostKnown++
			known.add(knownReceiptLost, "command %d (id %s, ttl %s) to %s, acknowledged %s: no delivery, no receipt",
				cmd.N, cmd.ID, cmd.TTL, cmd.Device, cmd.AckedAt.Format("15:04:05.000"))
		default:
			c.Undelivered++
			var rs []string
			for _, r := range byID[cmd.ID] {
				rs = append(rs, r.Outcome+" "+r.Reason)
			}
			sess := "clean"
			if persistent {
				sess = "persistent"
			}
			f.add(checkUndelivered, "command %d (id %s, ttl %s) to %s (%s session), acknowledged %s: receipts %v",
				cmd.N, cmd.ID, cmd.TTL, cmd.Device, sess, cmd.AckedAt.Format("15:04:05.000"), rs)
		}
	}
	return c
}

// expiredWhileRefusing: did a command expiring at t run out while the
// store refused writes? The session notices an expiry within a second
// (its sweep), a resend on reconnect a little later: 2 s of slack.
func expiredWhileRefusing(spans []timeSpan, t time.Time) bool {
	for _, sp := range spans {
		if !t.Before(sp.From.Add(-2*time.Second)) && !t.After(sp.To.Add(2*time.Second)) {
			return true
		}
	}
	return false
}

// cleanWindowDefault bounds how long a command to an online or briefly
// offline device can be on its way: a device sleeps at most 6 s, a
// restart takes a second or two.
const cleanWindowDefault = 10 * time.Second

// killedWithin: was the server killed in [t, t+window]?
func killedWithin(kills []time.Time, t time.Time, window time.Duration) bool {
	for _, k := range kills {
		if !k.Before(t) && !k.After(t.Add(window)) {
			return true
		}
	}
	return false
}

type queueOffset struct {
	queue  int
	offset int64
}

func checkConsumers(obs *tortureObs, f *findings) []consumerCounts {
	stored := make(map[queueOffset]string, len(obs.Stored))
	for _, s := range obs.Stored {
		stored[queueOffset{s.Queue, s.Offset}] = s.ID
	}
	var out []consumerCounts
	for _, co := range obs.Consumers {
		cc := consumerCounts{Name: co.Name, Deliveries: len(co.Deliveries), MustCover: co.MustCover}
		seen := make(map[queueOffset]bool, len(co.Deliveries))
		next := map[int]int64{} // orderly: the highest offset delivered + 1, per queue
		for _, d := range co.Deliveries {
			k := queueOffset{d.Queue, d.Offset}
			if id, ok := stored[k]; !ok || id != d.ID {
				f.add(checkDeliveredLost, "%s got %s at queue %d offset %d; the store has %q there", co.Name, d.ID, d.Queue, d.Offset, id)
			}
			if seen[k] {
				cc.Redelivered++
			}
			seen[k] = true
			if co.Orderly {
				n, started := next[d.Queue]
				if started && d.Offset > n {
					f.add(checkOrderly, "%s: queue %d offset %d delivered after offset %d", co.Name, d.Queue, d.Offset, n-1)
				}
				if !started || d.Offset+1 > n {
					next[d.Queue] = d.Offset + 1
				}
			}
		}
		cc.Distinct = len(seen)
		var missing []string
		for _, s := range obs.Stored {
			if !seen[queueOffset{s.Queue, s.Offset}] {
				cc.Missing++
				if len(missing) < 3 {
					missing = append(missing, fmt.Sprintf("%d/%d", s.Queue, s.Offset))
				}
			}
		}
		if co.MustCover && cc.Missing > 0 {
			f.add(checkCoverage, "%s missed %d of %d stored messages (queue/offset %s…)", co.Name, cc.Missing, len(obs.Stored), strings.Join(missing, " "))
		}
		out = append(out, cc)
	}
	return out
}

func checkServer(obs *tortureObs, f *findings) serverCounts {
	c := serverCounts{Kills: len(obs.Kills), Faults: len(obs.Faults), RSSSamples: len(obs.RSS), MaxRSS: obs.MaxRSS}
	for _, s := range obs.RSS {
		c.PeakRSS = max(c.PeakRSS, s.RSS)
		c.PeakAnon = max(c.PeakAnon, s.Anon)
		c.PeakShmem = max(c.PeakShmem, s.Shmem)
		c.PeakThreads = max(c.PeakThreads, s.Threads)
		if obs.MaxRSS > 0 && s.RSS > obs.MaxRSS {
			f.add(checkRSS, "pid %d at %s: VmRSS %s > %s (anon %s, shmem %s)", s.PID, s.At.Format("15:04:05"),
				fmtBytes(s.RSS), fmtBytes(obs.MaxRSS), fmtBytes(s.Anon), fmtBytes(s.Shmem))
		}
	}
	for _, x := range obs.Faults {
		f.add(checkFault, "%s", x)
	}
	return c
}

func fmtBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return strconv.FormatFloat(float64(n)/(1<<30), 'f', 2, 64) + " GiB"
	case n >= 1<<20:
		return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) + " MiB"
	case n >= 1<<10:
		return strconv.FormatFloat(float64(n)/(1<<10), 'f', 1, 64) + " KiB"
	}
	return strconv.FormatInt(n, 10) + " B"
}

// writeTortureReport prints the report for people.
func writeTortureReport(w io.Writer, r *tortureReport) error {
	var b strings.Builder
	u, d, s, run := r.Uplink, r.Downlink, r.Server, r.Run
	fmt.Fprintf(&b, "torture run: %s, %.0f s, disk %s\n", run.Started.UTC().Format(time.RFC3339), run.Seconds, run.Disk)
	fmt.Fprintf(&b, "\nuplink   devices %d  published %d (QoS0 %d, QoS1 %d, QoS2 %d)  attempts %d  acked %d  resent %d\n",
		u.Devices, u.Published, u.PublishedByQoS[0], u.PublishedByQoS[1], u.PublishedByQoS[2], u.Attempts, u.Acked, u.Resent)
	fmt.Fprintf(&b, "         stored %d (%d distinct)  duplicates %d (QoS1 %d, QoS2 %d; clean %d, persistent %d)  lost-QoS0 %d\n",
		u.Stored, u.StoredDistinct, u.Duplicates, u.DuplicatesByQoS[1], u.DuplicatesByQoS[2],
		u.DuplicatesBySess["clean"], u.DuplicatesBySess["persistent"], u.LostQoS0)
	fmt.Fprintf(&b, "         unacked: stored %d, absent %d  refused (MQTT 5 reason code) %d  lost (acked, not stored) %d\n",
		u.UnackedStored, u.UnackedAbsent, run.Refused, u.Lost)
	fmt.Fprintf(&b, "         ack latency p50 %s  p99 %s  max %s\n", fmtLatency(run.AckP50), fmtLatency(run.AckP99), fmtLatency(run.AckMax))
	fmt.Fprintf(&b, "\ndownlink commands %d (+%d unacknowledged)  with TTL %d  delivered %d (duplicates %d)  expired %d  delivered+expired %d\n",
		d.Produced, d.Unacked, d.WithTTL, d.Delivered, d.DuplicateDeliv, d.Expired, d.DeliveredExpired)
	fmt.Fprintf(&b, "         clean session: dropped %d, lost at a crash %d  receipt lost while the store refused writes %d  undelivered %d\n",
		d.DroppedClean, d.LostCleanAtCrash, d.ReceiptLostKnown, d.Undelivered)
	fmt.Fprintf(&b, "         receipts %d: delivered %d, expired %d, dropped %d, other %d\n",
		d.Receipts, d.ReceiptsDelivered, d.ReceiptsExpired, d.ReceiptsDropped, d.ReceiptsOther)
	b.WriteString("\nconsumers\n")
	for _, c := range r.Consumers {
		must := ""
		if !c.MustCover {
			must = "  (slow; not required to keep up)"
		}
		fmt.Fprintf(&b, "  %-22s deliveries %7d  distinct %7d  redelivered %6d  missing %6d%s\n", c.Name, c.Deliveries, c.Distinct, c.Redelivered, c.Missing, must)
	}
	malformed := 0
	var kinds []string
	for k, n := range run.Malformed {
		malformed += n
		kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
	}
	slices.Sort(kinds)
	fmt.Fprintf(&b, "\nchaos    kills %d  disconnects %d (of which sleeps %d)  reconnects %d  disk-full windows %d  malformed %d (closed by server %d)\n",
		s.Kills, run.Disconnects, run.Sleeps, run.Reconnects, run.DiskFull, malformed, run.MalformedShut)
	if len(kinds) > 0 {
		fmt.Fprintf(&b, "         malformed kinds: %s\n", strings.Join(kinds, ", "))
	}
	fmt.Fprintf(&b, "         slow MQTT subscriber read %s, disconnected %d times (kills included); slow backend got %d\n",
		fmtBytes(run.SlowSubBytes), run.SlowSubDrops, run.SlowBackend)
	bound := "none"
	if s.MaxRSS > 0 {
		bound = fmtBytes(s.MaxRSS)
	}
	fmt.Fprintf(&b, "server   peak RSS %s (anon %s, shmem %s; bound %s)  threads %d  samples %d  faults %d\n",
		fmtBytes(s.PeakRSS), fmtBytes(s.PeakAnon), fmtBytes(s.PeakShmem), bound, s.PeakThreads, s.RSSSamples, s.Faults)
	if len(run.Metrics) > 0 {
		var ms []string
		for k, v := range run.Metrics {
			ms = append(ms, fmt.Sprintf("%s %g", k, v))
		}
		slices.Sort(ms)
		fmt.Fprintf(&b, "metrics  (summed over the server's lives, sampled each second)\n")
		for _, m := range ms {
			fmt.Fprintf(&b, "         %s\n", m)
		}
	}
	for _, n := range run.Notes {
		fmt.Fprintf(&b, "note     %s\n", n)
	}
	if len(r.Known) > 0 {
		b.WriteString("\nknown gaps (docs/torture.md; failures with --strict):\n")
		for _, x := range r.Known {
			fmt.Fprintf(&b, "  %s: %d\n", x.Check, x.Count)
			for _, e := range x.Examples {
				fmt.Fprintf(&b, "      %s\n", e)
			}
		}
	}
	if r.Passed {
		b.WriteString("\nPASS: every check held\n")
	} else {
		b.WriteString("\nFAIL:\n")
		for _, x := range r.Failures {
			fmt.Fprintf(&b, "  %s: %d\n", x.Check, x.Count)
			for _, e := range x.Examples {
				fmt.Fprintf(&b, "      %s\n", e)
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func writeTortureJSON(w io.Writer, r *tortureReport) error {
	r.Run.AckMillis = [3]float64{ms(r.Run.AckP50), ms(r.Run.AckP99), ms(r.Run.AckMax)}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// sortStored orders stored messages by queue, then offset.
func sortStored(s []storedObs) {
	slices.SortFunc(s, func(a, b storedObs) int {
		return cmp.Or(cmp.Compare(a.Queue, b.Queue), cmp.Compare(a.Offset, b.Offset))
	})
}
