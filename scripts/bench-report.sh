#!/usr/bin/env bash
# bench-report.sh: the side-by-side benchmark report (docs/BENCHMARKS.md):
# ferrymq against Mosquitto, nats-server (MQTT over JetStream) and plain
# mochi-mqtt, the same `ferrymq bench` load against each, on this machine,
# each broker freshly started (new data directory) for each scenario and
# stopped by its PID. Writes OUT_DIR/results.jsonl (one record per run:
# scenario, broker, version, durability, the exact bench command, broker CPU
# and memory, the bench result), then OUT_DIR/report.md (one table per
# scenario, every row with its ratio to ferrymq, and a summary) and
# OUT_DIR/chart.png (scripts/bench-report.py, gnuplot).
#
# Usage: scripts/bench-report.sh [SCENARIO...]
#
#   idle-mem    IDLE_CONNS idle MQTT connections from IDLE_SOURCE, 127.0.0.3, …;
#               broker VmRSS before and while holding them
#   connect     CONNECT_CONNS raw CONNECTs by CONNECT_WORKERS workers
#   fanin-qos0  FANIN_PUBLISHERS publishers × FANIN_COUNT messages of
#               FANIN_SIZE bytes at QoS 0, FANIN_INFLIGHT in flight, one
#               wildcard subscriber
#   fanin-qos1  the same at QoS 1
#   fanout      one publisher, FANOUT_SUBSCRIBERS subscribers of its topic,
#               FANOUT_COUNT messages at QoS 1
#   p2p         P2P_PAIRS pairs: publisher i → topic p2p/i → subscriber i
#               (a backend sending each device its own commands), P2P_COUNT
#               messages each at QoS 1
#   latency     LAT_PUBLISHERS publishers paced at LAT_RATE msgs/s in all for
#               LAT_DURATION at QoS 1, one subscriber: publish → receipt
#               p50/p99/p99.9 (ferrymq: also → a core consumer group)
#   slow        the latency load plus SLOW_SUBSCRIBERS subscribers that never
#               read: does the healthy subscriber suffer, does memory grow?
#   ordered     ordered consumption of ORDERED_COUNT stored messages by
#               ORDERED_CONSUMERS consumers (`bench core --ordered`): ferrymq's
#               core (ORDERED_KEYS keys over ORDERED_PARTITIONS queues, an
#               orderly group) vs JetStream (ORDERED_PARTITIONS partition
#               subjects, one durable per consumer over its share: a key
#               hashed to a subject keeps its order); Mosquitto and mochi have
#               no stored, ordered consumption
#   (each pubsub scenario also reports broker CPU seconds per million messages)
#
# Default: all scenarios. Environment (defaults in brackets):
#   PEERS        brokers to run [mosquitto nats mochi ferrymq ferrymq-async]:
#                  ferrymq              ferrymq serve --flush sync (fsync before every ack)
#                  ferrymq-async        ferrymq with --flush async (fsync every 500 ms)
#                  also available: mosquitto-unlimited (max_queued_messages 0),
#                  nats-sync (nats-server with sync_interval: always)
#   PORT         MQTT port of the broker under test [21883]; ferrymq also
#                uses PORT+1 (ws), +2 (core), +3 (http); nats PORT+4
#                (clients); mochi PORT+1 (ws), PORT+2 (info)
#   PIN          1: broker on CPU 0, load generator on CPU 1 (taskset) [1]
#   SETTLE       seconds to let a broker settle before reading VmRSS [3]
#   PEER_BIN     where nats-server and mochi are installed [~/.cache/ferrymq-peers/bin]
#   OUT_DIR      logs, configs, results.jsonl, report.md, chart.png [a new temp dir, kept]
#   RUN_TIMEOUT  seconds one bench run may take [900]
#   and each scenario's parameters named above.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

