#!/usr/bin/env bash
# Synchronous calls to devices (issue #24): DEVICES connected MQTT 5
# devices answer calls made at RATE calls/s for DURATION (`ferrymq bench
# rpc`, open loop, latency from when each call was due). Three rows, one
# run, the servers on CPU 0 and the load on CPU 1:
#   ferrymq rrpc   calls over the core port (Client.Call), the gateway
#                  delivers each on $rpc/{device}/request/{id}
#   ferrymq mqtt   what a backend without RRPC builds: MQTT 5
#                  request/response through ferrymq's gateway (the default
#                  bridge stores each request in the core first)
#   mosquitto mqtt the same through Mosquitto (in memory, no persistence)
# Each row also gives the server's CPU seconds during the run.
#
# Usage: scripts/bench-rpc.sh
# Environment (defaults in brackets): DEVICES [1000] RATE [1000]
#   DURATION [30s] DIR [/tmp/ferrymq-bench-rpc]
set -euo pipefail
cd "$(dirname "$0")/.."
devices=${DEVICES:-1000}
rate=${RATE:-1000}
duration=${DURATION:-30s}
dir=${DIR:-/tmp/ferrymq-bench-rpc}
rm -rf "$dir" && mkdir -p "$dir"
go build -o "$dir/ferrymq" ./cmd/ferrymq
bin="$dir/ferrymq"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
ticks=$(getconf CLK_TCK)
cpu() { awk '{print $14+$15}' "/proc/$1/stat"; } # utime+stime, in clock ticks

wait_port() { for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 not open" >&2; return 1; }

row() { # name pid args...
  local name=$1 pid=$2; shift 2
  local c0; c0=$(cpu "$pid")
  local out; out=$(taskset -c 1 "$bin" bench rpc --devices "$devices" --rate "$rate" --duration "$duration" --json "$@" 2>"$dir/$name.progress")
  local c1; c1=$(cpu "$pid")
  echo "$out" | python3 -c '
import json, sys
r = json.loads(sys.stdin.read()); name, cpu = sys.argv[1], float(sys.argv[2])
ms = lambda ns: "%.2f ms" % (ns / 1e6)
print("| %s | %d | %d | %d | %d | %d | %s | %s | %s | %s | %.1f |" % (name, r["calls"], r["answered"], r["timeouts"], r["not_connected"], r["errors"],
  ms(r["p50_ns"]), ms(r["p90_ns"]), ms(r["p99_ns"]), ms(r["max_ns"]), cpu))' "$name" "$(echo "($c1 - $c0) / $ticks" | bc -l)"
}

echo "# bench-rpc $(date -u +%Y-%m-%dT%H:%M:%SZ) $(nproc) cores: ${devices} devices, ${rate} calls/s for ${duration} (+2 s warm-up), 64 B requests echoed"
echo "| target | calls | answered | timeouts | not connected | errors | p50 | p90 | p99 | max | server CPU-s |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"

taskset -c 0 "$bin" serve --data "$dir/data" --mqtt 127.0.0.1:21883 --ws "" --core 127.0.0.1:20911 --http 127.0.0.1:28083 >"$dir/serve.log" 2>&1 &
pids+=($!); fpid=$!
wait_port 20911; wait_port 21883
row "ferrymq rrpc" "$fpid" --mqtt 127.0.0.1:21883 --server 127.0.0.1:20911
row "ferrymq mqtt" "$fpid" --target mqtt --mqtt 127.0.0.1:21883 --conns 4

printf 'listener 21884 127.0.0.1\nallow_anonymous true\nmax_queued_messages 0\npersistence false\n' >"$dir/mosquitto.conf"
taskset -c 0 mosquitto -c "$dir/mosquitto.conf" >"$dir/mosquitto.log" 2>&1 &
pids+=($!); mpid=$!
wait_port 21884
row "mosquitto mqtt" "$mpid" --target mqtt --mqtt 127.0.0.1:21884 --conns 4
