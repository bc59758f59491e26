#!/usr/bin/env bash
# Lagging readers do not pollute the tail (issue #21). A real `ferrymq
# serve` whose memory — page cache included — is held to MEM_LIMIT (a
# memory cgroup), a backlog topic several times larger than that, and:
#
#   alone   a tail group consuming RATE msgs/s of SIZE B as they are
#           produced (`ferrymq bench tail`): p99 from store time to receipt
#   with    the same, while a new group replays the whole backlog from its
#           first message: the tail's p99 again, and the backlog group's
#           rate. The replay runs in a process of its own (`ferrymq bench
#           replay`), as a backlog reader runs on a machine of its own, so
#           that receiving and decoding the backlog is not work of the tail
#           client's process; BACKLOG_PROCESS=same runs it in the tail's
#           (`ferrymq bench tail --backlog`), as before; BACKLOG_PROCESS=raw
#           replaces the replay by the floor any broker has on this machine:
#           a reader of the commit log's files with O_DIRECT, 4 MiB per
#           read, as fast as the disk gives them or at RAW_MBPS (no broker,
#           no network, no decoding: only the disk reads' own cost)
#
# alternating, ROUNDS times, for each server configuration in MODES:
#   default   the tail cache on (store defaults)
#   nocache   store.tail_cache_bytes: -1 — every read through the segments'
#             mappings, as before the tail cache (no cold-read path)
#   budget-N  the tail cache on, each group's cold reads held to N bytes/s
#             (store.reader_cold_read_bytes_per_sec; N as numfmt reads it:
#             budget-50M is 50 MiB/s)
#
# Per run it reports the server's major page faults and bytes read from the
# disk (/proc/PID/stat, /proc/PID/io), the store's tail-cache hits and
# misses, cold-read bytes and budget waits (/metrics), and how much of the
# tail topic's consume-queue files is in the page cache afterwards (fincore).
# The disk's sequential read rate comes from scripts/bench-disk.sh.
#
# The memory limit: a cgroup v2 child with memory.max, else a cgroup v1
# memory child (of this shell's own) with memory.limit_in_bytes, the server
# started inside it; without either, a helper that mlocks all available
# memory but MEM_LIMIT and 2 GiB (MLOCK=1 allows it; released at exit).
# Needs root for the cgroup.
#
# Usage: scripts/bench-isolation.sh
# Environment (defaults in brackets):
#   MEM_LIMIT [1G]         the server's memory, page cache included
#   BACKLOG_BYTES [8G]     backlog size (it must outlast a window); BACKLOG_SIZE [65536] its message size
#   RATE [5000] SIZE [1024] the tail's load; DURATION [15s] WARMUP [2s]
#   ROUNDS [3]             alone/with pairs per mode; MODES ["default nocache"]
#   BACKLOG_PROCESS [own]  own: the replay in a process of its own; same: in
#                          the tail bench's process; raw: no replay, the
#                          commit log read with O_DIRECT instead
#   BACKLOG_NICE [0]       the replay process's niceness (own only)
#   RAW_MBPS               BACKLOG_PROCESS=raw: read at most this many MB/s
#   BUDGET                 store.reader_cold_read_bytes_per_sec for the modes
#                          that do not set it
#   DATA                   keep the data directory here (a later run with the
#                          same DATA skips filling the backlog)
#   DISK_READ_MBPS         skip bench-disk.sh and use this rate
#   FERRYMQ_BIN            use this ferrymq binary instead of building one
#   KEEP=1                 keep the work directory (data, logs, result rows)
set -euo pipefail
cd "$(dirname "$0")/.."

MEM_LIMIT=${MEM_LIMIT:-1G}
BACKLOG_BYTES=${BACKLOG_BYTES:-8G}
BACKLOG_SIZE=${BACKLOG_SIZE:-65536}
RATE=${RATE:-5000}
SIZE=${SIZE:-1024}
DURATION=${DURATION:-15s}
WARMUP=${WARMUP:-2s}
ROUNDS=${ROUNDS:-3}
MODES=${MODES:-default nocache}
BACKLOG_PROCESS=${BACKLOG_PROCESS:-own}
BACKLOG_NICE=${BACKLOG_NICE:-0}

