#!/usr/bin/env bash
# ferrymq's core over TCP against NATS JetStream, side by side in one run
# (issue #4), on loopback with the same payload, producer count and in-flight
# bound:
#
#   produce  ferrymq serve --flush async   vs  nats-server, default sync_interval (2 min)
#   produce  ferrymq serve --flush sync    vs  nats-server, sync_interval: always
#   consume  ferrymq push consumers (clustering, commits)
#                                          vs  JetStream durable pull consumer, explicit ack
#
# Every server starts fresh (new data directory) and is stopped after its
# runs; servers are pinned to CPU 0 and the load generator to CPU 1 when
# taskset and two CPUs are there. nats-server v2.15.2 is built from the Go
# module proxy into a temporary GOBIN unless it is on PATH already.
#
# Usage: scripts/bench-core.sh
# Environment (defaults in brackets):
#   DURATION [10s]   length of each produce run
#   COUNT [500000]   backlog of each consume run
#   PRODUCERS [16] PIPELINE [64] SIZE [1024] CONSUMERS [4]
#   PIN [1]          0: do not pin servers and load generator to CPUs
#   FERRYMQ_BIN      use this ferrymq binary instead of building one
#   KEEP=1           keep the work directory (data, logs, result rows)
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10s}
COUNT=${COUNT:-500000}
PRODUCERS=${PRODUCERS:-16}
PIPELINE=${PIPELINE:-64}
SIZE=${SIZE:-1024}
CONSUMERS=${CONSUMERS:-4}
NATS_VERSION=v2.15.2

