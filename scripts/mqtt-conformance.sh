#!/usr/bin/env bash
# mqtt-conformance.sh: run the Eclipse Paho interoperability client tests
# (MQTT 3.1.1: client_test.py, MQTT 5: client_test5.py) against `ferrymq
# serve` and against Mosquitto, one test per Python process, and print one
# Markdown table, test by test, with both brokers side by side.
#
# The suite is not part of this repository. Get it by cloning the public
# eclipse/paho.mqtt.testing repository from GitHub; its interoperability/
# folder is the suite (pure Python 3, no packages to install):
#
#   git clone <eclipse/paho.mqtt.testing> /tmp/paho.mqtt.testing
#   PAHO_TESTING_DIR=/tmp/paho.mqtt.testing/interoperability scripts/mqtt-conformance.sh
#
# Brokers are configured the way the suite expects (an ACL refusing
# subscriptions to test/nosubscribe, a keepalive cap of 60 s):
#   ferrymq    testdata/conformance/ferrymq.yaml (MQTT on 127.0.0.1:21983,
#              core :21984, HTTP :21985), fresh data directory, this tree
#   mosquitto  testdata/conformance/mosquitto.conf (127.0.0.1:21990) and
#              mosquitto.acl; `apt-get install -y mosquitto` if missing
# Each broker is started as a child process and stopped by its PID.
#
# Environment (defaults in brackets):
#   PAHO_TESTING_DIR  the suite's interoperability/ folder [required]
#   BROKERS           brokers to run [ferrymq mosquitto]
#   SUITES            test files to run [client_test.py client_test5.py]
#   TESTS             only these test names (space separated) [all]
#   TEST_TIMEOUT      seconds one test may take [90]
#   FERRYMQ_CONFIG    ferrymq's config [testdata/conformance/ferrymq.yaml]
#                     (its mqtt.addr must stay 127.0.0.1:21983)
#   OUT_DIR           logs and results.tsv [a new temp dir]
# Exit status: 0 when the table was produced (failures are data, not errors).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
: "${PAHO_TESTING_DIR:?set PAHO_TESTING_DIR to the interoperability folder of the suite (see the header)}"
suite=$(cd "$PAHO_TESTING_DIR" && pwd)
BROKERS=${BROKERS:-ferrymq mosquitto}
SUITES=${SUITES:-client_test.py client_test5.py}
TEST_TIMEOUT=${TEST_TIMEOUT:-90}
FERRYMQ_CONFIG=${FERRYMQ_CONFIG:-testdata/conformance/ferrymq.yaml}
OUT_DIR=${OUT_DIR:-$(mktemp -d /tmp/mqtt-conformance.XXXXXX)}
mkdir -p "$OUT_DIR"
results=$OUT_DIR/results.tsv
: >"$results"
host=127.0.0.1

for f in $SUITES; do
	[[ -f $suite/$f ]] || { echo "no $f in $suite" >&2; exit 2; }
done
command -v python3 >/dev/null || { echo "python3 is needed" >&2; exit 2; }

broker_pid=""
stop_broker() {
	if [[ -n $broker_pid ]] && kill -0 "$broker_pid" 2>/dev/null; then
		kill -TERM "$broker_pid" 2>/dev/null || true
		for _ in $(seq 50); do kill -0 "$broker_pid" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$broker_pid" 2>/dev/null || true
		wait "$broker_pid" 2>/dev/null || true
	fi
	broker_pid=""
}
trap stop_broker EXIT

wait_port() { # port
	for _ in $(seq 100); do
		if (exec 3<>"/dev/tcp/$host/$1") 2>/dev/null; then return 0; fi
		kill -0 "$broker_pid" 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}