bytes() { numfmt --from=iec "$1"; }
mem=$(bytes "$MEM_LIMIT")
backlog=$(bytes "$BACKLOG_BYTES")
if ((backlog <= mem)); then
	echo "BACKLOG_BYTES ($BACKLOG_BYTES) must be larger than MEM_LIMIT ($MEM_LIMIT)" >&2
	exit 2
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/ferrymq-bench-isolation.XXXXXX")
server_pid='' cg='' mlock_pid=''
cleanup() {
	if [[ -n "$server_pid" ]]; then
		kill -TERM "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null || true
	fi
	if [[ -n "$mlock_pid" ]]; then
		kill -TERM "$mlock_pid" 2>/dev/null && wait "$mlock_pid" 2>/dev/null || true
	fi
	if [[ -n "$cg" ]]; then
		rmdir "$cg" 2>/dev/null || echo "could not remove cgroup $cg" >&2
	fi
	if [[ "${KEEP:-}" == 1 ]]; then
		echo "kept $work" >&2
	else
		rm -rf "$work"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
trap 'echo "failed (status $?) at line $LINENO: $BASH_COMMAND" >&2' ERR

# --- the memory limit -------------------------------------------------------
procs='' how=''
if [[ -f /sys/fs/cgroup/cgroup.controllers ]] && grep -qw memory /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null &&
	mkdir "/sys/fs/cgroup/ferrymq-iso.$$" 2>/dev/null; then
	cg=/sys/fs/cgroup/ferrymq-iso.$$
	if echo "$mem" >"$cg/memory.max"; then
		echo 0 >"$cg/memory.swap.max" 2>/dev/null || true
		procs=$cg/cgroup.procs how="cgroup v2, memory.max = $MEM_LIMIT"
	else
		rmdir "$cg"
		cg=''
	fi
fi
if [[ -z "$procs" ]] && [[ -d /sys/fs/cgroup/memory ]]; then
	own=$(awk -F: '$2 == "memory" {print $3}' /proc/self/cgroup)
	if mkdir "/sys/fs/cgroup/memory$own/ferrymq-iso.$$" 2>/dev/null; then
		cg=/sys/fs/cgroup/memory$own/ferrymq-iso.$$
		echo "$mem" >"$cg/memory.limit_in_bytes"
		procs=$cg/cgroup.procs how="cgroup v1, memory.limit_in_bytes = $MEM_LIMIT"
	fi
fi
if [[ -z "$procs" ]]; then
	if [[ "${MLOCK:-}" != 1 ]]; then
		echo "no memory cgroup to create (root, cgroup v1 or v2 with the memory controller);" \
			"MLOCK=1 locks all available memory but MEM_LIMIT and 2 GiB instead" >&2
		exit 1
	fi
	avail=$(awk '/MemAvailable/ {print $2 * 1024}' /proc/meminfo)
	lock=$((avail - mem - (2 << 30)))
	if ((lock <= 0)); then
		echo "nothing to lock: $avail bytes available" >&2
		exit 1
	fi
	# The interpreter itself, not a wrapper that forks it: $! must be the
	# process that holds the memory, so that the trap's kill releases it.
	py=$(python3 -c 'import sys; print(sys.executable)')
	"$py" -c '
import ctypes, mmap, signal, sys
n = int(sys.argv[1])
m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
buf = (ctypes.c_char * n).from_buffer(m)
if ctypes.CDLL(None, use_errno=True).mlock(buf, ctypes.c_size_t(n)) != 0:
    sys.exit("mlock: errno %d" % ctypes.get_errno())
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
print("locked", n, flush=True)
signal.sigwait({signal.SIGTERM, signal.SIGINT})' "$lock" >"$work/mlock.out" &
	mlock_pid=$!
	for _ in $(seq 600); do
		grep -q locked "$work/mlock.out" 2>/dev/null && break
		kill -0 "$mlock_pid" 2>/dev/null || { echo "mlock helper failed" >&2; exit 1; }
		sleep 0.1
	done
	how="mlock helper holding $((lock >> 20)) MiB (MemAvailable $((avail >> 20)) MiB), MEM_LIMIT $MEM_LIMIT left"
fi

# --- binaries, disk -----------------------------------------------------------
bin=${FERRYMQ_BIN:-$work/ferrymq}
if [[ -z "${FERRYMQ_BIN:-}" ]]; then
	go build -o "$bin" ./cmd/ferrymq
fi
data=${DATA:-$work/data}
mkdir -p "$data"
if [[ -z "${DISK_READ_MBPS:-}" ]]; then
	scripts/bench-disk.sh "$work" >"$work/disk.txt"
	DISK_READ_MBPS=$(awk '/^sequential read MB\/s:/ {print $4}' "$work/disk.txt")
fi

echo "machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(free -g | awk '/Mem:/{print $2}') GiB," \
	"disk $(df -h "$work" | awk 'NR==2{print $1}') (sequential read $DISK_READ_MBPS MB/s), $(date -u '+%F %H:%M UTC'), $(go version | awk '{print $3}'), $("$bin" version)"
echo "memory limit: $how; backlog $BACKLOG_BYTES of $BACKLOG_SIZE B messages, replayed in the $BACKLOG_PROCESS process (nice $BACKLOG_NICE); tail $RATE msgs/s of $SIZE B;" \
	"windows $DURATION after $WARMUP; $ROUNDS rounds per mode; budget ${BUDGET:-default}"

# --- the server ---------------------------------------------------------------
wait_for() { # FILE REGEX: waits up to 30 s for a line matching REGEX in FILE and prints it
	for _ in $(seq 300); do
		if grep -Eq "$2" "$1" 2>/dev/null; then
			grep -Em1 "$2" "$1"
			return 0
		fi
		if ! kill -0 "$server_pid" 2>/dev/null; then
			echo "server exited:" >&2
			cat "$1" "${1%.out}.log" >&2
			return 1
		fi
		sleep 0.1
	done
	echo "server did not start" >&2
	return 1
}

core_addr='' http_addr=''
start_server() { # mode
	local cfg=$work/$1.yaml
	{
		echo "store:"
		case $1 in
		nocache) echo "  tail_cache_bytes: -1" ;;
		budget-*) echo "  reader_cold_read_bytes_per_sec: $(bytes "${1#budget-}")" ;;
		esac
		if [[ -n "${BUDGET:-}" && $1 != budget-* ]]; then echo "  reader_cold_read_bytes_per_sec: $BUDGET"; fi
	} >"$cfg"
	# Into the cgroup first, then exec: every page the server touches is
	# charged to it.
	sh -c 'if [ -n "$1" ]; then echo $$ >"$1"; fi; shift; exec "$@"' sh "$procs" \
		"$bin" serve --config "$cfg" --data "$data" --core 127.0.0.1:0 --http 127.0.0.1:0 --mqtt 127.0.0.1:0 --ws "" \
		--log-level warn >"$work/server-$1.out" 2>"$work/server-$1.log" &
	server_pid=$!
	core_addr=$(wait_for "$work/server-$1.out" '^core ' | awk '{print $2}')
	http_addr=$(wait_for "$work/server-$1.out" '^http ' | awk '{print $2}')
}

