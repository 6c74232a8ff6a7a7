#!/usr/bin/env bash
# Client quota isolation, ours against Apache Kafka 4.4 in the same run (issue 31):
#   bench/quota.sh [--quota-bytes 512000] [--seconds 40]
#
# For each broker in turn (single node on loopback, Kafka's tools from compat-tests/kafka-cli.sh):
#   1. the neighbour alone: kafka-producer-perf-test, client.id calm, 100 records/s of 1 KiB,
#      acks=all, for --seconds: its p99 latency;
#   2. producer_byte_rate=<quota> on client.id noisy (kafka-configs.sh), then the noisy
#      producer offering 10x the quota (records/s = 10 x quota / 1 KiB) for --seconds, and the
#      same neighbour run beside it: the neighbour's p99, and the noisy producer's achieved
#      rate over its last 20 s (its 5 s interval lines; the first seconds of a Kafka quota
#      window let a burst through) over the quota.
# Prints a table; raw tool outputs go to ${BENCH_OUT:-bench/out}/quota-<UTC time>/.
# Needs java, the Kafka jars (compat-tests/install.sh kafka), python3 and, unless BROKER_BIN
# names a broker binary, a release build in $CARGO_TARGET_DIR (cargo build --release -p broker).
# Ports: BENCH_OURS_PORT (28092), BENCH_KAFKA_PORT (28192, controller +1).
set -uo pipefail
BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
source "$ROOT/compat-tests/lib.sh"

quota=512000
seconds=40
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quota-bytes) quota=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    *) die "usage: bench/quota.sh [--quota-bytes N] [--seconds S]" ;;
  esac
done
OURS_PORT=${BENCH_OURS_PORT:-28092}
KAFKA_PORT=${BENCH_KAFKA_PORT:-28192}
RECORD_BYTES=1024
CALM_RATE=100
noisy_rate=$((10 * quota / RECORD_BYTES))
BROKER_BIN=${BROKER_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/broker}
[[ -x $BROKER_BIN ]] || die "no broker binary at $BROKER_BIN (cargo build --release -p broker, or BROKER_BIN=)"
CLI="$COMPAT_DIR/kafka-cli.sh"
out="${BENCH_OUT:-$ROOT/bench/out}/quota-$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out"
tmp=$(mktemp -d /tmp/bench-quota.XXXXXX)
pid=
cleanup() {
  [[ -n $pid ]] && kill -TERM "$pid" 2>/dev/null
  "$COMPAT_DIR/kafka-reference/stop.sh" "$tmp/kafka" >/dev/null 2>&1 || true
  sleep 1
  [[ -n $pid ]] && kill -KILL "$pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
blog() { printf '[quota-bench %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

perf() { # perf <bs> <client id> <topic> <records/s> <out>
  local n=$(($4 * seconds))
  timeout -k 5 $((seconds * 4 + 60)) "$CLI" kafka-producer-perf-test --topic "$3" --num-records "$n" \
    --record-size "$RECORD_BYTES" --throughput "$4" \
    --command-property bootstrap.servers="$1" client.id="$2" acks=all linger.ms=5 batch.size=65536 \
    >"$5" 2>&1 </dev/null
}
p99() { awk '/records sent,.*99th/ {for (i=1;i<=NF;i++) if ($i ~ /^99th/) {v=$(i-2)}} END {print v}' "$1" | tr -d ','; }
# The noisy producer's records/s over its interval lines after the first 20 s.
noisy_rate_of() {
  awk -v skip=$(((seconds - 20) / 5)) '/records sent,.*records\/sec/ && !/99th/ {
      n++; if (n > skip) {gsub(/[(,]/, "", $4); s += $4; c++} }
    END { if (c) printf "%.0f", s / c * 1024; else print "" }' "$1"
}

declare -A result
run_broker() { # run_broker <name> <bootstrap>
  local b=$1 bs=$2
  timeout 90 "$CLI" kafka-topics --bootstrap-server "$bs" --create --topic calm --partitions 1 --replication-factor 1 >/dev/null 2>&1
  timeout 90 "$CLI" kafka-topics --bootstrap-server "$bs" --create --topic noisy --partitions 1 --replication-factor 1 >/dev/null 2>&1
  blog "$b: neighbour alone"
  perf "$bs" calm calm "$CALM_RATE" "$out/$b.calm-alone.out"
  timeout 90 "$CLI" kafka-configs --bootstrap-server "$bs" --alter --entity-type clients --entity-name noisy \
    --add-config "producer_byte_rate=$quota" >"$out/$b.configs.out" 2>&1
  blog "$b: noisy producer at 10x its quota, neighbour beside it"
  perf "$bs" noisy noisy "$noisy_rate" "$out/$b.noisy.out" &
  local noisy_pid=$!
  perf "$bs" calm calm "$CALM_RATE" "$out/$b.calm-noisy.out"
  wait "$noisy_pid"
  result[$b.alone]=$(p99 "$out/$b.calm-alone.out")
  result[$b.beside]=$(p99 "$out/$b.calm-noisy.out")
  result[$b.noisy]=$(noisy_rate_of "$out/$b.noisy.out")
}

blog "starting our broker ($BROKER_BIN) on 127.0.0.1:$OURS_PORT"
"$BROKER_BIN" --override "listeners=PLAINTEXT://127.0.0.1:$OURS_PORT" --override "log.dirs=$tmp/ours" \
  --override "metrics.listen.address=none" >"$out/ours.broker.log" 2>&1 </dev/null &
pid=$!
python3 "$BENCH_DIR/ready.py" 127.0.0.1 "$OURS_PORT" 90 >/dev/null || die "our broker did not start"
run_broker ours "127.0.0.1:$OURS_PORT"
kill -TERM "$pid"; wait "$pid" 2>/dev/null; pid=

blog "starting Apache Kafka on 127.0.0.1:$KAFKA_PORT"
KAFKA_EXTRA_JAVA_OPTS="-Xms512m -Xmx1g" CONTROLLER_PORT=$((KAFKA_PORT + 1)) \
  "$COMPAT_DIR/kafka-reference/start.sh" "$KAFKA_PORT" "$tmp/kafka" >/dev/null 2>"$out/kafka.start.err" \
  || die "Apache Kafka did not start"
run_broker kafka "127.0.0.1:$KAFKA_PORT"

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b == 0) print "-"; else printf "%.2f", a / b }'; }
{
  echo "quota: producer_byte_rate=$quota on client.id noisy, offered $((noisy_rate * RECORD_BYTES)) B/s; neighbour $CALM_RATE records/s; ${seconds} s runs; $(nproc) CPUs, load $(cut -d' ' -f1 /proc/loadavg)"
  echo
  echo "| broker | noisy achieved / quota | neighbour p99 alone (ms) | neighbour p99 beside noisy (ms) | p99 beside / alone |"
  echo "|---|---|---|---|---|"
  for b in ours kafka; do
    echo "| $b | $(ratio "${result[$b.noisy]}" "$quota") | ${result[$b.alone]:--} | ${result[$b.beside]:--} | $(ratio "${result[$b.beside]}" "${result[$b.alone]}") |"
  done
} | tee "$out/table.md"