work=$(mktemp -d "${TMPDIR:-/tmp}/ferrymq-bench-core.XXXXXX")
server_pid='' server_addr=''
cleanup() {
	if [[ -n "$server_pid" ]]; then
		kill -TERM "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null || true
	fi
	if [[ "${KEEP:-}" == 1 ]]; then
		echo "kept $work" >&2
	else
		rm -rf "$work"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

srv=() cli=()
if [[ "${PIN:-1}" != 0 ]] && command -v taskset >/dev/null && [[ $(nproc) -ge 2 ]]; then
	srv=(taskset -c 0) cli=(taskset -c 1)
fi

# --- binaries ---------------------------------------------------------------
bin=${FERRYMQ_BIN:-$work/ferrymq}
if [[ -z "${FERRYMQ_BIN:-}" ]]; then
	go build -o "$bin" ./cmd/ferrymq
fi
if ! "$bin" bench core --help >/dev/null 2>&1; then
	echo "$bin has no 'bench core' command (is newBenchCmd registered in root.go?)" >&2
	exit 1
fi
nats=$(command -v nats-server || true)
if [[ -z "$nats" ]] || ! "$nats" --version | grep -q "$NATS_VERSION"; then
	echo "installing nats-server $NATS_VERSION into $work/gobin …" >&2
	GOBIN="$work/gobin" go install "github.com/nats-io/nats-server/v2@$NATS_VERSION"
	nats=$work/gobin/nats-server
fi

# --- servers (one at a time) -----------------------------------------------

# wait_for FILE REGEX: waits up to 30 s for a line matching REGEX in FILE
# and prints it.
wait_for() {
	for _ in $(seq 300); do
		if grep -Eq "$2" "$1" 2>/dev/null; then
			grep -Em1 "$2" "$1"
			return 0
		fi
		if ! kill -0 "$server_pid" 2>/dev/null; then
			echo "server exited:" >&2
			cat "$1" >&2
			return 1
		fi
		sleep 0.1
	done
	echo "server did not start:" >&2
	cat "$1" >&2
	return 1
}

start_ferrymq() { # flush policy
	local dir=$work/ferrymq-$1 http=()
	mkdir -p "$dir"
	"$bin" serve --help 2>&1 | grep -q -- '--http' && http=(--http 127.0.0.1:0)
	"${srv[@]}" "$bin" serve --data "$dir/data" --flush "$1" --core 127.0.0.1:0 "${http[@]}" \
		--log-level warn >"$dir.out" 2>"$dir.log" &
	server_pid=$!
	server_addr=$(wait_for "$dir.out" '^core ' | awk '{print $2}')
}

start_nats() { # name, extra jetstream settings
	local dir=$work/nats-$1
	mkdir -p "$dir"
	cat >"$dir.conf" <<EOF
listen: 127.0.0.1:-1
server_name: bench-$1
jetstream {
  store_dir: "$dir"
  $2
}
EOF
	"${srv[@]}" "$nats" -c "$dir.conf" >"$dir.log" 2>&1 &
	server_pid=$!
	wait_for "$dir.log" 'Server is ready' >/dev/null
	server_addr=$(wait_for "$dir.log" 'Listening for client connections on' | sed -E 's/.* on ([0-9.:]+).*/\1/')
}

stop_server() {
	kill -TERM "$server_pid"
	wait "$server_pid" 2>/dev/null || true
	server_pid=''
	rm -rf "$work"/ferrymq-*/ "$work"/nats-*/
}

# cpu_ticks: user+system clock ticks the server used so far.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$server_pid/stat"; }
hz=$(getconf CLK_TCK)

results=$work/results.jsonl
cpu_notes=()

# bench NAME TARGET LABEL ARGS…: one timed run against the running server;
# its row is appended to the results, with the CPU time of the server and
# of the load generator noted.
exec 3>&2
TIMEFORMAT='%U %S'
bench() {
	local name=$1 target=$2 label=$3
	shift 3
	local before after row msgs
	before=$(cpu_ticks)
	{ time row=$("${cli[@]}" "$bin" bench core --target "$target" --server "$server_addr" --producers "$PRODUCERS" \
		--pipeline "$PIPELINE" --size "$SIZE" --consumers "$CONSUMERS" --label "$label" --json "$@" 2>&3); } 2>"$work/time-$name"
	after=$(cpu_ticks)
	echo "$row" >>"$results"
	echo "$row" >"$work/row-$name.json"
	msgs=$(field messages "$work/row-$name.json")
	cpu_notes+=("$(awk -v n="$name" -v t=$((after - before)) -v hz="$hz" -v m="$msgs" -v c="$(cat "$work/time-$name")" \
		'BEGIN { split(c, u, " "); cs = u[1] + u[2]; s = t / hz
			printf "%-24s %8d msgs   server %6.2f CPU-s (%5.2f per 1M msgs)   load generator %6.2f CPU-s (%5.2f per 1M msgs)",
				n, m, s, (m > 0 ? s*1e6/m : 0), cs, (m > 0 ? cs*1e6/m : 0) }')")
}

# fill TARGET: the untimed backlog for a consume run.
fill() {
	"${cli[@]}" "$bin" bench core --target "$1" --server "$server_addr" --producers "$PRODUCERS" \
		--pipeline "$PIPELINE" --size "$SIZE" --count "$COUNT" --json >/dev/null
}

field() { sed -nE "s/.*\"$1\":([0-9.e+-]+).*/\1/p" "$2"; }

echo "machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(free -g | awk '/Mem:/{print $2}') GiB," \
	"disk $(df -h "$work" | awk 'NR==2{print $1}'), $(date -u +%F), $(go version | awk '{print $3}')," \
	"$("$bin" version), nats-server $("$nats" --version | awk '{print $2}')"
echo "load: $PRODUCERS producers × $PIPELINE in flight, $SIZE B; produce runs $DURATION;" \
	"consume $COUNT msgs with $CONSUMERS consumers; pinning: ${srv[*]:-none} / ${cli[*]:-none}"

# --- runs -------------------------------------------------------------------
start_ferrymq async
bench ferrymq-async ferrymq "async" --duration "$DURATION"
stop_server

start_nats default ""
bench jetstream-default jetstream "sync_interval=2m (default)" --duration "$DURATION"
stop_server

start_ferrymq sync
bench ferrymq-sync ferrymq "sync (fsync before ack)" --duration "$DURATION"
stop_server

start_nats always "sync_interval: always"
bench jetstream-always jetstream "sync_interval=always" --duration "$DURATION"
stop_server

# Each consume run is a new group (durable) reading the same backlog from
# its start; the second one has a single consumer.
start_ferrymq async
fill ferrymq
bench ferrymq-consume ferrymq "commits, async store" --mode consume --skip-fill --count "$COUNT"
bench ferrymq-consume-1 ferrymq "commits, async store" --mode consume --skip-fill --count "$COUNT" --consumers 1
stop_server

start_nats default ""
fill jetstream
bench jetstream-consume jetstream "explicit ack, default sync" --mode consume --skip-fill --count "$COUNT"
bench jetstream-consume-1 jetstream "explicit ack, default sync" --mode consume --skip-fill --count "$COUNT" --consumers 1
stop_server

# --- report -----------------------------------------------------------------
echo
"$bin" bench table "$results"
echo
"$bin" bench table --markdown "$results"
echo
printf '%s\n' "${cpu_notes[@]}"
echo
ratio() { # name, a, b, target
	local a b
	a=$(field msgs_per_sec "$work/row-$2.json")
	b=$(field msgs_per_sec "$work/row-$3.json")
	awk -v n="$1" -v a="$a" -v b="$b" -v t="$4" \
		'BEGIN { r = a / b; printf "%-40s %8.0f / %8.0f msgs/s = %5.2f× (target ≥ %s×: %s)\n", n, a, b, r, t, (r >= t ? "met" : "MISSED") }'
}
ratio "produce async vs JetStream default" ferrymq-async jetstream-default 2
ratio "produce sync vs JetStream always" ferrymq-sync jetstream-always 10
ratio "consume vs JetStream pull + ack" ferrymq-consume jetstream-consume 1
ratio "consume, 1 consumer each" ferrymq-consume-1 jetstream-consume-1 1