PEERS=${PEERS:-"mosquitto nats mochi ferrymq ferrymq-async"}
PORT=${PORT:-21883}
PIN=${PIN:-1}
SETTLE=${SETTLE:-3}
PEER_BIN=${PEER_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/ferrymq-peers/bin}
RUN_TIMEOUT=${RUN_TIMEOUT:-900}
NATS_VERSION=v2.15.2
MOCHI_VERSION=v2.7.9

IDLE_CONNS=${IDLE_CONNS:-15000}
IDLE_SOURCE=${IDLE_SOURCE:-127.0.0.2}
CONNECT_CONNS=${CONNECT_CONNS:-5000}
CONNECT_WORKERS=${CONNECT_WORKERS:-16}
FANIN_PUBLISHERS=${FANIN_PUBLISHERS:-100}
FANIN_COUNT=${FANIN_COUNT:-1000}
FANIN_SIZE=${FANIN_SIZE:-256}
FANIN_INFLIGHT=${FANIN_INFLIGHT:-64}
FANOUT_SUBSCRIBERS=${FANOUT_SUBSCRIBERS:-1000}
FANOUT_COUNT=${FANOUT_COUNT:-200}
P2P_PAIRS=${P2P_PAIRS:-500}
P2P_COUNT=${P2P_COUNT:-100}
LAT_PUBLISHERS=${LAT_PUBLISHERS:-10}
LAT_RATE=${LAT_RATE:-5000}
LAT_DURATION=${LAT_DURATION:-10s}
SLOW_SUBSCRIBERS=${SLOW_SUBSCRIBERS:-1}
SLOW_DURATION=${SLOW_DURATION:-15s}
ORDERED_COUNT=${ORDERED_COUNT:-500000}
ORDERED_KEYS=${ORDERED_KEYS:-1000}
ORDERED_PARTITIONS=${ORDERED_PARTITIONS:-8}
ORDERED_CONSUMERS=${ORDERED_CONSUMERS:-4}
DRAIN=${DRAIN:-120s}

ALL_SCENARIOS="idle-mem connect fanin-qos0 fanin-qos1 fanout p2p latency slow ordered"
SCENARIOS=${*:-$ALL_SCENARIOS}
DATE=$(date -u +%F)
CLK_TCK=$(getconf CLK_TCK)

log() { echo "bench-report: $*" >&2; }
die() {
	log "$*"
	exit 1
}

for s in $SCENARIOS; do
	case " $ALL_SCENARIOS " in *" $s "*) ;; *) die "unknown scenario $s (one of: $ALL_SCENARIOS)" ;; esac
done

# --- setup -------------------------------------------------------------------

