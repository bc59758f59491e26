package store

import (
	"sync/atomic"
	"time"
)

// FsyncBuckets are the upper bounds, in seconds, of the buckets
// Stats.FsyncCounts counts commit-log fsyncs in (the last bucket, beyond
// them, is implicit): Prometheus's default latency buckets, from half a
// millisecond to ten seconds.
var FsyncBuckets = [...]float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// fsyncTimes counts fsync durations per bucket, lock-free: the writer and
// the flusher record, a scrape reads.
type fsyncTimes struct {
	counts [len(FsyncBuckets) + 1]atomic.Int64
	sumNs  atomic.Int64
}

func (f *fsyncTimes) record(d time.Duration) {
	sec := d.Seconds()
	i := 0
	for i < len(FsyncBuckets) && sec > FsyncBuckets[i] {
		i++
	}
	f.counts[i].Add(1)
	f.sumNs.Add(int64(d))
}

// snapshot copies the counts (not cumulative) and the sum.
func (f *fsyncTimes) snapshot() ([]int64, time.Duration) {
	out := make([]int64, len(f.counts))
	for i := range f.counts {
		out[i] = f.counts[i].Load()
	}
	return out, time.Duration(f.sumNs.Load())
}