stop_server() {
	kill -TERM "$server_pid"
	wait "$server_pid" 2>/dev/null || true
	server_pid=''
}

metric() { # the value of a counter on /metrics (0 if the scrape fails)
	local page
	page=$(curl -sf "http://$http_addr/metrics") || page=''
	awk -v n="$1" '$1 == n {v = $2} END {printf "%.0f", v}' <<<"$page"
}
majflt() { awk '{print $12}' "/proc/$server_pid/stat"; }
cputicks() { awk '{print $14 + $15}' "/proc/$server_pid/stat"; }
hz=$(getconf CLK_TCK)
readbytes() { awk '/^read_bytes/ {print $2}' "/proc/$server_pid/io"; }
cq_resident() { # percent of the tail topic's consume-queue pages in the page cache
	{ fincore -b -n -o RES,SIZE $(find "$data/consumequeue/tail" -type f) 2>/dev/null || true; } |
		awk '{r += $1; s += $2} END {if (s > 0) printf "%.0f", 100 * r / s; else print "-"}'
}
cg_usage() { # MiB the server's cgroup holds now, page cache included ("-" under the mlock helper)
	if [[ -f "$cg/memory.current" ]]; then echo $(($(cat "$cg/memory.current") >> 20))
	elif [[ -f "$cg/memory.usage_in_bytes" ]]; then echo $(($(cat "$cg/memory.usage_in_bytes") >> 20))
	else echo -; fi
}
field() { sed -nE "s/.*\"$1\":([0-9.e+-]+).*/\1/p" <<<"$2" | head -1; }