OUT_DIR=${OUT_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/bench-report.XXXXXX")}
mkdir -p "$OUT_DIR"
PIDS=$OUT_DIR/pids # every process started, killed at the end if still there
: >"$PIDS"
: >"$OUT_DIR/results.jsonl"
FAILED=0

cleanup() {
	local pid
	while read -r pid; do
		kill -TERM "$pid" 2>/dev/null || true
	done <"$PIDS"
	log "logs, configs, results.jsonl and the report are in $OUT_DIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

as_root() {
	if ((EUID == 0)); then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else die "need root for: $*"; fi
}
apt_install() {
	log "installing $* from Debian"
	as_root apt-get update -qq >&2
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
}

need_peer() { [[ " $PEERS " == *" $1"* ]]; }

command -v jq >/dev/null || apt_install jq
command -v python3 >/dev/null || apt_install python3
command -v gnuplot >/dev/null || apt_install gnuplot-nox

MOSQUITTO=$(command -v mosquitto || echo /usr/sbin/mosquitto)
if need_peer mosquitto && [[ ! -x $MOSQUITTO ]]; then
	apt_install mosquitto
	MOSQUITTO=$(command -v mosquitto || echo /usr/sbin/mosquitto)
fi

NATS=$PEER_BIN/nats-server
if need_peer nats && ! "$NATS" --version 2>/dev/null | grep -q "$NATS_VERSION"; then
	log "installing nats-server $NATS_VERSION into $PEER_BIN"
	mkdir -p "$PEER_BIN"
	GOBIN=$PEER_BIN go install "github.com/nats-io/nats-server/v2@$NATS_VERSION" >&2
fi

# Plain mochi-mqtt: the example server of the module's cmd/ (in memory,
# every client allowed, mochi's default options), built as it is.
MOCHI=$PEER_BIN/mochi-$MOCHI_VERSION
if need_peer mochi && [[ ! -x $MOCHI ]]; then
	log "installing mochi-mqtt $MOCHI_VERSION's example server into $PEER_BIN"
	mkdir -p "$PEER_BIN"
	tmp=$(mktemp -d)
	GOBIN=$tmp go install "github.com/mochi-mqtt/server/v2/cmd@$MOCHI_VERSION" >&2
	mv "$tmp/cmd" "$MOCHI"
	rm -rf "$tmp"
fi

FERRYMQ=$OUT_DIR/ferrymq
log "building ferrymq"
(cd "$ROOT" && go build -o "$FERRYMQ" ./cmd/ferrymq) >&2
FERRYMQ_VERSION="ferrymq $(cd "$ROOT" && git describe --always --dirty 2>/dev/null || echo dev)"

BROKER_CPU=()
BENCH_CPU=()
if ((PIN == 1)) && command -v taskset >/dev/null && (($(nproc) >= 2)); then
	BROKER_CPU=(taskset -c 0)
	BENCH_CPU=(taskset -c 1)
fi

# --- brokers -----------------------------------------------------------------

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

durability() {
	case $1 in
	mosquitto) echo "memory, queue 1000 per client" ;;
	mosquitto-unlimited) echo "memory, queue unlimited" ;;
	nats) echo "JetStream file, fsync every 2 min" ;;
	nats-sync) echo "JetStream file, fsync every write" ;;
	mochi) echo "memory" ;;
	ferrymq) echo "commit log, fsync before ack" ;;
	ferrymq-async) echo "commit log, fsync every 500 ms" ;;
	esac
}

version() {
	case $1 in
	mosquitto*) "$MOSQUITTO" -h 2>&1 | head -n 1 | sed 's/ version / /' ;;
	nats*) echo "nats-server $("$NATS" --version | sed 's/^nats-server: //')" ;;
	mochi) echo "mochi-mqtt $MOCHI_VERSION" ;;
	ferrymq*) echo "$FERRYMQ_VERSION" ;;
	esac
}

# start_broker PEER DIR: starts PEER with its data and config in DIR, waits
# until it accepts MQTT connections and sets BROKER_PID.
start_broker() {
	local peer=$1 dir=$2
	mkdir -p "$dir"
	if port_open "$PORT"; then
		die "port $PORT is taken: stop whatever listens there or set PORT"
	fi
	local cmd
	case $peer in
	mosquitto | mosquitto-unlimited)
		{
			echo "listener $PORT 127.0.0.1"
			echo "allow_anonymous true"
			echo "persistence false"
			echo "max_connections -1"
			echo "user $(id -un)" # as root: do not switch to user mosquitto
			echo "log_dest stderr"
			echo "log_type error"
			echo "log_type warning"
			[[ $peer == mosquitto-unlimited ]] && echo "max_queued_messages 0"
		} >"$dir/mosquitto.conf"
		cmd=("$MOSQUITTO" -c "$dir/mosquitto.conf")
		;;
	nats | nats-sync)
		{
			echo "server_name: bench"
			echo "listen: 127.0.0.1:$((PORT + 4))"
			echo "jetstream {"
			echo "  store_dir: \"$dir/jetstream\""
			[[ $peer == nats-sync ]] && echo "  sync_interval: always"
			echo "}"
			echo "mqtt { listen: \"127.0.0.1:$PORT\" }"
		} >"$dir/nats.conf"
		cmd=("$NATS" -c "$dir/nats.conf")
		;;
	mochi)
		cmd=("$MOCHI" -tcp "127.0.0.1:$PORT" -ws "127.0.0.1:$((PORT + 1))" -info "127.0.0.1:$((PORT + 2))")
		;;
	ferrymq | ferrymq-async)
		local flush=sync
		[[ $peer == ferrymq-async ]] && flush=async
		cmd=("$FERRYMQ" serve --data "$dir/data" --flush "$flush" --mqtt "127.0.0.1:$PORT" --ws "127.0.0.1:$((PORT + 1))"
			--core "127.0.0.1:$((PORT + 2))" --http "127.0.0.1:$((PORT + 3))")
		;;
	*) die "unknown peer $peer" ;;
	esac
	echo "${cmd[*]}" >"$dir/broker.cmd"
	"${BROKER_CPU[@]}" "${cmd[@]}" >"$dir/broker.log" 2>&1 &
	BROKER_PID=$!
	echo "$BROKER_PID" >>"$PIDS"
	local i
	for ((i = 0; i < 400; i++)); do
		port_open "$PORT" && return 0
		kill -0 "$BROKER_PID" 2>/dev/null || break
		sleep 0.05
	done
	tail -n 20 "$dir/broker.log" >&2 || true
	die "$peer did not come up on port $PORT"
}

