#!/usr/bin/env bash
# QoS 1 fan-in through the gateway into each engine, on this machine
# (issue #10), with `ferrymq bench mqtt`:
#
#   embedded-sync    one serve node, --flush sync (fsync before PUBACK, group commit)
#   embedded-async   one serve node, --flush async (page cache, fsync every 500 ms)
#   nats-r3          two serve nodes (engine: nats) on a 3-node R3 cluster with
#                    sync_interval: always (scripts/nats-cluster.sh); half the
#                    publishers on each node
#   nats-r3-default  the same with the servers' default sync_interval (2 min)
#
# Each case starts from empty data and stops what it started (by PID). Rows
# go to $OUT/results.txt: case, acked/s (sum over bench processes), and each
# bench process's p50/p99/p99.9 acknowledgement latency.
#
# Usage: scripts/bench-engines.sh [case ...]
# Environment: PUBLISHERS [20] DURATION [15s] INFLIGHT [64] SIZE [256]
#              RATE [0: as fast as possible; else msgs/s over all publishers]
#              OUT [a new temp dir]
set -euo pipefail
cd "$(dirname "$0")/.."
PUBLISHERS=${PUBLISHERS:-20}
DURATION=${DURATION:-15s}
INFLIGHT=${INFLIGHT:-64}
SIZE=${SIZE:-256}
RATE=${RATE:-0}
OUT=${OUT:-$(mktemp -d /tmp/ferrymq-bench-engines.XXXXXX)}
CASES=${*:-"embedded-sync embedded-async nats-r3 nats-r3-default"}
export FERRYMQ_NATS_DIR="$OUT/nats"
bin="$OUT/ferrymq"
go build -o "$bin" ./cmd/ferrymq
pids=()
log() { echo "bench-engines: $*" >&2; }
stop_all() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	pids=()
	scripts/nats-cluster.sh stop >/dev/null 2>&1 || true
}
trap stop_all EXIT

# serve NAME PORTBASE ARGS...: starts a node, waits for its MQTT port.
serve() {
	local name=$1 base=$2
	shift 2
	"$bin" serve --data "$OUT/$name" --mqtt "127.0.0.1:$base" --ws "" --core "127.0.0.1:$((base + 1))" \
		--http "127.0.0.1:$((base + 2))" "$@" >"$OUT/$name.log" 2>&1 &
	pids+=($!)
	for _ in $(seq 1 600); do
		curl -sf "http://127.0.0.1:$((base + 2))/readyz" >/dev/null && return
		sleep 0.1
	done
	log "$name did not become ready; see $OUT/$name.log"
	exit 1
}

# bench ADDR PUBLISHERS LABEL: one load generator, JSON result on stdout.
bench() {
	local rate=0
	[[ $RATE != 0 ]] && rate=$(awk -v r="$RATE" -v n="$2" -v t="$PUBLISHERS" 'BEGIN{print r*n/t}')
	"$bin" bench mqtt --addr "tcp://$1" --publishers "$2" --subscribers 0 --qos 1 --duration "$DURATION" \
		--inflight "$INFLIGHT" --size "$SIZE" --rate "$rate" --topic "telemetry/$3-%i" --client-prefix "$3-" --json
}

natsconf() { # NODE: a serve config for the JetStream engine
	printf 'engine: nats\nnats:\n  urls: [nats://127.0.0.1:4222, nats://127.0.0.1:4223, nats://127.0.0.1:4224]\n  replicas: 3\n  node: %s\n' "$1" >"$OUT/$1.yaml"
	echo "$OUT/$1.yaml"
}

summary() { # CASE JSON...: one row
	local c=$1
	shift
	python3 - "$c" "$@" <<'PY' | tee -a "$OUT/results.txt"
import json, sys
case, runs = sys.argv[1], [json.loads(a) for a in sys.argv[2:]]
acked = sum(r["acked_per_sec"] for r in runs)
ms = lambda us: "%.1fms" % (us / 1000)
lat = " ".join("%s/%s/%s" % (ms(r["ack_latency"]["p50_us"]), ms(r["ack_latency"]["p99_us"]), ms(r["ack_latency"]["p999_us"])) for r in runs)
print(f"{case:18} {acked:10.0f} acked/s   p50/p99/p99.9 per bench: {lat}")
PY
}

for c in $CASES; do
	log "case $c"
	rm -rf "${OUT:?}/$c" "$FERRYMQ_NATS_DIR"/n[123]
	case $c in
	embedded-sync | embedded-async)
		serve "$c" 31883 --flush "${c#embedded-}"
		r=$(bench 127.0.0.1:31883 "$PUBLISHERS" a)
		summary "$c" "$r"
		;;
	nats-r3 | nats-r3-default)
		if [[ $c == nats-r3-default ]]; then
			mkdir -p "$OUT/conf"
			for i in 1 2 3; do sed '/sync_interval/d' "testdata/nats/n$i.conf" >"$OUT/conf/n$i.conf"; done
			NATS_CONF_DIR="$OUT/conf" scripts/nats-cluster.sh start >/dev/null
		else
			scripts/nats-cluster.sh start >/dev/null
		fi
		serve "$c-a" 31883 --config "$(natsconf node-a)"
		serve "$c-b" 32883 --config "$(natsconf node-b)"
		half=$((PUBLISHERS / 2))
		bench 127.0.0.1:31883 "$half" a >"$OUT/$c-a.json" &
		b1=$!
		bench 127.0.0.1:32883 "$((PUBLISHERS - half))" b >"$OUT/$c-b.json"
		wait $b1
		summary "$c" "$(cat "$OUT/$c-a.json")" "$(cat "$OUT/$c-b.json")"
		;;
	*) log "unknown case $c"; exit 2 ;;
	esac
	stop_all
done
log "results in $OUT/results.txt ($(nproc) cores, $(date -u +%F))"
