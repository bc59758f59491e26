#!/usr/bin/env bash
# The raw limits of the disk under the data directory, for comparison with
# the store's benchmarks: sequential write bandwidth with a final fsync (dd),
# the latency of small write+fdatasync pairs (dd oflag=dsync), and
# sequential read bandwidth of a file not in the page cache — with O_DIRECT
# (dd iflag=direct), and buffered with readahead after the file's pages were
# dropped (dd oflag=nocache), the way the store's cold reads read.
# Usage: scripts/bench-disk.sh [dir]   (default: $TMPDIR or /tmp)
# The last line, "sequential read MB/s: N" (the larger of the two reads),
# is for scripts (bench-isolation.sh).
set -euo pipefail
dir="${1:-${TMPDIR:-/tmp}}/ferrymq-disk-bench.$$"
mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT

echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(date -u +%F)"
echo "dir: $dir ($(df -h "$dir" | awk 'NR==2{print $1}'))"

echo "sequential write, 1 GiB in 1 MiB blocks, fsync at the end:"
dd if=/dev/zero of="$dir/seq" bs=1M count=1024 conv=fsync 2>&1 | tail -1

# rate: dd's last line ("N bytes (…) copied, S s, …") → MB/s
rate() { awk '{ printf "%.0f", $1 / $(NF-3) / 1e6 }'; }
drop() { dd if=/dev/null of="$dir/seq" oflag=nocache conv=notrunc,fdatasync count=0 2>/dev/null; }

echo "sequential read, 1 GiB in 1 MiB blocks, O_DIRECT (no page cache):"
direct=$(dd if="$dir/seq" of=/dev/null bs=1M iflag=direct 2>&1 | tail -1)
echo "$direct"
drop
echo "sequential read, 1 GiB in 1 MiB blocks, buffered, the file's pages dropped first:"
buffered=$(dd if="$dir/seq" of=/dev/null bs=1M 2>&1 | tail -1)
echo "$buffered"
rm -f "$dir/seq"

echo "1 KiB writes, each followed by fdatasync (fsync latency), 4000 of them:"
dd if=/dev/zero of="$dir/dsync" bs=1k count=4000 oflag=dsync 2>&1 | tail -1

d=$(rate <<<"$direct") b=$(rate <<<"$buffered")
echo "sequential read MB/s: $((d > b ? d : b))"