start_broker() { # name → sets broker_pid and port
	case $1 in
	ferrymq)
		if [[ ! -x $OUT_DIR/ferrymq ]]; then
			go build -o "$OUT_DIR/ferrymq" ./cmd/ferrymq
		fi
		rm -rf "$OUT_DIR/ferrymq-data"
		port=21983
		# --ws "": an empty mqtt.ws.addr in the config file does not
		# (yet) disable the WebSocket listener; the flag does.
		"$OUT_DIR/ferrymq" serve --config "$FERRYMQ_CONFIG" --ws "" \
			--data "$OUT_DIR/ferrymq-data" >>"$OUT_DIR/ferrymq.log" 2>&1 &
		broker_pid=$!
		;;
	mosquitto)
		command -v mosquitto >/dev/null || {
			echo "mosquitto not found: apt-get install -y mosquitto" >&2
			return 1
		}
		port=21990
		mosquitto -c testdata/conformance/mosquitto.conf >>"$OUT_DIR/mosquitto.log" 2>&1 &
		broker_pid=$!
		;;
	*) echo "unknown broker $1" >&2; return 1 ;;
	esac
	wait_port "$port" || { echo "$1 did not start; see $OUT_DIR/$1.log" >&2; return 1; }
}

version_of() {
	case $1 in
	ferrymq) "$OUT_DIR/ferrymq" version 2>/dev/null | head -1 || echo "this tree" ;;
	mosquitto) mosquitto -h 2>/dev/null | sed -n 's/^mosquitto version //p' | head -1 ;;
	esac
}

tests_of() { # file
	if [[ -n ${TESTS:-} ]]; then
		for t in $TESTS; do grep -q "def $t(" "$suite/$1" && echo "$t"; done
	else
		sed -n 's/^    def \(test[A-Za-z0-9_]*\)(self).*/\1/p' "$suite/$1"
	fi
}

for b in $BROKERS; do
	for f in $SUITES; do
		# A fresh broker for each file, as the suite runs each file on its own.
		start_broker "$b"
		for t in $(tests_of "$f"); do
			log=$OUT_DIR/$b.${f%.py}.$t.log
			start=$(date +%s)
			rc=0
			timeout -k 5 "$TEST_TIMEOUT" python3 "$root/scripts/paho-run.py" \
				"$suite" "$f" "$host" "$port" "$t" >"$log" 2>&1 || rc=$?
			secs=$(($(date +%s) - start))
			if [[ $rc -eq 124 || $rc -eq 137 ]]; then
				res=timeout
			elif grep -q "^OK" "$log" && [[ $rc -eq 0 ]]; then
				res=pass
			elif grep -q "^ERROR:" "$log"; then
				res=error
			else
				res=fail
			fi
			printf '%s\t%s\t%s\t%s\t%s\n' "$b" "$f" "$t" "$res" "$secs" >>"$results"
			printf '%-10s %-16s %-32s %-7s %3ss\n' "$b" "$f" "$t" "$res" "$secs" >&2
		done
		stop_broker
	done
done

# The table: one row per test, a column per broker.
{
	echo "Run $(date -u +%Y-%m-%dT%H:%MZ) on $(uname -sm); python $(python3 -c 'import platform; print(platform.python_version())')."
	for b in $BROKERS; do echo "- $b: $(version_of "$b")"; done
	echo
	printf '| file | test |'
	for b in $BROKERS; do printf ' %s |' "$b"; done
	echo
	printf '|---|---|'
	for _ in $BROKERS; do printf '%s' '---|'; done
	echo
	for f in $SUITES; do
		for t in $(tests_of "$f"); do
			printf '| %s | `%s` |' "$f" "$t"
			for b in $BROKERS; do
				r=$(awk -F'\t' -v b="$b" -v f="$f" -v t="$t" '$1==b && $2==f && $3==t {print $4}' "$results")
				printf ' %s |' "${r:--}"
			done
			echo
		done
	done
	echo
	for b in $BROKERS; do
		for f in $SUITES; do
			awk -F'\t' -v b="$b" -v f="$f" '$1==b && $2==f {n++; if ($4=="pass") p++}
				END {printf "%s %s: %d/%d pass\n", b, f, p, n}' "$results"
		done
	done
	echo
	echo "Logs: $OUT_DIR"
} | tee "$OUT_DIR/table.md"
