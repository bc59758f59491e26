#!/usr/bin/env bash
# bench-mqtt-peers.sh: the same `ferrymq bench mqtt` scenarios against
# Mosquitto, nats-server (MQTT over JetStream) and ferrymq's gateway, one
# after the other on this machine, each broker freshly started for each
# scenario. Prints one Markdown table per scenario, one row per broker, with
# the date, the broker's durability mode and the loss next to every rate.
#
# Usage: scripts/bench-mqtt-peers.sh [SCENARIO...]
#
#   fanin-qos1  FANIN_PUBLISHERS publishers × FANIN_COUNT messages of
#               FANIN_SIZE bytes at QoS 1, as fast as FANIN_INFLIGHT allows,
#               FANIN_SUBSCRIBERS wildcard subscribers
#   fanin-qos0  the same at QoS 0
#               (both wait up to DRAIN for the subscribers to catch up; the
#               wait ends sooner once all arrived or nothing did for 3 s)
#   latency     LAT_PUBLISHERS publishers paced at LAT_RATE msgs/s in all for
#               LAT_DURATION at LAT_QOS: publish → receipt latency under light
#               load (ferrymq: also → core consumer if FERRYMQ_CORE_TOPIC is set)
#   connect     CONNECT_CONNS raw CONNECTs by CONNECT_WORKERS workers
#   idle-mem    IDLE_CONNS idle connections from IDLE_SOURCE, 127.0.0.3, …;
#               broker VmRSS before and while holding them
#
# Default: all scenarios. Environment (defaults in brackets):
#   PEERS        brokers to run [mosquitto mosquitto-unlimited nats nats-sync ferrymq]
#                  mosquitto            2.0.11, in memory, max_queued_messages 1000 (default)
#                  mosquitto-unlimited  the same with max_queued_messages 0 (no limit)
#                  nats                 nats-server v2.15.2, JetStream on disk, default sync_interval (2 min)
#                  nats-sync            the same with sync_interval: always (fsync every write)
#                  ferrymq              ferrymq serve --flush sync (this tree)
#   PORT         MQTT port of the broker under test [21883]; ferrymq also
#                uses PORT+1 (ws), +2 (core), +3 (http); nats PORT+4 (clients)
#   PIN          1: broker on CPU 0, load generator on CPU 1 (taskset) [0]
#   SETTLE       seconds to let a broker settle before reading VmRSS [3]
#   PEER_BIN     where nats-server is installed [~/.cache/ferrymq-peers/bin]
#   OUT_DIR      logs, configs and results.jsonl [a new temp dir, kept on failure]
#   RUN_TIMEOUT  seconds one bench run may take [900]
#   FERRYMQ_CORE_TOPIC  core topic ferrymq's gateway bridges bench/# to [unset]
#   and each scenario's parameters named above.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

PEERS=${PEERS:-"mosquitto mosquitto-unlimited nats nats-sync ferrymq"}
PORT=${PORT:-21883}
PIN=${PIN:-0}
SETTLE=${SETTLE:-3}
PEER_BIN=${PEER_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/ferrymq-peers/bin}
RUN_TIMEOUT=${RUN_TIMEOUT:-900}
NATS_VERSION=${NATS_VERSION:-v2.15.2}
FERRYMQ_CORE_TOPIC=${FERRYMQ_CORE_TOPIC:-}

FANIN_PUBLISHERS=${FANIN_PUBLISHERS:-100}
FANIN_SUBSCRIBERS=${FANIN_SUBSCRIBERS:-1}
FANIN_COUNT=${FANIN_COUNT:-1000}
FANIN_SIZE=${FANIN_SIZE:-256}
FANIN_INFLIGHT=${FANIN_INFLIGHT:-64}
DRAIN=${DRAIN:-600s}
LAT_PUBLISHERS=${LAT_PUBLISHERS:-10}
LAT_RATE=${LAT_RATE:-1000}
LAT_DURATION=${LAT_DURATION:-10s}
LAT_QOS=${LAT_QOS:-1}
LAT_SIZE=${LAT_SIZE:-256}
CONNECT_CONNS=${CONNECT_CONNS:-5000}
CONNECT_WORKERS=${CONNECT_WORKERS:-16}
IDLE_CONNS=${IDLE_CONNS:-15000}
IDLE_SOURCE=${IDLE_SOURCE:-127.0.0.2}
IDLE_KEEPALIVE=${IDLE_KEEPALIVE:-300s}

