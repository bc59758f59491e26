#!/usr/bin/env bash
# The long torture run (docs/torture.md): builds ferrymq, then runs
# `ferrymq bench torture` for 10 minutes — ferrymq serve --flush sync as a
# child process on a tmpfs, 32 MQTT devices and the backends, SIGKILL and
# restart every ~30 s, a full disk every 2 minutes, devices cut off,
# malformed packets — and checks that nothing acknowledged was lost or
# reordered. Needs root for the tmpfs (without it the disk-full windows are
# skipped and the report says so). CI runs the 60-second version
# (TestBinaryTorture in cmd/ferrymq).
#
# Usage: scripts/torture.sh [extra bench torture flags]
#   DURATION=3m scripts/torture.sh             a shorter run
#   scripts/torture.sh --json > torture.json   the report as one JSON line
#   scripts/torture.sh --strict                known gaps fail the run too
# The exit status is 1 when a check failed; the working folder (server log,
# config, a copy of the data of a failed run) is then kept and named in
# the report.
set -euo pipefail
cd "$(dirname "$0")/.."

out="${TMPDIR:-/tmp}/ferrymq-torture.$$"
mkdir -p "$out"
go build -o "$out/ferrymq" ./cmd/ferrymq

echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB; $(date -u '+%F %T') UTC; $(go version)" >&2
exec "$out/ferrymq" bench torture \
  --duration "${DURATION:-10m}" \
  --devices 32 --rate 20 --size 128 \
  --kill-every 30s --disk-full-every 2m --disk-full-hold 5s \
  --disconnect-every 1s --malformed-every 500ms --command-every 50ms \
  --drain 60s --max-rss-mib 256 \
  --dir "$out/run" \
  "$@"