results=$work/results.tsv
printf 'mode\tround\trun\tp50_us\tp99_us\tp999_us\treceived\tbacklog_mb_s\tbacklog_done\tmajflt\tdisk_read_mb\thits\tmisses\tcold_mb\tdelayed\tcq_resident_pct\tserver_cpu_s\tcgroup_mib\n' >"$results"

run() { # mode round kind [bench tail args…]
	local mode=$1 round=$2 kind=$3
	shift 3
	local f0 r0 h0 m0 c0 d0 t0 row
	f0=$(majflt) r0=$(readbytes) t0=$(cputicks) h0=$(metric ferrymq_store_tail_cache_hits_total) m0=$(metric ferrymq_store_tail_cache_misses_total)
	c0=$(metric ferrymq_store_cold_read_bytes_total) d0=$(metric ferrymq_store_cold_reads_delayed_total)
	local replay_pid='' replay_out=$work/replay-$mode-$round.json replay_err=$work/replay-$mode-$round.txt
	if [[ $kind == with && $BACKLOG_PROCESS == own ]]; then
		nice -n "$BACKLOG_NICE" "$bin" bench replay --server "$core_addr" --topic backlog --json >"$replay_out" 2>"$replay_err" &
		replay_pid=$!
		for _ in $(seq 300); do
			grep -q 'first message' "$replay_err" 2>/dev/null && break
			kill -0 "$replay_pid" 2>/dev/null || { cat "$replay_err" >&2; return 1; }
			sleep 0.1
		done
	elif [[ $kind == with && $BACKLOG_PROCESS == raw ]]; then
		# The commit log's files read round and round with O_DIRECT, 4 MiB
		# per read into one aligned buffer, paced to RAW_MBPS if set; the
		# rate goes to $replay_out as the replay's does.
		python3 -c '
import glob, json, mmap, os, signal, sys, time
out, data, rate = sys.argv[1], sys.argv[2], float(sys.argv[3] or 0) * 1e6
files = sorted(glob.glob(data + "/commitlog/*"))
buf = mmap.mmap(-1, 4 << 20)
start, total, shown = time.monotonic(), 0, 0.0
def show():
    with open(out, "w") as f:
        json.dump({"mb_per_sec": total / 1e6 / (time.monotonic() - start), "done": False}, f, separators=(",", ":"))
signal.signal(signal.SIGTERM, lambda *_: (show(), sys.exit(0)))
while True:
    for name in files:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECT)
        off = 0
        while True:
            if rate:
                ahead = total / rate - (time.monotonic() - start)
                if ahead > 0:
                    time.sleep(ahead)
            n = os.preadv(fd, [buf], off)
            off, total = off + n, total + n
            if time.monotonic() - shown > 0.5:
                show()
                shown = time.monotonic()
            if n < len(buf):
                break  # the end of the file (O_DIRECT reads on from aligned offsets only)
        os.close(fd)
