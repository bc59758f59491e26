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
#               broker VmRSS and goroutines (ferrymq: /metrics go_goroutines;
#               nats: /stacksz; mochi: its info page's threads; Mosquitto:
#               n/a) before and while holding them; also OS threads
#   idle-mem-sub  the same, each connection with one subscription
#               (idle/<index>) at IDLE_SUB_QOS, SUBACK awaited
#   idle-mem-tls  the same over TLS (a self-signed P-256 certificate made
#               with openssl in OUT_DIR/tls; the broker's MQTT port speaks TLS)
#   idle-mem-ws   the same over WebSocket (ws://127.0.0.1:PORT+1/mqtt)
#   connect     CONNECT_CONNS raw CONNECTs by CONNECT_WORKERS workers
#   connect-auth  the same with AUTH_USER/AUTH_PASSWORD in every CONNECT and
#               the broker checking them: ferrymq a static credentials file
#               (bcrypt, verified credentials cached) with presence events on
#               (its default), Mosquitto a password_file (mosquitto_passwd),
#               nats-server mqtt authorization; plain mochi's example server
#               takes no credentials: n/a
#   fanin-clients-qos0  "as a new user would": FANIN_CLIENTS × `mosquitto_pub -l`
#               (each FANIN_CLIENT_COUNT lines of FANIN_CLIENT_SIZE bytes on
#               stdin, its own topic) and one `mosquitto_sub -t '#'` counting
#               what arrives; delivered/s (first publish to last arrival) and loss
#   fanin-clients-qos1  the same at QoS 1 (publishers and subscriber)
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
#               p50/p99/p99.9 (ferrymq: also → a core consumer group; and a
#               CPU profile, OUT_DIR/latency-ferrymq.cpu.pprof, with
#               `go tool pprof -top` of it in latency-ferrymq.cpu.top.txt)
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
#                (clients), PORT+5 (monitoring), PORT+1 (ws, idle-mem-ws);
#                mochi PORT+1 (ws), PORT+2 (info); Mosquitto PORT+1 (ws,
#                idle-mem-ws, on all addresses: its websockets listener
#                fails to bind to one)
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
IDLE_SUB_QOS=${IDLE_SUB_QOS:-1}
AUTH_USER=${AUTH_USER:-bench}
AUTH_PASSWORD=${AUTH_PASSWORD:-bench-secret-1}
FANIN_CLIENTS=${FANIN_CLIENTS:-10}
FANIN_CLIENT_COUNT=${FANIN_CLIENT_COUNT:-10000}
FANIN_CLIENT_SIZE=${FANIN_CLIENT_SIZE:-256}
FANIN_CLIENT_DRAIN=${FANIN_CLIENT_DRAIN:-3}
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

ALL_SCENARIOS="idle-mem idle-mem-sub idle-mem-tls idle-mem-ws connect connect-auth fanin-qos0 fanin-qos1 fanin-clients-qos0 fanin-clients-qos1 fanout p2p latency slow ordered"
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
want_scenario() { [[ " $SCENARIOS " == *" $1 "* ]]; }

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
command -v curl >/dev/null || apt_install curl
if want_scenario fanin-clients-qos0 || want_scenario fanin-clients-qos1; then
	if ! command -v mosquitto_pub >/dev/null || ! command -v mosquitto_sub >/dev/null; then
		apt_install mosquitto-clients
	fi
fi
if want_scenario idle-mem-tls; then
	command -v openssl >/dev/null || apt_install openssl
fi

MOSQUITTO=$(command -v mosquitto || echo /usr/sbin/mosquitto)
if need_peer mosquitto && { [[ ! -x $MOSQUITTO ]] || ! command -v mosquitto_passwd >/dev/null; }; then
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

# TLS: one self-signed certificate for 127.0.0.1 that every broker serves
# and the bench trusts (--ca).
TLS_DIR=$OUT_DIR/tls
if want_scenario idle-mem-tls && [[ ! -s $TLS_DIR/cert.pem ]]; then
	mkdir -p "$TLS_DIR"
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 7 -subj /CN=127.0.0.1 \
		-addext subjectAltName=IP:127.0.0.1,DNS:localhost -keyout "$TLS_DIR/key.pem" -out "$TLS_DIR/cert.pem" 2>"$TLS_DIR/openssl.log" ||
		die "openssl: $(cat "$TLS_DIR/openssl.log")"
	chmod 644 "$TLS_DIR/key.pem" # Mosquitto may read it as another user
fi

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

