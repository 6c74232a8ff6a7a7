#!/usr/bin/env bash
# Client quota isolation, ours against Apache Kafka 4.4 in the same run (issue 31):
#   bench/quota.sh [--quota-bytes 512000] [--seconds 40] [--rounds 3]
#
# For each broker in turn (single node on loopback, Kafka's tools from compat-tests/kafka-cli.sh),
# --rounds times:
#   1. the neighbour alone: kafka-producer-perf-test, client.id calm, 100 records/s of 1 KiB,
#      acks=all, for --seconds: its p99 latency;
#   2. the control: a producer (client.id loud, no quota) offering exactly the quota's bytes/s,
#      and the neighbour beside it once it has run 10 s: what that load alone does to the
#      neighbour's p99;
#   3. with producer_byte_rate=<quota> on client.id noisy (kafka-configs.sh, set once): the
#      noisy producer offering 10x the quota (records/s = 10 x quota / 1 KiB), and the
#      neighbour beside it once it has run 10 s (held to its quota by then on both brokers;
#      a quota window lets the first seconds through): the neighbour's p99, and the noisy
#      producer's achieved rate over its 5 s interval lines from 20 s on, over the quota.
# The loud and noisy producers stop when the neighbour's run ends. The table has each
# figure's median over the rounds. Raw tool outputs go to ${BENCH_OUT:-bench/out}/quota-<UTC time>/.
# Needs java, the Kafka jars (compat-tests/install.sh kafka), python3 and, unless BROKER_BIN
# names a broker binary, a release build in $CARGO_TARGET_DIR (cargo build --release -p broker).
# Ports: BENCH_OURS_PORT (28092), BENCH_KAFKA_PORT (28192, controller +1).
set -uo pipefail
BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
source "$ROOT/compat-tests/lib.sh"

quota=512000
seconds=40
rounds=3
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quota-bytes) quota=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    *) die "usage: bench/quota.sh [--quota-bytes N] [--seconds S] [--rounds R]" ;;
  esac
done
# How long the loud and noisy producers run before the neighbour starts.
WARM_S=10
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

perf() { # perf <bs> <client id> <topic> <records/s> <out> [<stop after s>]
  local n=$(($4 * seconds)) limit=$((seconds * 4 + 60))
  # A background load: more records than it can send, stopped by the timeout.
  [[ -n ${6:-} ]] && { n=$(($4 * $6 * 2)); limit=$6; }
  timeout -k 5 "$limit" "$CLI" kafka-producer-perf-test --topic "$3" --num-records "$n" \
    --record-size "$RECORD_BYTES" --throughput "$4" \
    --command-property bootstrap.servers="$1" client.id="$2" acks=all linger.ms=5 batch.size=65536 \
    >"$5" 2>&1 </dev/null
}
p99() { awk '/records sent,.*99th/ {for (i=1;i<=NF;i++) if ($i ~ /^99th/) {v=$(i-2)}} END {print v}' "$1" | tr -d ','; }
# The noisy producer's bytes/s over its 5 s interval lines from 20 s on, an even number of
# them: held to its quota, it alternates a burst and a wait of about one 10 s quota window
# (two lines), so an odd count would weigh bursts or waits twice.
noisy_rate_of() {
  awk -v skip=4 '/records sent,.*records\/sec/ && !/99th/ {
      n++; if (n > skip) {gsub(/[(,]/, "", $4); v[++c] = $4} }
    END { c -= c % 2; for (i = 1; i <= c; i++) s += v[i]; if (c) printf "%.0f", s / c * 1024; else print "" }' "$1"
}

# A process's CPU time so far, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
TICKS=$(getconf CLK_TCK)

# The median of its arguments (empty ones left out).
median() { printf '%s\n' "$@" | awk 'NF' | sort -n | awk '{v[NR]=$1} END {if (NR) print v[int((NR+1)/2)]}'; }

