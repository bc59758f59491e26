package store

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferrymq/core"
)

// TestCrashKill9 is a real process crash, not a simulation. Each round
// re-executes the test binary as a child process (runCrashChild in
// crash_child_test.go) that opens the store on a shared directory and
// produces from 8 goroutines with FlushSync, printing a line for every
// acknowledged message. The parent kills the child with SIGKILL at a random
// moment — mid-write, mid-fsync, mid-roll, mid-dispatch, whatever it happens
// to be doing; no deferred function or Close runs — then reopens the store
// itself, so that the real recovery code runs on whatever the kernel holds,
// and checks that
//
//   - every acknowledged message of every round so far can be read by ID
//     with the right body, queue and queue offset;
//   - each queue holds offsets 0..n-1, densely, with no message twice, and
//     what it held after the previous round is a prefix of what it holds now;
//   - per sharding key, sequence numbers increase along the queue, and this
//     round's stored messages are the acknowledged ones plus at most the one
//     that was in flight when the kill came (never fewer).
//
// The state accumulates: every round reopens the same directory.
//
// Some rounds kill the child within milliseconds of its start, which may land
// in Open, while recovery of the previous crash is still cutting the log and
// rebuilding consume queues.
func TestCrashKill9(t *testing.T) {
	rounds := 20
	if testing.Short() {
		rounds = 5
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0x6372617368))

	dir := t.TempDir()
	h := &crashHistory{}
	for r := 0; r < rounds; r++ {
		var c crashRound
		c.round = r
		c.base = uint64(r+1) << 32
		if r%5 == 4 {
			// Early kill: measured from the start of the process.
			c.early = true
			c.delay = time.Duration(1+rng.IntN(40)) * time.Millisecond
		} else {
			// Measured from the child's first acknowledgement, so that the
			// kill lands while it produces.
			c.delay = time.Duration(50+rng.IntN(351)) * time.Millisecond
		}
		start := time.Now()
		c.run(t, dir)
		h.verify(t, dir, &c)
		t.Logf("round %2d: child ran %v, killed %v after its %s, %d acked; %d stored in total; round took %v",
			r, c.ran.Round(time.Millisecond), c.delay, map[bool]string{false: "first ack", true: "start"}[c.early],
			len(c.acks), h.stored, time.Since(start).Round(time.Millisecond))
	}
	require.NotZero(t, h.stored, "no round produced anything")
}

// crashAck is one line of the child's output: a message acknowledged by
// Produce.
type crashAck struct {
	id    core.MessageID
	queue int
	qoff  int64
	g     int
	seq   uint64
}

func parseCrashAck(line string) (crashAck, error) {
	var a crashAck
	f := strings.Fields(line)
	if len(f) != 6 {
		return a, strconv.ErrSyntax
	}
	var err error
	if a.id, err = core.ParseMessageID(f[0]); err != nil {
		return a, err
	}
	if f[1] != crashTopic || !strings.HasPrefix(f[4], "k") {
		return a, strconv.ErrSyntax
	}
	if a.queue, err = strconv.Atoi(f[2]); err != nil {
		return a, err
	}
	if a.qoff, err = strconv.ParseInt(f[3], 10, 64); err != nil {
		return a, err
	}
	if a.g, err = strconv.Atoi(f[4][1:]); err != nil {
		return a, err
	}
	if a.g < 0 || a.g >= crashProducers {
		return a, strconv.ErrRange
	}
	if a.seq, err = strconv.ParseUint(f[5], 10, 64); err != nil {
		return a, err
	}
	return a, nil
}

// scanFullLines is bufio.ScanLines without the final unterminated line: a
// line is an acknowledgement only once its newline was written.
func scanFullLines(data []byte, atEOF bool) (int, []byte, error) {
	if i := bytes.IndexByte(data, '\n'); i >= 0 {
		return i + 1, data[:i], nil
	}
	if atEOF && len(data) > 0 {
		return len(data), nil, nil
	}
	return 0, nil, nil
}

// crashRound is one child process.
type crashRound struct {
	round int
	base  uint64 // first sequence number of every producer
	early bool
	delay time.Duration

	acks    []crashAck
	partial int           // bytes of an unterminated last line (dropped)
	ran     time.Duration // from start to reaped
}