# start_broker PEER DIR [VARIANT]: starts PEER with its data and config in
# DIR, waits until it accepts MQTT connections and sets BROKER_PID. VARIANT:
#   plain  MQTT over TCP on PORT (the default)
#   tls    MQTT over TLS on PORT instead (TLS_DIR's certificate)
#   ws     also MQTT over WebSocket on PORT+1, path /mqtt
#   auth   only AUTH_USER with AUTH_PASSWORD may connect
start_broker() {
	local peer=$1 dir=$2 variant=${3:-plain}
	mkdir -p "$dir"
	if port_open "$PORT"; then
		die "port $PORT is taken: stop whatever listens there or set PORT"
	fi
	local cmd
	case $peer in
	mosquitto | mosquitto-unlimited)
		{
			echo "listener $PORT 127.0.0.1"
			if [[ $variant == tls ]]; then
				echo "certfile $TLS_DIR/cert.pem"
				echo "keyfile $TLS_DIR/key.pem"
			fi
			if [[ $variant == ws ]]; then
				# Mosquitto 2.0's websockets listener fails to start with a bind
				# address, and without a plain listener beside it.
				echo "listener $((PORT + 1))"
				echo "protocol websockets"
			fi
			if [[ $variant == auth ]]; then
				mosquitto_passwd -b -c "$dir/passwd" "$AUTH_USER" "$AUTH_PASSWORD" >&2
				echo "allow_anonymous false"
				echo "password_file $dir/passwd"
			else
				echo "allow_anonymous true"
			fi
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
			echo "http: \"127.0.0.1:$((PORT + 5))\"" # monitoring: /stacksz for goroutines
			echo "mqtt {"
			echo "  listen: \"127.0.0.1:$PORT\""
			[[ $variant == tls ]] && echo "  tls { cert_file: \"$TLS_DIR/cert.pem\", key_file: \"$TLS_DIR/key.pem\" }"
			[[ $variant == auth ]] && echo "  authorization { username: \"$AUTH_USER\", password: \"$AUTH_PASSWORD\" }"
			echo "}"
			# MQTT over WebSocket: nats-server serves it on a path ending in /mqtt
			[[ $variant == ws ]] && echo "websocket { listen: \"127.0.0.1:$((PORT + 1))\", no_tls: true }"
		} >"$dir/nats.conf"
		cmd=("$NATS" -c "$dir/nats.conf")
		;;
	mochi)
		cmd=("$MOCHI" -tcp "127.0.0.1:$PORT" -ws "127.0.0.1:$((PORT + 1))" -info "127.0.0.1:$((PORT + 2))")
		[[ $variant == tls ]] && cmd+=(-tls-cert-file "$TLS_DIR/cert.pem" -tls-key-file "$TLS_DIR/key.pem")
		[[ $variant == auth ]] && die "mochi's example server takes no credentials"
		;;
	ferrymq | ferrymq-async)
		local flush=sync
		[[ $peer == ferrymq-async ]] && flush=async
		local mqtt=127.0.0.1:$PORT
		[[ $variant == tls ]] && mqtt=
		cmd=("$FERRYMQ" serve --data "$dir/data" --flush "$flush" --mqtt "$mqtt" --ws "127.0.0.1:$((PORT + 1))"
			--core "127.0.0.1:$((PORT + 2))" --http "127.0.0.1:$((PORT + 3))")
		case $variant in
		tls)
			printf 'mqtt:\n  tls:\n    - {name: tls, type: tcp, addr: "127.0.0.1:%s", cert: "%s", key: "%s"}\n' \
				"$PORT" "$TLS_DIR/cert.pem" "$TLS_DIR/key.pem" >"$dir/ferrymq.yaml"
			cmd+=(--config "$dir/ferrymq.yaml")
			;;
		auth)
			# presence events (bridge events_topic) are on by default
			printf 'users:\n  - username: "%s"\n    password_hash: "%s"\n' "$AUTH_USER" \
				"$(printf %s "$AUTH_PASSWORD" | "$FERRYMQ" auth hash-password)" >"$dir/users.yaml"
			printf 'auth:\n  static: {file: "%s"}\n' "$dir/users.yaml" >"$dir/ferrymq.yaml"
			cmd+=(--config "$dir/ferrymq.yaml")
			;;
		esac
		[[ -n ${CPU_PROFILE:-} ]] && cmd+=(--cpu-profile "$CPU_PROFILE")
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