ALL_SCENARIOS="fanin-qos1 fanin-qos0 latency connect idle-mem"
SCENARIOS=${*:-$ALL_SCENARIOS}
DATE=$(date -u +%F)
CLK_TCK=$(getconf CLK_TCK)

log() { echo "bench-mqtt-peers: $*" >&2; }
die() {
	log "$*"
	exit 1
}

for s in $SCENARIOS; do
	case " $ALL_SCENARIOS " in *" $s "*) ;; *) die "unknown scenario $s (one of: $ALL_SCENARIOS)" ;; esac
done

# --- setup -------------------------------------------------------------------

if [[ -z ${OUT_DIR:-} ]]; then
	OUT_DIR=$(mktemp -d "${TMPDIR:-/tmp}/bench-mqtt-peers.XXXXXX")
	REMOVE_OUT=1
else
	mkdir -p "$OUT_DIR"
	REMOVE_OUT=0
fi
PIDS=$OUT_DIR/pids # every process started, killed at the end if still there
: >"$PIDS"
FAILED=0

cleanup() {
	local pid
	while read -r pid; do
		kill -TERM "$pid" 2>/dev/null || true
	done <"$PIDS"
	if ((FAILED == 0 && REMOVE_OUT == 1)); then
		rm -rf "$OUT_DIR"
	else
		log "logs, configs and results.jsonl are in $OUT_DIR"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

command -v jq >/dev/null || die "jq is needed (apt-get install -y jq)"

as_root() {
	if ((EUID == 0)); then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else die "need root for: $*"; fi
}

need_peer() { [[ " $PEERS " == *" $1"* ]]; }

MOSQUITTO=$(command -v mosquitto || echo /usr/sbin/mosquitto)
if need_peer mosquitto && [[ ! -x $MOSQUITTO ]]; then
	log "installing mosquitto from Debian"
	as_root apt-get update -qq >&2
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto mosquitto-clients >&2
	MOSQUITTO=$(command -v mosquitto || echo /usr/sbin/mosquitto)
fi

NATS=$PEER_BIN/nats-server
if need_peer nats && ! "$NATS" --version 2>/dev/null | grep -q "$NATS_VERSION"; then
	log "installing nats-server $NATS_VERSION into $PEER_BIN"
	mkdir -p "$PEER_BIN"
	GOBIN=$PEER_BIN go install "github.com/nats-io/nats-server/v2@$NATS_VERSION" >&2
fi

FERRYMQ=$OUT_DIR/ferrymq
log "building ferrymq"
(cd "$ROOT" && go build -o "$FERRYMQ" ./cmd/ferrymq) >&2

BROKER_CPU=()
BENCH_CPU=()
if ((PIN == 1)); then
	BROKER_CPU=(taskset -c 0)
	BENCH_CPU=(taskset -c 1)
fi

# --- brokers -----------------------------------------------------------------

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# durability PEER: the durability mode of a broker, for the rows.
durability() {
	case $1 in
	mosquitto) echo "memory only, queue 1000" ;;
	mosquitto-unlimited) echo "memory only, queue unlimited" ;;
	nats) echo "JetStream file, fsync every 2 min" ;;
	nats-sync) echo "JetStream file, fsync every write" ;;
	ferrymq) echo "fsync before ack (--flush sync)" ;;
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
	ferrymq)
		"$FERRYMQ" serve --help 2>/dev/null | grep -q -- '--mqtt' ||
			die "ferrymq serve has no --mqtt flag yet: the gateway is not wired in"
		cmd=("$FERRYMQ" serve --data "$dir/data" --flush sync --mqtt "127.0.0.1:$PORT" --ws "127.0.0.1:$((PORT + 1))"
			--core "127.0.0.1:$((PORT + 2))" --http "127.0.0.1:$((PORT + 3))")
		;;
	*) die "unknown peer $peer" ;;
	esac
	"${BROKER_CPU[@]}" "${cmd[@]}" >"$dir/broker.log" 2>&1 &
	BROKER_PID=$!
	echo "$BROKER_PID" >>"$PIDS"
	local i
	for ((i = 0; i < 200; i++)); do
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
	for ((i = 0; i < 100; i++)); do
		kill -0 "$BROKER_PID" 2>/dev/null || break
		sleep 0.05
	done
	kill -KILL "$BROKER_PID" 2>/dev/null || true
	wait "$BROKER_PID" 2>/dev/null || true
	BROKER_PID=
	# Let the port go before the next broker binds it.
	for ((i = 0; i < 100; i++)); do
		port_open "$PORT" || return 0
		sleep 0.05
	done
}

rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }
# CPU time (user + system) in clock ticks; fields after the ")" of comm.
cpu_ticks() { sed 's/^.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'; }

# bench OUT ARGS...: runs `ferrymq bench mqtt ARGS --json` against the broker
# under test, the result to OUT.json, the progress to OUT.log.
bench() {
	local out=$1
	shift
	timeout --signal=TERM "$RUN_TIMEOUT" "${BENCH_CPU[@]}" "$FERRYMQ" bench mqtt --addr "tcp://127.0.0.1:$PORT" --json "$@" \
		>"$out.json" 2>"$out.log" || {
		tr '\r' '\n' <"$out.log" | tail -n 5 >&2
		return 1
	}
	jq -r --arg run "$(basename "$out")" '.errors // [] | .[:5][] | "\($run): \(.count)× \(.err)"' "$out.json" >&2
	jq -c . "$out.json" >>"$OUT_DIR/results.jsonl"
}

# --- scenarios ----------------------------------------------------------------

# The jq helpers every row uses: a latency in µs for people, and a rate.
JQ_DEFS='
def lat: if . == null or . == 0 then "-" elif . < 1000 then "\(round) µs" elif . < 1e6 then "\((. / 10 | round) / 100) ms" else "\((. / 1e4 | round) / 100) s" end;
def num: if . == null then "-" else round end;
def pct: "\((. * 100 | round) / 100) %";
'

header() {
	case $1 in
	fanin-* | latency)
		echo "| date | scenario | broker | durability | pubs × subs | QoS | size | rate asked | acked | acked/s | delivered/s | lost (loss) | dups | e2e p50 | e2e p99 | e2e p99.9 | ack p50 | ack p99 | broker CPU s / M msgs |"
		echo "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
		;;
	connect)
		echo "| date | broker | durability | conns | connected | failed | conns/s | CONNACK p50 | p99 | p99.9 | broker CPU s |"
		echo "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
		;;
	idle-mem)
		echo "| date | broker | durability | conns held | alive after | RSS before | RSS holding | KiB / conn |"
		echo "|---|---|---|---:|---:|---:|---:|---:|"
		;;
	esac
}

# pubsub_row SCENARIO PEER OUT CPU_TICKS
pubsub_row() {
	jq -r --arg date "$DATE" --arg sc "$1" --arg peer "$2" --arg ticks "$4" --arg hz "$CLK_TCK" "$JQ_DEFS"'
		(.mqtt // .core) as $d
		| (if .acked > 0 then (($ticks | tonumber) / ($hz | tonumber)) / (.acked / 1e6) * 100 | round / 100 else "-" end) as $cpu
		| "| \($date) | \($sc) | \($peer) | \(.label) | \(.publishers) × \(.subscribers) | \(.qos) | \(.size_bytes) B"
		+ " | \(if .rate then "\(.rate)/s" else "max" end) | \(.acked) | \(.acked_per_sec | num) | \($d.per_sec | num)"
		+ " | \($d.lost) (\($d.loss_pct | pct)) | \($d.duplicates) | \($d.latency.p50_us | lat) | \($d.latency.p99_us | lat)"
		+ " | \($d.latency.p999_us | lat) | \(.ack_latency.p50_us | lat) | \(.ack_latency.p99_us | lat) | \($cpu) |"
		+ (if .core and .mqtt then "\n| \($date) | \($sc) → core | \($peer) | \(.label) | \(.publishers) × group | \(.qos) | \(.size_bytes) B | | \(.acked) | | \(.core.per_sec | num) | \(.core.lost) (\(.core.loss_pct | pct)) | \(.core.duplicates) | \(.core.latency.p50_us | lat) | \(.core.latency.p99_us | lat) | \(.core.latency.p999_us | lat) | | | |" else "" end)
	' "$3.json"
}

run_pubsub() {
	local scenario=$1 peer=$2 dir=$3
	local args
	case $scenario in
	fanin-qos1 | fanin-qos0)
		args=(--qos "${scenario#fanin-qos}" --publishers "$FANIN_PUBLISHERS" --subscribers "$FANIN_SUBSCRIBERS"
			--count "$FANIN_COUNT" --size "$FANIN_SIZE" --inflight "$FANIN_INFLIGHT" --drain "$DRAIN")
		;;
	latency)
		args=(--qos "$LAT_QOS" --publishers "$LAT_PUBLISHERS" --subscribers 1 --rate "$LAT_RATE"
			--duration "$LAT_DURATION" --size "$LAT_SIZE" --drain "$DRAIN")
		if [[ $peer == ferrymq && -n $FERRYMQ_CORE_TOPIC ]]; then
			args+=(--core "127.0.0.1:$((PORT + 2))" --core-topic "$FERRYMQ_CORE_TOPIC")
		fi
		;;
	esac
	start_broker "$peer" "$dir"
	local before
	before=$(cpu_ticks "$BROKER_PID")
	bench "$dir/$scenario" "${args[@]}" --label "$(durability "$peer")"
	pubsub_row "$scenario" "$peer" "$dir/$scenario" "$(($(cpu_ticks "$BROKER_PID") - before))"
}

