#!/usr/bin/env bash
# fanin-split.sh: the QoS 1 fan-in of bench-report.sh (10 × `mosquitto_pub -l`,
# 10,000 × 256 B each, one `mosquitto_sub -t '#'`), taken apart: where each
# process runs is chosen, and the subscriber's and publishers' own CPU time
# is reported, so a gap in delivered/s can be put on the broker or on the
# clients that share its CPU. docs/BENCHMARKS.md ("QoS 1 fan-in, taken
# apart") has what it found.
#
# Usage: scripts/fanin-split.sh ferrymq|nats [QOS]
#
#   FLUSH    ferrymq's --flush [sync]
#   SUBCPU   the CPU mosquitto_sub runs on [1]
#   PUBCPU   the CPU the ten mosquitto_pub run on [1: the report's layout;
#            0 puts them beside the broker and leaves the subscriber alone]
#   SUBWRAP  a command to run mosquitto_sub under (e.g. "strace -c -f -o F")
#   PEER_BIN where nats-server is installed [~/.cache/ferrymq-peers/bin]
#
# The broker always runs on CPU 0. Prints one line: delivered (distinct
# lines), delivered/s from the first publish to the last line received, the
# subscriber's CPU µs per delivered message, its context switches, and the
# publishers' user/system CPU (bash `times`).
set -euo pipefail

peer=${1:?usage: fanin-split.sh ferrymq|nats [QOS]}
qos=${2:-1}
PEER_BIN=${PEER_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/ferrymq-peers/bin}
root=$(cd "$(dirname "$0")/.." && pwd)
d=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$d"
}
trap cleanup EXIT

awk 'BEGIN { pad = sprintf("%256s", ""); gsub(/ /, "x", pad)
	for (i = 0; i < 10000; i++) print substr(sprintf("%08d ", i) pad, 1, 256) }' >"$d/lines"

case $peer in
nats)
	printf 'server_name: b\nlisten: 127.0.0.1:4250\njetstream { store_dir: "%s/js" }\nmqtt { listen: "127.0.0.1:1900" }\n' "$d" >"$d/n.conf"
	taskset -c 0 "$PEER_BIN/nats-server" -c "$d/n.conf" >"$d/broker.log" 2>&1 &
	;;
ferrymq)
	(cd "$root" && go build -o "$d/ferrymq" ./cmd/ferrymq)
	taskset -c 0 "$d/ferrymq" serve --data "$d/data" --flush "${FLUSH:-sync}" \
		--mqtt 127.0.0.1:1900 --ws 127.0.0.1:1901 --core 127.0.0.1:1902 --http 127.0.0.1:1903 \
		>"$d/broker.log" 2>&1 &
	;;
*) echo "fanin-split.sh: unknown peer $peer" >&2; exit 2 ;;
esac
pids+=($!)
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/1900) 2>/dev/null && break; sleep 0.05; done

# shellcheck disable=SC2086 # SUBWRAP is a command line
taskset -c "${SUBCPU:-1}" ${SUBWRAP:-} mosquitto_sub -h 127.0.0.1 -p 1900 -q "$qos" -v -t '#' -i fsub >"$d/recv" &
pids+=($!)
sleep 1

t0=$(date +%s.%N)
(
	for i in $(seq 0 9); do
		taskset -c "${PUBCPU:-1}" mosquitto_pub -h 127.0.0.1 -p 1900 -q "$qos" -l -t "fanin/$i" -i "fpub$i" <"$d/lines" &
	done
	wait
	times >"$d/pubtimes"
)
# Done when all 100,000 arrived or nothing arrived for 3 s.
last=-1 still=0
while :; do
	n=$(wc -l <"$d/recv")
	((n >= 100000)) && break
	if ((n == last)); then
		((++still >= 30)) && break
	else
		still=0 last=$n
	fi
	sleep 0.1
done
tl=$(date -r "$d/recv" +%s.%N)
sub=$(pgrep -f "^mosquitto_sub .*-i fsub" | head -1)
read -r ut st <<<"$(awk '{ print $14, $15 }' "/proc/$sub/stat")"
switches=$(grep ctxt "/proc/$sub/status" | tr -s '\t\n' '  ')
n=$(sort -u "$d/recv" | wc -l)
tick=$(getconf CLK_TCK)
echo "$peer qos$qos delivered=$n rate=$(echo "$n / ($tl - $t0)" | bc)/s" \
	"sub_us_per_msg=$(echo "($ut + $st) * 1000000 / $tick / $n" | bc -l | cut -c1-5)" \
	"$switches pubs_cpu=$(tail -1 "$d/pubtimes")"