stop_broker() {
	[[ -n ${BROKER_PID:-} ]] || return 0
	kill -TERM "$BROKER_PID" 2>/dev/null || true
	local i
	for ((i = 0; i < 200; i++)); do
		kill -0 "$BROKER_PID" 2>/dev/null || break
		sleep 0.05
	done
	kill -KILL "$BROKER_PID" 2>/dev/null || true
	wait "$BROKER_PID" 2>/dev/null || true
	BROKER_PID=
	for ((i = 0; i < 100; i++)); do # let the ports go before the next broker binds them
		port_open "$PORT" || port_open "$((PORT + 4))" || return 0
		sleep 0.05
	done
}

rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }
hwm_kib() { awk '/^VmHWM:/ { print $2 }' "/proc/$1/status"; }
# CPU time (user + system) in clock ticks; fields after the ")" of comm.
cpu_ticks() { sed 's/^.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'; }

# record SCENARIO PEER OUT CMD CPU_TICKS RSS_BEFORE RSS_AFTER HWM: appends the
# run's record to results.jsonl.
record() {
	jq -c --arg scenario "$1" --arg peer "$2" --arg cmd "$4" --arg date "$DATE" \
		--arg durability "$(durability "$2")" --arg version "$(version "$2")" \
		--argjson cpu "$(awk -v t="$5" -v hz="$CLK_TCK" 'BEGIN { printf "%.3f", t / hz }')" \
		--argjson rss0 "$6" --argjson rss1 "$7" --argjson hwm "$8" --arg pinned "$( ((${#BROKER_CPU[@]} > 0)) && echo yes || echo no)" \
		'{scenario: $scenario, peer: $peer, version: $version, durability: $durability, date: $date, command: $cmd,
		  pinned: ($pinned == "yes"), broker_cpu_s: $cpu, rss_before_kib: $rss0, rss_after_kib: $rss1, rss_peak_kib: $hwm, result: .}' \
		"$3.json" >>"$OUT_DIR/results.jsonl"
}

# bench SCENARIO PEER OUT ARGS...: runs `ferrymq bench ARGS --json` against the
# broker under test (BROKER_PID), the result to OUT.json, the progress to
# OUT.log, and records it.
bench() {
	local scenario=$1 peer=$2 out=$3
	shift 3
	local cpu0 rss0
	cpu0=$(cpu_ticks "$BROKER_PID")
	rss0=$(rss_kib "$BROKER_PID")
	cmdline "$@" >"$out.cmd"
	timeout --signal=TERM "$RUN_TIMEOUT" "${BENCH_CPU[@]}" "$FERRYMQ" bench "$@" --json >"$out.json" 2>"$out.log" || {
		tr '\r' '\n' <"$out.log" | tail -n 5 >&2
		return 1
	}
	record "$scenario" "$peer" "$out" "$(cmdline "$@")" "$(($(cpu_ticks "$BROKER_PID") - cpu0))" "$rss0" \
		"$(rss_kib "$BROKER_PID")" "$(hwm_kib "$BROKER_PID")"
	jq -r --arg run "$scenario/$peer" '.errors // [] | .[:5][] | "\($run): \(.count)× \(.err)"' "$out.json" >&2
}