' "$replay_out" "$data" "${RAW_MBPS:-}" &
		replay_pid=$!
	elif [[ $kind == with ]]; then
		set -- "$@" --backlog backlog
	fi
	row=$("$bin" bench tail --server "$core_addr" --rate "$RATE" --size "$SIZE" --duration "$DURATION" --warmup "$WARMUP" \
		--label "$mode $kind" --json "$@" 2>"$work/progress-$mode-$round-$kind.txt")
	echo "$row" >>"$work/results.jsonl"
	local backlog=$row # the backlog group's rate and "done": in the tail's row, or the replay's own
	if [[ -n "$replay_pid" ]]; then
		if [[ $BACKLOG_PROCESS == raw ]]; then
			kill -TERM "$replay_pid" 2>/dev/null || true
		else
			kill -INT "$replay_pid" 2>/dev/null || true
		fi
		wait "$replay_pid" || true
		backlog=$(cat "$replay_out")
		echo "$backlog" >>"$work/results.jsonl"
	fi
	local mb done
	mb=$(sed -nE 's/.*"mb_per_sec":([0-9.e+-]+).*/\1/p' <<<"$backlog")
	done=$(sed -nE 's/.*"done":(true|false).*/\1/p' <<<"$backlog")
	printf '%s\t%s\t%s\t%.0f\t%.0f\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$mode" "$round" "$kind" \
		"$(field p50_us "$row")" "$(field p99_us "$row")" "$(field p999_us "$row")" "$(field received "$row")" \
		"${mb:--}" "${done:--}" "$(($(majflt) - f0))" "$((($(readbytes) - r0) >> 20))" \
		"$(($(metric ferrymq_store_tail_cache_hits_total) - h0))" "$(($(metric ferrymq_store_tail_cache_misses_total) - m0))" \
		"$((($(metric ferrymq_store_cold_read_bytes_total) - c0) >> 20))" "$(($(metric ferrymq_store_cold_reads_delayed_total) - d0))" \
		"$(cq_resident)" "$(awk -v t=$(($(cputicks) - t0)) -v hz="$hz" 'BEGIN {printf "%.1f", t / hz}')" "$(cg_usage)" | tee -a "$results"
}

# --- the backlog ----------------------------------------------------------------
if [[ -d "$data/consumequeue/backlog" ]]; then
	echo "the backlog is in $data already: $(du -sh "$data/commitlog" | cut -f1) of commit log" >&2
else
	start_server default
	count=$((backlog / BACKLOG_SIZE))
	echo "filling the backlog: $count messages of $BACKLOG_SIZE B …" >&2
	"$bin" bench core --server "$core_addr" --topic backlog --queues 8 --size "$BACKLOG_SIZE" --count "$count" \
		--producers 4 --pipeline 16 --json >"$work/fill.json" 2>/dev/null
	echo "filled: $(cat "$work/fill.json")" >&2
	stop_server
fi

# --- the runs ------------------------------------------------------------------
echo
printf 'mode\tround\trun\tp50_us\tp99_us\tp999_us\treceived\tbacklog_mb_s\tbacklog_done\tmajflt\tdisk_read_mb\thits\tmisses\tcold_mb\tdelayed\tcq_resident_pct\tserver_cpu_s\tcgroup_mib\n'
for round in $(seq "$ROUNDS"); do
	for mode in $MODES; do
		start_server "$mode"
		run "$mode" "$round" alone
		run "$mode" "$round" with
		stop_server
	done
done

# --- summary -------------------------------------------------------------------
echo
echo "| mode | round | tail p99 alone | tail p99 with the backlog | ratio | backlog MB/s (% of $DISK_READ_MBPS MB/s) | server major faults alone / with | disk read MiB with | tail-cache hits / misses with | cold MiB, budget waits with | tail consume queues resident | server CPU-s alone / with |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
awk -F'\t' -v disk="$DISK_READ_MBPS" -v own="$([[ $BACKLOG_PROCESS != same ]] && echo 1)" 'NR > 1 {
	k = $1 SUBSEP $2
	if ($3 == "alone") { alone[k] = $5; fa[k] = $10; ca[k] = $17 }
	else {
		r = $5 / alone[k]
		printf "| %s | %s | %.2f ms | %.2f ms | %.2f× | %.0f (%.0f %%)%s | %s / %s | %s | %s / %s | %s, %s | %s %% | %s / %s |\n", $1, $2, alone[k] / 1000, $5 / 1000, r,
			$8, 100 * $8 / disk, (own ? ($9 == "true" ? " (the backlog ran out inside the window)" : "") : ($9 == "true" ? "" : " (window ended first)")), fa[k], $10, $11, $12, $13, $14, $15, $16, ca[k], $17
	}
}' "$results"
