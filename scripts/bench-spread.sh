#!/usr/bin/env bash
# How consumption spreads over JetStream nodes (issue #23). On one machine
# every node shares the same cores, so no throughput figure: instead, for
# NODES in 1 and 3, GROUPS consumer groups each replay the same backlog of
# COUNT messages (`ferrymq bench replay`, each a new group, each connected
# to a different node in turn), and the script reports which node serves
# each group (`ferrymq nodes --json`) and each ferrymq node's CPU time
# during the replay (/proc/PID/stat utime+stime): the busiest node's CPU
# per million messages consumed falls as its share of the groups does.
#
# Needs the 3-node NATS cluster of scripts/nats-cluster.sh (started here,
# left running; `scripts/nats-cluster.sh clean` removes it).
#
# Usage: scripts/bench-spread.sh
# Environment (defaults in brackets): COUNT [100000] SIZE [256] GROUP_COUNT [6]
#   NODE_COUNTS ["1 3"]  DIR [/tmp/ferrymq-spread]
set -euo pipefail
cd "$(dirname "$0")/.."
count=${COUNT:-100000}
size=${SIZE:-256}
ngroups=${GROUP_COUNT:-6}
dir=${DIR:-/tmp/ferrymq-spread}
mkdir -p "$dir"
# (its servers keep the output open: read it from a file, not a pipe)
scripts/nats-cluster.sh start > "$dir/nats.out"
urls=$(tail -1 "$dir/nats.out")
go build -o "$dir/ferrymq" ./cmd/ferrymq
bin="$dir/ferrymq"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

ticks=$(getconf CLK_TCK)
cpu() { awk '{print $14+$15}' "/proc/$1/stat"; } # utime+stime, in clock ticks

echo "# bench-spread $(date -u +%Y-%m-%dT%H:%M:%SZ) $(nproc) cores: ${ngroups} groups replay ${count} msgs of ${size} B"
for nodes in ${NODE_COUNTS:-1 3}; do
  run="$dir/run-$nodes-$$"
  mkdir -p "$run"
  pids=()
  cores=()
  for i in $(seq 1 "$nodes"); do
    name="spread-$nodes-$i-$$"
    core="127.0.0.1:$((11910 + i))"
    cores+=("$core")
    printf 'engine: nats\nnats:\n  urls: [%s]\n  replicas: 3\n  node: %s\n  lease_ttl: 3s\n' "$urls" "$name" > "$run/$name.yaml"
    "$bin" serve --config "$run/$name.yaml" --data "$run/$name" --core "$core" --http "" --mqtt "127.0.0.1:$((11930 + i))" --ws "" \
      > "$run/$name.out" 2> "$run/$name.log" &
    pids+=($!)
  done
  for core in "${cores[@]}"; do
    for _ in $(seq 1 300); do "$bin" nodes --server "$core" > /dev/null 2>&1 && break; sleep 0.1; done
  done
  sleep 4 # every node's liveness lease seen by the others (lease_ttl 3 s)
  topic="spread-$nodes-$$"
  "$bin" bench core --server "${cores[0]}" --topic "$topic" --queues 8 --count "$count" --size "$size" --json > "$run/produce.json"
  declare -A before=()
  for p in "${pids[@]}"; do before[$p]=$(cpu "$p"); done
  start=$(date +%s.%N)
  rpids=()
  for g in $(seq 1 "$ngroups"); do
    core=${cores[$(( (g - 1) % nodes ))]}
    "$bin" bench replay --server "$core" --topic "$topic" --json > "$run/replay-$g.json" &
    rpids+=($!)
  done
  sleep 2
  "$bin" nodes --server "${cores[0]}" --json > "$run/nodes.json" || true
  wait "${rpids[@]}"
  secs=$(echo "$(date +%s.%N) - $start" | bc)
  echo "## $nodes node(s): replay of $ngroups groups took ${secs%.*} s"
  python3 - "$run/nodes.json" "$nodes" <<'PY'
import json, sys, collections
info = json.load(open(sys.argv[1]))
by = collections.defaultdict(list)
for g, n in (info.get("groups") or {}).items():
    by[n].append(g)
for n in sorted(by):
    print(f"  {n}: {len(by[n])} groups")
PY
  busiest=0
  for p in "${pids[@]}"; do
    used=$(( $(cpu "$p") - before[$p] ))
    (( used > busiest )) && busiest=$used
    echo "  pid $p: $(echo "scale=2; $used / $ticks" | bc) CPU-s"
  done
  consumed=$(( count * ngroups ))
  echo "  busiest node: $(echo "scale=2; $busiest / $ticks" | bc) CPU-s, $(echo "scale=2; $busiest / $ticks / ($consumed / 1000000)" | bc) CPU-s per million consumed (of $consumed)"
  cleanup
  pids=()
  sleep 4 # the stopped nodes' leases expire before the next round's nodes start
done