mqtt_addr() { echo "tcp://127.0.0.1:$PORT"; }

# cmdline ARGS...: `ferrymq bench ARGS` as one would type it.
cmdline() {
	local out="ferrymq bench" a
	for a in "$@"; do
		if [[ $a =~ [^A-Za-z0-9_./:%=,+-] ]]; then out+=" '$a'"; else out+=" $a"; fi
	done
	echo "$out"
}

# --- scenarios ----------------------------------------------------------------

run_pubsub() {
	local scenario=$1 peer=$2 dir=$3
	local args=(mqtt --addr "$(mqtt_addr)" --drain "$DRAIN" --label "$(durability "$peer")")
	case $scenario in
	fanin-qos1 | fanin-qos0)
		args+=(--qos "${scenario#fanin-qos}" --publishers "$FANIN_PUBLISHERS" --subscribers 1
			--count "$FANIN_COUNT" --size "$FANIN_SIZE" --inflight "$FANIN_INFLIGHT")
		;;
	fanout)
		args+=(--qos 1 --publishers 1 --subscribers "$FANOUT_SUBSCRIBERS" --count "$FANOUT_COUNT" --size 256
			--topic fanout/all --filter fanout/all --workers 32)
		;;
	p2p)
		args+=(--qos 1 --publishers "$P2P_PAIRS" --subscribers "$P2P_PAIRS" --count "$P2P_COUNT" --size 256
			--topic 'p2p/%i' --filter 'p2p/%i' --workers 32)
		;;
	latency | slow)
		local duration=$LAT_DURATION
		[[ $scenario == slow ]] && duration=$SLOW_DURATION
		args+=(--qos 1 --publishers "$LAT_PUBLISHERS" --subscribers 1 --rate "$LAT_RATE" --duration "$duration" --size 256)
		[[ $scenario == slow ]] && args+=(--slow-subscribers "$SLOW_SUBSCRIBERS")
		if [[ $peer == ferrymq* && $scenario == latency ]]; then
			# device → backend: a core consumer group on the topic the gateway
			# bridges bench/# to (the first level names the core topic)
			args+=(--core "127.0.0.1:$((PORT + 2))" --core-topic bench --core-group "lat-$$")
		fi
		;;
	esac
	start_broker "$peer" "$dir"
	sleep 1
	bench "$scenario" "$peer" "$dir/$scenario" "${args[@]}"
}

run_idle() {
	local peer=$1 dir=$2
	start_broker "$peer" "$dir"
	sleep "$SETTLE"
	local before after out=$dir/idle-mem
	local args=(mqtt --addr "$(mqtt_addr)" --mode idle --conns "$IDLE_CONNS" --source "$IDLE_SOURCE" --keepalive 300s
		--label "$(durability "$peer")")
	cmdline "${args[@]}" >"$out.cmd"
	before=$(rss_kib "$BROKER_PID")
	local cpu0
	cpu0=$(cpu_ticks "$BROKER_PID")
	: >"$out.log"
	"${BENCH_CPU[@]}" "$FERRYMQ" bench "${args[@]}" --json >"$out.json" 2>"$out.log" &
	local bench_pid=$! i
	echo "$bench_pid" >>"$PIDS"
	for ((i = 0; i < RUN_TIMEOUT * 10; i++)); do
		grep -q '^holding [0-9]* connections' "$out.log" && break
		kill -0 "$bench_pid" 2>/dev/null || break
		sleep 0.1
	done
	if ! grep -q '^holding [0-9]* connections' "$out.log"; then
		kill -TERM "$bench_pid" 2>/dev/null || true
		wait "$bench_pid" || true
		tr '\r' '\n' <"$out.log" | tail -n 5 >&2
		die "$peer: the connections did not come up"
	fi
	sleep "$SETTLE"
	after=$(rss_kib "$BROKER_PID")
	local ticks=$(($(cpu_ticks "$BROKER_PID") - cpu0)) hwm
	hwm=$(hwm_kib "$BROKER_PID")
	kill -TERM "$bench_pid"
	wait "$bench_pid" || die "$peer: bench mqtt --mode idle failed: $(tail -c 300 "$out.log")"
	record idle-mem "$peer" "$out" "$(cmdline "${args[@]}")" "$ticks" "$before" "$after" "$hwm"
}