# goroutines PEER: the broker's goroutine count, or null where it tells none
# (Mosquitto is C; see its OS threads instead).
goroutines() {
	local n=
	case $1 in
	ferrymq*) n=$(curl -fsS "http://127.0.0.1:$((PORT + 3))/metrics" 2>/dev/null | awk '$1 == "go_goroutines" { print $2 }' || true) ;;
	nats*) n=$(curl -fsS "http://127.0.0.1:$((PORT + 5))/stacksz" 2>/dev/null | grep -c '^goroutine ' || true) ;;
	mochi) n=$(curl -fsS "http://127.0.0.1:$((PORT + 2))/" 2>/dev/null | jq -r '.threads // empty' 2>/dev/null || true) ;;
	esac
	if [[ $n =~ ^[0-9]+$ ]]; then echo "$n"; else echo null; fi
}
os_threads() { awk '/^Threads:/ { print $2 }' "/proc/$1/status"; }

# record SCENARIO PEER OUT CMD CPU_TICKS RSS_BEFORE RSS_AFTER HWM: appends the
# run's record to results.jsonl, with the fields of the JSON object
# RECORD_EXTRA (if set) added.
record() {
	local extra=${RECORD_EXTRA:-}
	[[ -n $extra ]] || extra='{}'
	jq -c --arg scenario "$1" --arg peer "$2" --arg cmd "$4" --arg date "$DATE" --argjson extra "$extra" \
		--arg durability "$(durability "$2")" --arg version "$(version "$2")" \
		--argjson cpu "$(awk -v t="$5" -v hz="$CLK_TCK" 'BEGIN { printf "%.3f", t / hz }')" \
		--argjson rss0 "$6" --argjson rss1 "$7" --argjson hwm "$8" --arg pinned "$( ((${#BROKER_CPU[@]} > 0)) && echo yes || echo no)" \
		'{scenario: $scenario, peer: $peer, version: $version, durability: $durability, date: $date, command: $cmd,
		  pinned: ($pinned == "yes"), broker_cpu_s: $cpu, rss_before_kib: $rss0, rss_after_kib: $rss1, rss_peak_kib: $hwm, result: .} + $extra' \
		"$3.json" >>"$OUT_DIR/results.jsonl"
}

# record_na SCENARIO PEER REASON: a row saying PEER cannot run SCENARIO.
record_na() {
	log "$1: $2: n/a: $3"
	jq -n -c --arg scenario "$1" --arg peer "$2" --arg reason "$3" --arg date "$DATE" \
		--arg durability "$(durability "$2")" --arg version "$(version "$2" 2>/dev/null || echo "$2")" \
		'{scenario: $scenario, peer: $peer, version: $version, durability: $durability, date: $date, command: "",
		  na: $reason, pinned: false, broker_cpu_s: 0, rss_before_kib: 0, rss_after_kib: 0, rss_peak_kib: 0, result: {}}' \
		>>"$OUT_DIR/results.jsonl"
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
	local profile=
	if [[ $peer == ferrymq* && $scenario == latency ]]; then
		# a CPU profile of the whole run (the profiler costs a few % of CPU)
		profile=$OUT_DIR/$scenario-$peer.cpu.pprof
		CPU_PROFILE=$profile
		RECORD_EXTRA=$(jq -n -c --arg p "${profile##*/}" --arg t "${profile##*/}.top.txt" '{cpu_profile: $p, cpu_top: $t}')
	fi
	start_broker "$peer" "$dir"
	sleep 1
	bench "$scenario" "$peer" "$dir/$scenario" "${args[@]}"
	if [[ -n $profile ]]; then
		stop_broker # the profile is written when serve stops
		go tool pprof -top "$FERRYMQ" "$profile" >"$profile.top.txt" 2>&1 ||
			log "$scenario: $peer: go tool pprof failed: $(tail -n 3 "$profile.top.txt")"
	fi
}

