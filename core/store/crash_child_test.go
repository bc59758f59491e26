package store

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/ferrymq/ferrymq/core"
)

// The child half of TestCrashKill9 (crash_test.go). The test binary re-executes
// itself with crashChildDirEnv set; TestMain calls runCrashChild before
// anything else, and the child then produces into the store until the parent
// kills it with SIGKILL.
const (
	// crashChildDirEnv names the data directory; its presence makes the
	// process a crash child.
	crashChildDirEnv = "FERRYMQ_CRASH_CHILD_DIR"
	// crashChildSeqEnv is the first sequence number each producer uses, so
	// that sequence numbers keep increasing across rounds on the same dir.
	crashChildSeqEnv = "FERRYMQ_CRASH_CHILD_SEQ"

	crashProducers = 8
	crashTopic     = "crash"
	// crashBodyLen is the size of a message body: producer (u32), sequence
	// number (u64), then filler derived from both, so that a body from the
	// wrong place is recognised.
	crashBodyLen = 4 + 8 + 52
)

// crashOptions are the options of both the child and the parent's reopen.
// SegmentBytes is small so that segments roll many times per round;
// MaxMessageBytes must not exceed it.
func crashOptions() Options {
	return Options{
		FlushPolicy:     FlushSync,
		SegmentBytes:    64 << 10,
		MaxMessageBytes: 16 << 10,
		DefaultQueues:   4,
	}
}

func crashKey(g int) string { return "k" + strconv.Itoa(g) }

// crashBody encodes (producer, seq) into a body.
func crashBody(g int, seq uint64) []byte {
	b := make([]byte, crashBodyLen)
	binary.BigEndian.PutUint32(b[0:], uint32(g))
	binary.BigEndian.PutUint64(b[4:], seq)
	for i := 12; i < len(b); i++ {
		b[i] = byte(uint64(g)*31 + seq*7 + uint64(i))
	}
	return b
}

// runCrashChild returns false unless the process is a crash child. A crash
// child never returns: it produces until it is killed, and exits with status
// 3 if anything fails, so that the parent can tell a failure from its kill.
func runCrashChild() bool {
	dir := os.Getenv(crashChildDirEnv)
	if dir == "" {
		return false
	}
	die := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "crash child: "+format+"\n", args...)
		os.Exit(3)
	}
	var base uint64
	if v := os.Getenv(crashChildSeqEnv); v != "" {
		var err error
		if base, err = strconv.ParseUint(v, 10, 64); err != nil {
			die("bad %s=%q: %v", crashChildSeqEnv, v, err)
		}
	}
	// An orphan (the parent died before it could kill the child) ends by
	// itself; so does a child whose parent is gone, on its next write
	// (SIGPIPE on stdout).
	time.AfterFunc(time.Minute, func() { die("not killed within a minute") })

	s, err := Open(dir, crashOptions())
	if err != nil {
		die("open %s: %v", dir, err)
	}

	// os.Stdout is an unbuffered *os.File: every line is one write(2) to the
	// pipe (shorter than PIPE_BUF, so atomic). Once Write returns, the line
	// is in the kernel and survives the kill.
	var outMu sync.Mutex
	failed := make(chan error, crashProducers)
	for g := 0; g < crashProducers; g++ {
		go func() {
			key := crashKey(g)
			for seq := base; ; seq++ {
				r, err := s.Produce(context.Background(), &core.Message{
					Topic:       crashTopic,
					ShardingKey: key,
					Body:        crashBody(g, seq),
				})
				if err != nil {
					failed <- fmt.Errorf("produce %s seq %d: %w", key, seq, err)
					return
				}
				line := fmt.Sprintf("%s %s %d %d %s %d\n", r.ID, r.Topic, r.Queue, r.QueueOffset, key, seq)
				outMu.Lock()
				_, err = os.Stdout.WriteString(line)
				outMu.Unlock()
				if err != nil {
					failed <- fmt.Errorf("write ack: %w", err)
					return
				}
			}
		}()
	}
	die("%v", <-failed)
	return true // unreachable: die exits
}