run_connect() {
	local peer=$1 dir=$2
	start_broker "$peer" "$dir"
	sleep 1
	bench connect "$peer" "$dir/connect" mqtt --addr "$(mqtt_addr)" --mode connect --conns "$CONNECT_CONNS" \
		--workers "$CONNECT_WORKERS" --label "$(durability "$peer")"
}

# ordered: ferrymq's core (orderly consumer group) against JetStream (one
# durable per consumer over its share of the subjects): fill, then consume.
run_ordered() {
	local peer=$1 dir=$2
	local args=(core --mode consume --ordered --count "$ORDERED_COUNT" --consumers "$ORDERED_CONSUMERS"
		--producers 8 --size 256 --label "$(durability "$peer")")
	case $peer in
	ferrymq*) args+=(--server "127.0.0.1:$((PORT + 2))" --keys "$ORDERED_KEYS" --queues "$ORDERED_PARTITIONS") ;;
	nats*) args+=(--target jetstream --server "127.0.0.1:$((PORT + 4))" --keys "$ORDERED_PARTITIONS") ;;
	*)
		log "ordered: $peer has no stored, ordered consumption; skipped"
		return 0
		;;
	esac
	start_broker "$peer" "$dir"
	sleep 1
	bench ordered "$peer" "$dir/ordered" "${args[@]}"
}

# run_one SCENARIO PEER: one broker, freshly started, one scenario; runs in
# a subshell of its own so that a failure ends only this row.
run_one() {
	local scenario=$1 peer=$2
	local dir=$OUT_DIR/$scenario/$peer
	mkdir -p "$dir"
	BROKER_PID=
	trap stop_broker EXIT
	trap 'exit 130' INT TERM
	log "$scenario: $peer"
	case $scenario in
	idle-mem) run_idle "$peer" "$dir" ;;
	connect) run_connect "$peer" "$dir" ;;
	ordered) run_ordered "$peer" "$dir" ;;
	*) run_pubsub "$scenario" "$peer" "$dir" ;;
	esac
}

log "results in $OUT_DIR; pinning: $( ((${#BROKER_CPU[@]} > 0)) && echo "broker CPU 0, bench CPU 1" || echo none)"
for scenario in $SCENARIOS; do
	for peer in $PEERS; do
		# errexit holds inside a background subshell, not in an `if` test.
		(run_one "$scenario" "$peer") &
		if ! wait $!; then
			FAILED=$((FAILED + 1))
			log "$scenario: $peer failed; going on with the others"
		fi
	done
done

python3 "$ROOT/scripts/bench-report.py" --machine "$(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), $(uname -sr)" \
	"$OUT_DIR/results.jsonl" "$OUT_DIR/report.md" "$OUT_DIR/chart.dat"
gnuplot -e "datafile='$OUT_DIR/chart.dat'; outfile='$OUT_DIR/chart.png'" "$ROOT/scripts/bench-report.gp"
log "report: $OUT_DIR/report.md, chart: $OUT_DIR/chart.png"
((FAILED == 0)) || log "$FAILED runs failed"
exit $((FAILED > 0))
