#!/usr/bin/env bash
# The raw limits of the disk under the data directory, for comparison with
# the store's benchmarks: sequential write bandwidth with a final fsync (dd),
# and the latency of small write+fdatasync pairs (dd oflag=dsync).
# Usage: scripts/bench-disk.sh [dir]   (default: $TMPDIR or /tmp)
set -euo pipefail
dir="${1:-${TMPDIR:-/tmp}}/ferrymq-disk-bench.$$"
mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT

echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(date -u +%F)"
echo "dir: $dir ($(df -h "$dir" | awk 'NR==2{print $1}'))"

echo "sequential write, 1 GiB in 1 MiB blocks, fsync at the end:"
dd if=/dev/zero of="$dir/seq" bs=1M count=1024 conv=fsync 2>&1 | tail -1
rm -f "$dir/seq"

echo "1 KiB writes, each followed by fdatasync (fsync latency), 4000 of them:"
dd if=/dev/zero of="$dir/dsync" bs=1k count=4000 oflag=dsync 2>&1 | tail -1