declare -A result
run_broker() { # run_broker <name> <bootstrap> <broker pid>
  local b=$1 bs=$2 bpid=$3 r alone=() loud=() beside=() noisy=() cpu=() bg t0 s0
  for t in calm loud noisy; do
    timeout 90 "$CLI" kafka-topics --bootstrap-server "$bs" --create --topic $t --partitions 1 --replication-factor 1 >/dev/null 2>&1
  done
  timeout 90 "$CLI" kafka-configs --bootstrap-server "$bs" --alter --entity-type clients --entity-name noisy \
    --add-config "producer_byte_rate=$quota" >"$out/$b.configs.out" 2>&1
  local load_s=$((WARM_S + seconds + 15))
  for r in $(seq 1 "$rounds"); do
    blog "$b round $r: neighbour alone"
    perf "$bs" calm calm "$CALM_RATE" "$out/$b.$r.calm-alone.out"
    alone+=("$(p99 "$out/$b.$r.calm-alone.out")")
    blog "$b round $r: neighbour beside an unthrottled producer at the quota's rate"
    perf "$bs" loud loud $((quota / RECORD_BYTES)) "$out/$b.$r.loud.out" "$load_s" &
    bg=$!
    sleep "$WARM_S"
    perf "$bs" calm calm "$CALM_RATE" "$out/$b.$r.calm-loud.out"
    wait "$bg"
    loud+=("$(p99 "$out/$b.$r.calm-loud.out")")
    blog "$b round $r: neighbour beside the noisy producer at 10x its quota"
    perf "$bs" noisy noisy "$noisy_rate" "$out/$b.$r.noisy.out" "$load_s" &
    bg=$!
    sleep "$WARM_S"
    t0=$(cpu_ticks "$bpid") s0=$SECONDS
    perf "$bs" calm calm "$CALM_RATE" "$out/$b.$r.calm-noisy.out"
    # The broker's CPU while it serves both: % of one core.
    cpu+=("$(awk -v t=$(($(cpu_ticks "$bpid") - t0)) -v hz="$TICKS" -v s=$((SECONDS - s0)) 'BEGIN { if (s > 0) printf "%.1f", t / hz / s * 100 }')")
    wait "$bg"
    beside+=("$(p99 "$out/$b.$r.calm-noisy.out")")
    noisy+=("$(noisy_rate_of "$out/$b.$r.noisy.out")")
  done
  result[$b.alone]=$(median "${alone[@]}")
  result[$b.loud]=$(median "${loud[@]}")
  result[$b.beside]=$(median "${beside[@]}")
  result[$b.noisy]=$(median "${noisy[@]}")
  result[$b.cpu]=$(median "${cpu[@]}")
  result[$b.rounds]="alone ${alone[*]}; beside loud ${loud[*]}; beside noisy ${beside[*]}"
}

blog "starting our broker ($BROKER_BIN) on 127.0.0.1:$OURS_PORT"
"$BROKER_BIN" --override "listeners=PLAINTEXT://127.0.0.1:$OURS_PORT" --override "log.dirs=$tmp/ours" \
  --override "metrics.listen.address=none" >"$out/ours.broker.log" 2>&1 </dev/null &
pid=$!
python3 "$BENCH_DIR/ready.py" 127.0.0.1 "$OURS_PORT" 90 >/dev/null || die "our broker did not start"
run_broker ours "127.0.0.1:$OURS_PORT" "$pid"
kill -TERM "$pid"; wait "$pid" 2>/dev/null; pid=

blog "starting Apache Kafka on 127.0.0.1:$KAFKA_PORT"
KAFKA_EXTRA_JAVA_OPTS="-Xms512m -Xmx1g" CONTROLLER_PORT=$((KAFKA_PORT + 1)) \
  "$COMPAT_DIR/kafka-reference/start.sh" "$KAFKA_PORT" "$tmp/kafka" >"$tmp/kafka.pid" 2>"$out/kafka.start.err" \
  || die "Apache Kafka did not start"
run_broker kafka "127.0.0.1:$KAFKA_PORT" "$(tail -1 "$tmp/kafka.pid")"

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b == 0) print "-"; else printf "%.2f", a / b }'; }
{
  echo "quota: producer_byte_rate=$quota on client.id noisy, offered $((noisy_rate * RECORD_BYTES)) B/s; neighbour $CALM_RATE records/s; ${seconds} s runs, median of $rounds rounds; $(nproc) CPUs, load $(cut -d' ' -f1 /proc/loadavg)"
  echo
  echo "| broker | noisy achieved / quota | neighbour p99 alone (ms) | beside the same load unthrottled (ms) | beside noisy (ms) | p99 beside noisy / alone | broker CPU beside noisy (% of a core) |"
  echo "|---|---|---|---|---|---|---|"
  for b in ours kafka; do
    echo "| $b | $(ratio "${result[$b.noisy]}" "$quota") | ${result[$b.alone]:--} | ${result[$b.loud]:--} | ${result[$b.beside]:--} | $(ratio "${result[$b.beside]}" "${result[$b.alone]}") | ${result[$b.cpu]:--} |"
  done
  echo
  for b in ours kafka; do echo "$b p99 per round (ms): ${result[$b.rounds]}"; done
} | tee "$out/table.md"