# run_idle SCENARIO PEER DIR: idle-mem, idle-mem-sub (one subscription per
# connection), idle-mem-tls, idle-mem-ws.
run_idle() {
	local scenario=$1 peer=$2 dir=$3 variant=plain addr
	addr=$(mqtt_addr)
	local extra=()
	case $scenario in
	idle-mem-sub) extra=(--subscribe 'idle/%i' --sub-qos "$IDLE_SUB_QOS") ;;
	idle-mem-tls)
		variant=tls addr=tls://127.0.0.1:$PORT
		extra=(--ca "$TLS_DIR/cert.pem")
		;;
	idle-mem-ws) variant=ws addr=ws://127.0.0.1:$((PORT + 1))/mqtt ;;
	esac
	start_broker "$peer" "$dir" "$variant"
	sleep "$SETTLE"
	local before after out=$dir/$scenario g0 g1 t0 t1
	local args=(mqtt --addr "$addr" --mode idle --conns "$IDLE_CONNS" --source "$IDLE_SOURCE" --keepalive 300s
		"${extra[@]}" --label "$(durability "$peer")")
	cmdline "${args[@]}" >"$out.cmd"
	before=$(rss_kib "$BROKER_PID")
	g0=$(goroutines "$peer")
	t0=$(os_threads "$BROKER_PID")
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
	after=$(rss_kib "$BROKER_PID")  # before asking for goroutines: nats' /stacksz allocates
	g1=$(goroutines "$peer")
	t1=$(os_threads "$BROKER_PID")
	local ticks=$(($(cpu_ticks "$BROKER_PID") - cpu0)) hwm
	hwm=$(hwm_kib "$BROKER_PID")
	kill -TERM "$bench_pid"
	wait "$bench_pid" || die "$peer: bench mqtt --mode idle failed: $(tail -c 300 "$out.log")"
	RECORD_EXTRA=$(jq -n -c --argjson g0 "$g0" --argjson g1 "$g1" --argjson t0 "$t0" --argjson t1 "$t1" --arg transport "$variant" \
		'{goroutines_before: $g0, goroutines_holding: $g1, os_threads_before: $t0, os_threads_holding: $t1, transport: $transport}')
	record "$scenario" "$peer" "$out" "$(cmdline "${args[@]}")" "$ticks" "$before" "$after" "$hwm"
}

# auth_desc PEER: how PEER checks AUTH_USER/AUTH_PASSWORD in connect-auth.
auth_desc() {
	case $1 in
	ferrymq*) echo "static credentials file, bcrypt (verified credentials cached); presence events on" ;;
	mosquitto*) echo "password_file (mosquitto_passwd: PBKDF2-SHA512, checked on every CONNECT)" ;;
	nats*) echo "mqtt authorization, plain-text password in the config" ;;
	esac
}

# run_connect SCENARIO PEER DIR: connect, or connect-auth (credentials
# checked by the broker).
run_connect() {
	local scenario=$1 peer=$2 dir=$3 variant=plain
	local args=(mqtt --addr "$(mqtt_addr)" --mode connect --conns "$CONNECT_CONNS" --workers "$CONNECT_WORKERS")
	if [[ $scenario == connect-auth ]]; then
		if [[ $peer == mochi ]]; then
			record_na "$scenario" "$peer" "mochi's example server (cmd/) allows everyone and takes no credentials"
			return 0
		fi
		variant=auth
		args+=(--username "$AUTH_USER" --password "$AUTH_PASSWORD")
		RECORD_EXTRA=$(jq -n -c --arg a "$(auth_desc "$peer")" '{auth: $a}')
	fi
	start_broker "$peer" "$dir" "$variant"
	sleep 1
	bench "$scenario" "$peer" "$dir/$scenario" "${args[@]}" --label "$(durability "$peer")"
}