// run starts the child, kills it, reaps it and collects its acks.
func (c *crashRound) run(t *testing.T, dir string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		crashChildDirEnv+"="+dir,
		crashChildSeqEnv+"="+strconv.FormatUint(c.base, 10))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	started := time.Now()

	// Whatever happens below, the child is killed and reaped, and the
	// reader has ended, before run returns.
	var (
		readerDone = make(chan struct{})
		firstAck   = make(chan struct{})
		// Written by the reader, read only after readerDone.
		lines   []string
		partial int
		scanErr error
	)
	reaped := false
	defer func() {
		if !reaped {
			_ = cmd.Process.Kill()
			<-readerDone
			_ = cmd.Wait()
		}
	}()
	go func() {
		defer close(readerDone)
		sc := bufio.NewScanner(stdout)
		sc.Split(func(data []byte, atEOF bool) (int, []byte, error) {
			adv, tok, err := scanFullLines(data, atEOF)
			if tok == nil && adv > 0 {
				partial = adv
			}
			return adv, tok, err
		})
		first := true
		for sc.Scan() {
			lines = append(lines, sc.Text())
			if first {
				close(firstAck)
				first = false
			}
		}
		scanErr = sc.Err()
	}()

	exited, silent := false, false
	if c.early {
		select {
		case <-time.After(c.delay):
		case <-readerDone:
			exited = true
		}
	} else {
		select {
		case <-firstAck:
			select {
			case <-time.After(c.delay):
			case <-readerDone:
				exited = true
			}
		case <-readerDone:
			exited = true
		case <-time.After(20 * time.Second):
			silent = true
		}
	}
	_ = cmd.Process.Kill() // SIGKILL
	<-readerDone
	waitErr := cmd.Wait()
	reaped = true
	c.ran = time.Since(started)

	// stderr is complete only now, after Wait.
	require.False(t, silent, "round %d: child acknowledged nothing in 20 s; stderr:\n%s", c.round, stderr.String())
	require.False(t, exited, "round %d: child exited by itself (%v); stderr:\n%s", c.round, waitErr, stderr.String())
	st, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, ok)
	require.True(t, st.Signaled() && st.Signal() == syscall.SIGKILL,
		"round %d: child was not killed by SIGKILL but ended with %v; stderr:\n%s", c.round, cmd.ProcessState, stderr.String())
	require.Empty(t, stderr.String(), "round %d: child wrote to stderr", c.round)
	require.NoError(t, scanErr, "round %d: reading the child's acks", c.round)

	c.partial = partial
	if partial > 0 {
		t.Logf("round %d: dropped an unterminated last line of %d bytes", c.round, partial)
	}
	for _, line := range lines {
		a, err := parseCrashAck(line)
		require.NoError(t, err, "round %d: bad ack line %q", c.round, line)
		c.acks = append(c.acks, a)
	}
}

// crashHistory is what the parent knows across rounds.
type crashHistory struct {
	acks   []crashAck         // acknowledged in any round
	queues [][]core.MessageID // each queue's IDs after the last round
	stored int
}

