#!/usr/bin/env bash
# Starts (or stops) the 3-node NATS JetStream cluster that --engine nats
# docs, tests and benchmarks use: nats-server built from the Go module
# version in go.mod, configs in testdata/nats (sync_interval: always),
# clients on 127.0.0.1:4222-4224, data and logs under $FERRYMQ_NATS_DIR.
#
#   scripts/nats-cluster.sh start     # build if needed, start n1..n3, wait until JetStream answers
#   scripts/nats-cluster.sh stop      # stop them (by PID), keep the data
#   scripts/nats-cluster.sh clean     # stop and delete the data
#   scripts/nats-cluster.sh urls      # nats://127.0.0.1:4222,nats://127.0.0.1:4223,nats://127.0.0.1:4224
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${FERRYMQ_NATS_DIR:-${TMPDIR:-/tmp}/ferrymq-nats}"
bin="$dir/nats-server"
urls="nats://127.0.0.1:4222,nats://127.0.0.1:4223,nats://127.0.0.1:4224"

build() {
  local v
  v=$(go list -m -f '{{.Version}}' github.com/nats-io/nats-server/v2)
  if [[ -x "$bin" && "$(cat "$dir/version" 2>/dev/null)" == "$v" ]]; then return; fi
  mkdir -p "$dir"
  echo "building nats-server $v"
  go build -o "$bin" github.com/nats-io/nats-server/v2
  echo "$v" > "$dir/version"
}

start() {
  build
  for i in 1 2 3; do
    if [[ -f "$dir/n$i.pid" ]] && kill -0 "$(cat "$dir/n$i.pid")" 2>/dev/null; then
      echo "n$i already running (pid $(cat "$dir/n$i.pid"))"; continue
    fi
    mkdir -p "$dir/n$i"
    "$bin" -c "${NATS_CONF_DIR:-testdata/nats}/n$i.conf" -sd "$dir/n$i" -l "$dir/n$i.log" & echo $! > "$dir/n$i.pid"
  done
  for _ in $(seq 1 100); do
    ok=0
    for p in 8222 8223 8224; do
      curl -sf "http://127.0.0.1:$p/healthz" >/dev/null && ok=$((ok+1))
    done
    if [[ $ok == 3 ]]; then echo "$urls"; return; fi
    sleep 0.2
  done
  echo "cluster not healthy after 20 s; logs in $dir" >&2
  exit 1
}

stop() {
  for i in 1 2 3; do
    if [[ -f "$dir/n$i.pid" ]]; then
      kill "$(cat "$dir/n$i.pid")" 2>/dev/null || true
      rm -f "$dir/n$i.pid"
    fi
  done
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  clean) stop; sleep 1; rm -rf "${dir:?}"/n[123] "$dir"/n[123].log ;;
  urls) echo "$urls" ;;
  *) echo "usage: $0 start|stop|clean|urls" >&2; exit 2 ;;
esac