# run_fanin_clients SCENARIO PEER DIR: FANIN_CLIENTS × `mosquitto_pub -l`
# (FANIN_CLIENT_COUNT lines of FANIN_CLIENT_SIZE bytes each, topic fanin/i)
# into the broker, one `mosquitto_sub -v -t '#'` writing what arrives to a
# file; waits for all, or until nothing arrives for FANIN_CLIENT_DRAIN s.
# delivered/s is distinct messages over first publish → last arrival (the
# file's mtime; mosquitto_sub flushes every message).
run_fanin_clients() {
	local scenario=$1 peer=$2 dir=$3 qos=${1#fanin-clients-qos}
	local lines=$OUT_DIR/fanin-lines-$FANIN_CLIENT_COUNT-$FANIN_CLIENT_SIZE.txt
	if [[ ! -s $lines ]]; then
		awk -v n="$FANIN_CLIENT_COUNT" -v size="$FANIN_CLIENT_SIZE" 'BEGIN {
			pad = sprintf("%*s", size, ""); gsub(/ /, "x", pad)
			for (i = 0; i < n; i++) print substr(sprintf("%08d ", i) pad, 1, size)
		}' >"$lines"
	fi
	start_broker "$peer" "$dir"
	sleep 1
	local out=$dir/$scenario expected=$((FANIN_CLIENTS * FANIN_CLIENT_COUNT))
	local sub=(mosquitto_sub -h 127.0.0.1 -p "$PORT" -q "$qos" -v -t '#' -i fanin-sub)
	local pub=(mosquitto_pub -h 127.0.0.1 -p "$PORT" -q "$qos" -l)
	local pin=
	((${#BENCH_CPU[@]} > 0)) && pin="${BENCH_CPU[*]} "
	local shown="${pin}mosquitto_sub -h 127.0.0.1 -p $PORT -q $qos -v -t '#' -i fanin-sub >received.txt &"
	shown+=" for i in \$(seq 0 $((FANIN_CLIENTS - 1))); do ${pin}mosquitto_pub -h 127.0.0.1 -p $PORT -q $qos -l"
	shown+=" -t fanin/\$i -i fanin-pub-\$i <${lines##*/} & done; wait  # ${lines##*/}: $FANIN_CLIENT_COUNT lines of $FANIN_CLIENT_SIZE B"
	echo "$shown" >"$out.cmd"
	"${BENCH_CPU[@]}" "${sub[@]}" >"$out.received" 2>"$out.sub.log" &
	local sub_pid=$!
	echo "$sub_pid" >>"$PIDS"
	sleep 1 # let it subscribe (mosquitto_sub tells nobody)
	local cpu0 rss0 t0 tpub tlast i p failed=0 pids=()
	cpu0=$(cpu_ticks "$BROKER_PID")
	rss0=$(rss_kib "$BROKER_PID")
	t0=$(date +%s.%N)
	for ((i = 0; i < FANIN_CLIENTS; i++)); do
		"${BENCH_CPU[@]}" "${pub[@]}" -t "fanin/$i" -i "fanin-pub-$i" <"$lines" >"$out.pub$i.log" 2>&1 &
		pids+=($!)
		echo "$!" >>"$PIDS"
	done
	for p in "${pids[@]}"; do
		wait "$p" || failed=$((failed + 1))
	done
	tpub=$(date +%s.%N)
	local n last=-1 still=0
	while :; do
		n=$(wc -l <"$out.received")
		((n >= expected)) && break
		kill -0 "$sub_pid" 2>/dev/null || break
		if ((n == last)); then
			still=$((still + 1))
			((still >= FANIN_CLIENT_DRAIN * 10)) && break
		else
			still=0 last=$n
		fi
		sleep 0.1
	done
	tlast=$(date -r "$out.received" +%s.%N)
	local ticks=$(($(cpu_ticks "$BROKER_PID") - cpu0)) rss1 hwm
	rss1=$(rss_kib "$BROKER_PID")
	hwm=$(hwm_kib "$BROKER_PID")
	kill -TERM "$sub_pid" 2>/dev/null || true
	wait "$sub_pid" 2>/dev/null || true
	local total distinct
	total=$(wc -l <"$out.received")
	distinct=$(sort -u "$out.received" | wc -l)
	jq -n -c --argjson qos "$qos" --argjson pubs "$FANIN_CLIENTS" --argjson count "$FANIN_CLIENT_COUNT" \
		--argjson size "$FANIN_CLIENT_SIZE" --argjson expected "$expected" --argjson total "$total" --argjson distinct "$distinct" \
		--argjson t0 "$t0" --argjson tpub "$tpub" --argjson tlast "$tlast" --argjson failed "$failed" \
		'($tlast - $t0) as $secs | ([0, $expected - $distinct] | max) as $lost |
		 {mode: "fanin-clients", qos: $qos, publishers: $pubs, subscribers: 1, count: $count, size_bytes: $size,
		  sent: $expected, publish_seconds: ($tpub - $t0), seconds: $secs,
		  mqtt: {expected: $expected, received: $distinct, duplicates: ($total - $distinct), lost: $lost,
		         loss_pct: (if $expected > 0 then 100 * $lost / $expected else 0 end),
		         per_sec: (if $secs > 0 then $distinct / $secs else 0 end)},
		  errors: (if $failed > 0 then [{err: "mosquitto_pub exited with an error (see its .pubN.log)", count: $failed}] else [] end)}' \
		>"$out.json"
	record "$scenario" "$peer" "$out" "$shown" "$ticks" "$rss0" "$rss1" "$hwm"
	jq -r --arg run "$scenario/$peer" '"\($run): \(.mqtt.received) of \(.mqtt.expected) delivered, \(.mqtt.per_sec | floor)/s"' "$out.json" >&2
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
	idle-mem*) run_idle "$scenario" "$peer" "$dir" ;;
	connect*) run_connect "$scenario" "$peer" "$dir" ;;
	fanin-clients-*) run_fanin_clients "$scenario" "$peer" "$dir" ;;
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
gnuplot -e "datafile='$OUT_DIR/chart.dat'; outfile='$OUT_DIR/chart.png'" "$ROOT/scripts/bench-report.gp" ||
	log "no chart (without a ferrymq row every ratio is empty)"
log "report: $OUT_DIR/report.md, chart: $OUT_DIR/chart.png"
((FAILED == 0)) || log "$FAILED runs failed"
exit $((FAILED > 0))