// verify reopens the store after round c and checks it.
func (h *crashHistory) verify(t *testing.T, dir string, c *crashRound) {
	t.Helper()
	ctx := t.Context()
	opts := crashOptions()

	// The child's own acks: per producer, contiguous from the round's base,
	// in the order they were printed, each to the queue its key maps to.
	ackedPer := make(map[int]int)
	for _, a := range c.acks {
		require.Equal(t, c.base+uint64(ackedPer[a.g]), a.seq, "round %d: k%d acks out of order", c.round, a.g)
		require.Equal(t, core.QueueFor(crashKey(a.g), opts.DefaultQueues), a.queue)
		ackedPer[a.g]++
	}
	h.acks = append(h.acks, c.acks...)

	s, err := Open(dir, opts)
	require.NoError(t, err, "round %d: reopen after kill -9", c.round)
	defer func() { require.NoError(t, s.Close(), "round %d: close", c.round) }()

	info, err := s.Topic(ctx, crashTopic)
	if err != nil {
		require.ErrorIs(t, err, core.ErrTopicNotFound)
		require.Empty(t, h.acks, "round %d: topic gone but messages were acknowledged", c.round)
		return
	}
	require.Equal(t, opts.DefaultQueues, info.Queues)
	if h.queues == nil {
		h.queues = make([][]core.MessageID, info.Queues)
	}

	type where struct {
		queue int
		qoff  int64
	}
	stored := make(map[core.MessageID]where)
	roundCount := make(map[int]int) // per producer: messages of this round stored
	for q := 0; q < info.Queues; q++ {
		msgs := crashReadQueue(t, s, q)
		ids := make([]core.MessageID, len(msgs))
		lastSeq := make(map[int]uint64)
		// Plain comparisons: this loop sees every stored message each round.
		for k, m := range msgs {
			at := func(format string, args ...any) {
				t.Helper()
				t.Fatalf("round %d: queue %d offset %d (%s): %s", c.round, q, k, m.ID, fmt.Sprintf(format, args...))
			}
			if m.QueueOffset != int64(k) || m.Queue != q || m.Topic != crashTopic {
				at("read as %s/%d@%d: queue not dense or message misplaced", m.Topic, m.Queue, m.QueueOffset)
			}
			if w, dup := stored[m.ID]; dup {
				at("stored twice, also at queue %d offset %d", w.queue, w.qoff)
			}
			stored[m.ID] = where{q, m.QueueOffset}
			ids[k] = m.ID

			if len(m.Body) != crashBodyLen {
				at("body of %d bytes", len(m.Body))
			}
			g := int(binary.BigEndian.Uint32(m.Body))
			seq := binary.BigEndian.Uint64(m.Body[4:])
			if g >= crashProducers || m.ShardingKey != crashKey(g) || !bytes.Equal(m.Body, crashBody(g, seq)) {
				at("body %x does not match key %q", m.Body, m.ShardingKey)
			}
			if want := core.QueueFor(m.ShardingKey, info.Queues); want != q {
				at("key %q belongs in queue %d", m.ShardingKey, want)
			}
			if prev, ok := lastSeq[g]; ok && seq <= prev {
				at("k%d seq %d after seq %d", g, seq, prev)
			}
			lastSeq[g] = seq
			if seq>>32 == c.base>>32 {
				if want := c.base + uint64(roundCount[g]); seq != want {
					at("k%d seq %d, want %d: a gap in this round's messages", g, seq, want)
				}
				roundCount[g]++
			}
		}
		// Nothing that was stored before disappears or moves.
		prev := h.queues[q]
		require.GreaterOrEqual(t, len(ids), len(prev), "round %d: queue %d shrank", c.round, q)
		require.True(t, slices.Equal(prev, ids[:len(prev)]), "round %d: queue %d rewritten", c.round, q)
		h.queues[q] = ids
	}
	h.stored = len(stored)

	// This round: everything acked is stored, and at most the one message
	// per producer that was in flight (or acked but not yet printed) more.
	for g := 0; g < crashProducers; g++ {
		n, acked := roundCount[g], ackedPer[g]
		require.GreaterOrEqual(t, n, acked, "round %d: k%d lost acknowledged messages", c.round, g)
		require.LessOrEqual(t, n, acked+1, "round %d: k%d stored more than it could have sent", c.round, g)
	}

	// Every acknowledged message of every round is where it was acked (the
	// scan above read and checked each stored message), and this round's
	// are also fetched by ID.
	for i, a := range h.acks {
		w, ok := stored[a.id]
		if !ok {
			t.Fatalf("round %d: acked %s (k%d seq %d) lost", c.round, a.id, a.g, a.seq)
		}
		if w != (where{a.queue, a.qoff}) {
			t.Fatalf("round %d: acked %s at %d@%d found at %d@%d", c.round, a.id, a.queue, a.qoff, w.queue, w.qoff)
		}
		if i < len(h.acks)-len(c.acks) {
			continue
		}
		m, err := s.Get(ctx, a.id)
		require.NoError(t, err, "round %d: get acked %s", c.round, a.id)
		if !bytes.Equal(crashBody(a.g, a.seq), m.Body) || m.Queue != a.queue || m.QueueOffset != a.qoff ||
			m.ShardingKey != crashKey(a.g) || m.ID != a.id {
			t.Fatalf("round %d: get %s returned %s/%d@%d key %q body %x, acked k%d seq %d at %d@%d",
				c.round, a.id, m.Topic, m.Queue, m.QueueOffset, m.ShardingKey, m.Body, a.g, a.seq, a.queue, a.qoff)
		}
	}
}

// crashReadQueue reads a whole queue of the crash topic from offset 0.
func crashReadQueue(t *testing.T, s *Store, q int) []*core.StoredMessage {
	t.Helper()
	var out []*core.StoredMessage
	for off := int64(0); ; {
		res, err := s.Read(t.Context(), core.ReadRequest{Topic: crashTopic, Queue: q, Offset: off, MaxCount: 4096})
		require.NoError(t, err, "read queue %d at %d", q, off)
		require.False(t, res.Clamped, "read queue %d at %d: clamped to %+v", q, off, res.Range)
		out = append(out, res.Messages...)
		if res.NextOffset == off {
			require.Equal(t, res.Range.Max, off, "read queue %d stopped at %d", q, off)
			return out
		}
		off = res.NextOffset
	}
}