run_connect() {
	local peer=$1 dir=$2
	start_broker "$peer" "$dir"
	local before
	before=$(cpu_ticks "$BROKER_PID")
	bench "$dir/connect" --mode connect --conns "$CONNECT_CONNS" --workers "$CONNECT_WORKERS" --label "$(durability "$peer")"
	local ticks=$(($(cpu_ticks "$BROKER_PID") - before))
	jq -r --arg date "$DATE" --arg peer "$peer" --arg cpu "$(awk -v t="$ticks" -v hz="$CLK_TCK" 'BEGIN { printf "%.2f", t / hz }')" "$JQ_DEFS"'
		"| \($date) | \($peer) | \(.label) | \(.conns.asked) | \(.conns.connected) | \(.conns.failed) | \(.conns.per_sec | num)"
		+ " | \(.conns.latency.p50_us | lat) | \(.conns.latency.p99_us | lat) | \(.conns.latency.p999_us | lat) | \($cpu) |"
	' "$dir/connect.json"
}

run_idle() {
	local peer=$1 dir=$2
	start_broker "$peer" "$dir"
	sleep "$SETTLE"
	local before after out=$dir/idle-mem
	before=$(rss_kib "$BROKER_PID")
	: >"$out.log"
	"${BENCH_CPU[@]}" "$FERRYMQ" bench mqtt --addr "tcp://127.0.0.1:$PORT" --mode idle --conns "$IDLE_CONNS" \
		--source "$IDLE_SOURCE" --keepalive "$IDLE_KEEPALIVE" --label "$(durability "$peer")" --json \
		>"$out.json" 2>"$out.log" &
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
	kill -TERM "$bench_pid"
	wait "$bench_pid" || die "$peer: bench mqtt --mode idle failed: $(tail -c 300 "$out.log")"
	jq -c . "$out.json" >>"$OUT_DIR/results.jsonl"
	jq -r --arg date "$DATE" --arg peer "$peer" --arg before "$before" --arg after "$after" '
		(($after | tonumber) - ($before | tonumber)) as $grew
		| "| \($date) | \($peer) | \(.label) | \(.conns.held) | \(.conns.alive)"
		+ " | \(($before | tonumber) / 1024 | . * 10 | round / 10) MiB | \(($after | tonumber) / 1024 | . * 10 | round / 10) MiB"
		+ " | \(if .conns.held > 0 then ($grew / .conns.held * 100 | round / 100) else "-" end) |"
	' "$out.json"
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
	fanin-* | latency) run_pubsub "$scenario" "$peer" "$dir" ;;
	connect) run_connect "$peer" "$dir" ;;
	idle-mem) run_idle "$peer" "$dir" ;;
	esac
}

log "results in $OUT_DIR; pinning: $( ((PIN == 1)) && echo "broker CPU 0, bench CPU 1" || echo none)"
for scenario in $SCENARIOS; do
	echo
	header "$scenario"
	for peer in $PEERS; do
		# errexit holds inside a background subshell, not in an `if` test.
		(run_one "$scenario" "$peer") &
		if ! wait $!; then
			FAILED=$((FAILED + 1))
			log "$scenario: $peer failed; going on with the others"
		fi
	done
done
((FAILED == 0)) || log "$FAILED runs failed"
exit $((FAILED > 0))
