#!/usr/bin/env bash
# Side-by-side benchmark of our broker against Apache Kafka 4.4.0 on this machine:
#   bench/run.sh [--smoke] [--duration S] [--workloads W1,W2,W3,W4,W5,TXN,E2E]
# Installs the Kafka jars (compat-tests/install.sh kafka), builds our broker
# (release) unless BROKER_BIN names one, starts both on their own ports with the
# same settings, runs every workload with Kafka's own tools against each broker
# in turn, and prints a markdown table of ours/Kafka ratios against the targets
# of issue 4. Raw tool outputs, both broker logs and the table go to
# ${BENCH_OUT:-bench/out}/<UTC time>/ (bench/out/latest points at the last run).
# docs/benchmarks.md describes the method and what the comparison leaves out.
#
# --smoke runs tiny record counts (seconds per workload) to prove the harness
# works end to end. The exit status is non-zero when a tool fails against Kafka,
# or against our broker for a workload in EXPECTED_OURS below.
set -uo pipefail
BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
source "$ROOT/compat-tests/lib.sh"

# The workloads whose tools must succeed against our broker (W5 needs the
# replicated cluster of issue 6 and is reported as not run).
EXPECTED_OURS=(W1 W2 W3 W4 TXN E2E)

ALL_WORKLOADS=(W1 W2 W3 W4 W5 TXN E2E)
# Ports (BENCH_OURS_PORT, BENCH_KAFKA_PORT, BENCH_KAFKA_CONTROLLER_PORT to move
# them) below the ephemeral range (32768-60999): an outgoing connection can hold a
# port inside it and make a broker fail to bind.
OURS_PORT=${BENCH_OURS_PORT:-28092}
KAFKA_PORT=${BENCH_KAFKA_PORT:-28192}
KAFKA_CONTROLLER_PORT=${BENCH_KAFKA_CONTROLLER_PORT:-28193}
RECORD_BYTES=1024
W1_PARTITIONS=8
W4_PARTITIONS=1000
# W4 uses one codec to keep the run short; none makes the broker's own
# per-partition cost the largest share of the work.
W4_CODEC=none
# The producer of W1, W2 and W4 (issue 4): acks=all, 5 ms linger, 64 KiB batches.
PRODUCER_PROPS=(acks=all linger.ms=5 batch.size=65536)
# TXN: transactions as long as kafka-producer-perf-test's example, one codec.
TXN_DURATION_MS=100
TXN_CODEC=lz4
# Kafka's JVM as issue 4 asks; the heap is touched at start so that its RSS is
# what a production Kafka holds, not what a lazily paged heap happens to reach.
KAFKA_JAVA_OPTS="-Xms512m -Xmx1g -XX:+AlwaysPreTouch"
# Settings both brokers get, so they do the same work. The flush policy is
# Kafka's default written out: no fsync per message or per interval; the OS
# writes dirty pages back, and a rolled segment is fsynced (both brokers do that).
SHARED_PROPS=(
  num.partitions=1
  auto.create.topics.enable=true
  log.flush.interval.messages=9223372036854775807
  log.flush.interval.ms=9223372036854775807
  log.retention.ms=604800000
  log.retention.bytes=-1
  log.segment.bytes=1073741824
  # What start.sh gives Kafka for consumer groups (a single node, no wait for
  # more members before the first rebalance); a broker without groups ignores them.
  group.initial.rebalance.delay.ms=0
  offsets.topic.num.partitions=3
  offsets.topic.replication.factor=1
)

usage() {
  echo "usage: bench/run.sh [--smoke] [--duration S] [--workloads W1,W2,W3,W4,W5,TXN,E2E]" >&2
  exit 2
}

smoke=0
duration_s=20
workloads_arg=$(IFS=,; echo "${ALL_WORKLOADS[*]}")
while (($#)); do
  case "$1" in
    --smoke) smoke=1; shift ;;
    --duration) [[ ${2:-} =~ ^[0-9]+$ && $2 -ge 1 ]] || usage; duration_s=$2; shift 2 ;;
    --workloads) [[ -n ${2:-} ]] || usage; workloads_arg=$2; shift 2 ;;
    *) usage ;;
  esac
done
declare -A selected=()
IFS=, read -r -a wanted <<<"$workloads_arg"
for w in "${wanted[@]}"; do
  w=${w^^}
  [[ " ${ALL_WORKLOADS[*]} " == *" $w "* ]] || die "unknown workload '$w' (expected ${ALL_WORKLOADS[*]})"
  selected[$w]=1
done
wants() { [[ -n ${selected[$1]:-} ]]; }

if ((smoke)); then
  calibration_records=5000
  e2e_records=200
  tool_timeout_s=120
else
  calibration_records=100000
  e2e_records=$((duration_s * 100))
  # A generous bound: a broker five times slower than Kafka still finishes.
  tool_timeout_s=$((duration_s * 6 + 120))
fi
# Bounds on the record count of one producer run: the W1 topics of both brokers
# stay on disk until W3 has read them, so the upper bound is also a disk bound.
min_records=10000
max_records=${BENCH_MAX_RECORDS:-3000000}
admin_timeout_s=90
ready_timeout_s=120

out_root=${BENCH_OUT:-$ROOT/bench/out}
run_dir="$out_root/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$run_dir/kafka" "$run_dir/ours" || die "cannot create $run_dir"
ln -sfn "$(basename "$run_dir")" "$out_root/latest"
meta="$run_dir/meta.env"
: >"$meta"
note() { printf '%s=%s\n' "$1" "$2" >>"$meta"; }
blog() { printf '[bench %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
blog "raw results in $run_dir"

"$COMPAT_DIR/install.sh" kafka >"$run_dir/install.log" 2>&1 \
  || { cat "$run_dir/install.log" >&2; die "installing the Kafka jars failed"; }
kafka_jar=$(compgen -G "$KAFKA_LIBS/kafka_2.13-*.jar" | head -1)
kafka_version=$(basename "$kafka_jar" .jar)
kafka_version=${kafka_version#kafka_2.13-}

broker_origin=
if [[ -z ${BROKER_BIN:-} ]]; then
  broker_origin="commit $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
  blog "building our broker (cargo build --release -p broker)"
  (cd "$ROOT" && cargo build --release -p broker) || die "broker build failed"
  BROKER_BIN="$CARGO_TARGET_DIR/release/broker"
fi
[[ -x $BROKER_BIN ]] || die "no broker binary at $BROKER_BIN"
# A given binary may come from any commit: name it by its time and hash.
[[ -n $broker_origin ]] || broker_origin="BROKER_BIN of $(date -u -r "$BROKER_BIN" '+%Y-%m-%d %H:%M UTC')"
broker_origin+=", sha256 $(sha256sum "$BROKER_BIN" | cut -c1-12)"

tmp=$(mktemp -d -t bench.XXXXXX)
ours_data="$tmp/ours"
kafka_data="$tmp/kafka"
mkdir -p "$ours_data" "$kafka_data"
ours_pid=
kafka_pid=
child=
probe_pid=
cleanup() {
  [[ -n $child ]] && kill -TERM "$child" 2>/dev/null
  [[ -n $probe_pid ]] && kill "$probe_pid" 2>/dev/null
  if [[ -n $ours_pid ]]; then
    # SIGTERM, then SIGKILL if our broker has not exited within 30 s.
    kill -TERM "$ours_pid" 2>/dev/null
    for _ in $(seq 1 300); do kill -0 "$ours_pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$ours_pid" 2>/dev/null && { blog "our broker ignored SIGTERM for 30 s; killing it"; kill -KILL "$ours_pid"; }
    wait "$ours_pid" 2>/dev/null
    ours_pid=
  fi
  STOP_TIMEOUT_S=30 "$COMPAT_DIR/kafka-reference/stop.sh" "$kafka_data" >/dev/null 2>&1 || true
  [[ -f $kafka_data/kafka.out ]] && cp "$kafka_data/kafka.out" "$run_dir/kafka/broker.log"
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM


clk_tck=$(getconf CLK_TCK)
# utime + stime of a process in clock ticks (fields 14 and 15 of /proc/<pid>/stat;
# the fields are counted after the command name, which may hold spaces).
cpu_ticks() {
  local stat rest fields
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || { echo 0; return; }
  rest=${stat##*) }
  read -r -a fields <<<"$rest"
  echo $((fields[11] + fields[12]))
}
peak_rss_kib() { awk '/^VmHWM:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

broker_pid() { if [[ $1 == kafka ]]; then echo "$kafka_pid"; else echo "$ours_pid"; fi; }
bootstrap() { if [[ $1 == kafka ]]; then echo "127.0.0.1:$KAFKA_PORT"; else echo "127.0.0.1:$OURS_PORT"; fi; }

# run_tool <broker> <name> <timeout_s> <tool> args...: one tool run, with its
# output, exit status, wall time and the broker's CPU ticks around it in
# $run_dir/<broker>/<name>.*.
run_tool() {
  local broker=$1 name=$2 limit=$3 pid before start rc
  shift 3
  pid=$(broker_pid "$broker")
  before=$(cpu_ticks "$pid")
  start=$EPOCHREALTIME
  step timeout --kill-after=10 "$limit" "$COMPAT_DIR/kafka-cli.sh" "$@" \
    >"$run_dir/$broker/$name.out" 2>"$run_dir/$broker/$name.err"
  rc=$?
  echo "$rc" >"$run_dir/$broker/$name.rc"
  echo "$before $(cpu_ticks "$pid")" >"$run_dir/$broker/$name.cpu"
  awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.3f\n", b - a}' >"$run_dir/$broker/$name.wall"
  kill -0 "$pid" 2>/dev/null || blog "WARNING: the $broker broker is gone after $name"
  ((rc == 0)) || blog "$name on $broker failed (exit $rc): $(grep . "$run_dir/$broker/$name.err" | tail -1)"
  return $rc
}

# create_topic <broker> <topic> <partitions>: kafka-topics --create, then a wait
# until every partition's leader answers ListOffsets, so that a measured run
# does not include the broker's partition creation. The wait (from the end of
# kafka-topics) goes to <broker>/<topic>.settle_ms.
create_topic() {
  local broker=$1 topic=$2 partitions=$3 created ready
  step timeout --kill-after=10 "$admin_timeout_s" "$COMPAT_DIR/kafka-cli.sh" kafka-topics \
    --bootstrap-server "$(bootstrap "$broker")" --create --topic "$topic" \
    --partitions "$partitions" --replication-factor 1 >>"$run_dir/$broker/topics.log" 2>&1 \
    || { blog "creating $topic ($partitions partitions) on $broker failed; see $run_dir/$broker/topics.log"; return 1; }
  created=$EPOCHREALTIME
  local port=${OURS_PORT}
  [[ $broker == kafka ]] && port=$KAFKA_PORT
  if ready=$(step python3 "$BENCH_DIR/ready.py" 127.0.0.1 "$port" "$admin_timeout_s" "$topic" "$partitions"); then
    ready_ms "$created" "$ready" >"$run_dir/$broker/$topic.settle_ms"
  else
    blog "not every partition of $topic on $broker answers ListOffsets after ${admin_timeout_s}s"
  fi
}

delete_topic() {
  local broker=$1 topic=$2
  step timeout --kill-after=10 "$admin_timeout_s" "$COMPAT_DIR/kafka-cli.sh" kafka-topics \
    --bootstrap-server "$(bootstrap "$broker")" --delete --topic "$topic" >>"$run_dir/$broker/topics.log" 2>&1 \
    || blog "deleting $topic on $broker failed; see $run_dir/$broker/topics.log"
}

# produce <broker> <name> <topic> <codec> <records> <records_per_s or -1>
produce() {
  local broker=$1 name=$2 topic=$3 codec=$4 records=$5 rate=$6
  blog "$name on $broker: $records records, codec $codec, rate $rate"
  run_tool "$broker" "$name" "$tool_timeout_s" kafka-producer-perf-test \
    --bootstrap-server "$(bootstrap "$broker")" --topic "$topic" --num-records "$records" \
    --record-size "$RECORD_BYTES" --throughput "$rate" \
    --command-property "${PRODUCER_PROPS[@]}" compression.type="$codec"
}

# Both brokers take turns; the order flips from one workload to the next so
# that neither always runs first (on a warmer or a cooler machine).
turn=0
brokers_in_turn() {
  if ((turn % 2 == 0)); then echo kafka ours; else echo ours kafka; fi
  turn=$((turn + 1))
}

# start-to-ready: from the launch of the process to the first answered
# Metadata request, timed by the same probe (bench/ready.py) for both.
ready_ms() {
  awk -v a="$1" -v b="$2" 'BEGIN {printf "%.0f\n", (b - a) * 1000}'
}

# Any socket still bound to one of our ports (a listener, or a connection in
# TIME-WAIT from an earlier run) makes a broker's bind fail; wait it out.
port_in_use() { ss -Htan "( sport = :$1 )" 2>/dev/null | grep -q .; }
for port in "$OURS_PORT" "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT"; do
  for _ in $(seq 1 70); do port_in_use "$port" || break; sleep 1; done
  port_in_use "$port" && die "port $port is in use: $(ss -Htanp "( sport = :$port )" | head -1)"
done

# start_probe <broker> <port>: the readiness probe in the background, returning
# once it runs, so that the launch that follows is timed from its first moment.
start_probe() {
  python3 "$BENCH_DIR/ready.py" --armed "$tmp/$1.armed" 127.0.0.1 "$2" "$ready_timeout_s" >"$tmp/$1.ready" &
  probe_pid=$!
  for _ in $(seq 1 500); do [[ -f $tmp/$1.armed ]] && return; sleep 0.01; done
  die "the readiness probe did not start"
}

blog "starting our broker ($BROKER_BIN) on 127.0.0.1:$OURS_PORT"
overrides=(--override "listeners=PLAINTEXT://127.0.0.1:$OURS_PORT" --override "log.dirs=$ours_data/logs"
  --override "metrics.listen.address=none")
for p in "${SHARED_PROPS[@]}"; do overrides+=(--override "$p"); done
start_probe ours "$OURS_PORT"
ours_launched=$EPOCHREALTIME
"$BROKER_BIN" "${overrides[@]}" >"$run_dir/ours/broker.log" 2>&1 </dev/null &
ours_pid=$!
wait "$probe_pid" || die "our broker did not answer a Metadata request within ${ready_timeout_s}s"
probe_pid=
note ours_ready_ms "$(ready_ms "$ours_launched" "$(cat "$tmp/ours.ready")")"

blog "starting Apache Kafka $kafka_version on 127.0.0.1:$KAFKA_PORT"
start_probe kafka "$KAFKA_PORT"
kafka_pid=$(KAFKA_EXTRA_JAVA_OPTS="$KAFKA_JAVA_OPTS" KAFKA_EXTRA_PROPERTIES=$(printf '%s\n' "${SHARED_PROPS[@]}") \
  CONTROLLER_PORT=$KAFKA_CONTROLLER_PORT READY_TIMEOUT_S=$ready_timeout_s \
  "$COMPAT_DIR/kafka-reference/start.sh" "$KAFKA_PORT" "$kafka_data" 2>"$run_dir/kafka/start.err") \
  || { cat "$run_dir/kafka/start.err" >&2; die "Apache Kafka did not start"; }
wait "$probe_pid" || die "Kafka did not answer a Metadata request within ${ready_timeout_s}s"
probe_pid=
note kafka_ready_ms "$(ready_ms "$(cat "$kafka_data/kafka.launched")" "$(cat "$tmp/kafka.ready")")"
cp "$kafka_data/server.properties" "$run_dir/kafka/server.properties"

note kafka_version "$kafka_version"
note ours_version "$broker_origin"
note bench_commit "$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)"
note date_utc "$(date -u '+%Y-%m-%d %H:%M UTC')"
note cpus "$(nproc)"
note cpu_model "$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)"
note java "$(java -version 2>&1 | head -1)"
note smoke "$smoke"
# Other work on the machine skews both brokers' numbers; the load says how much.
note loadavg_start "$(cut -d' ' -f1-3 /proc/loadavg)"
note duration_s "$duration_s"
note workloads "$(IFS=,; echo "${!selected[*]}")"
note expected_ours "$(IFS=,; echo "${EXPECTED_OURS[*]}")"
note record_bytes "$RECORD_BYTES"
note producer_props "${PRODUCER_PROPS[*]}"
note kafka_java_opts "$KAFKA_JAVA_OPTS"
note shared_props "${SHARED_PROPS[*]}"
note w4_codec "$W4_CODEC"

# Warm-up: the same producer against each broker into a throwaway topic, so
# neither JIT warm-up nor first-touch of files lands in a measured run. Kafka's
# warm-up rate sizes the measured runs: --duration seconds of Kafka's rate.
for b in kafka ours; do create_topic "$b" warmup "$W1_PARTITIONS"; done
produce kafka warmup warmup lz4 "$calibration_records" -1
produce ours warmup warmup lz4 "$calibration_records" -1
for b in kafka ours; do delete_topic "$b" warmup; done
if ((smoke)); then
  records=$min_records
else
  warm_rate=$(python3 "$BENCH_DIR/report.py" rate "$run_dir/kafka/warmup.out") \
    || die "cannot read Kafka's warm-up rate from $run_dir/kafka/warmup.out"
  records=$(awk -v r="$warm_rate" -v d="$duration_s" -v lo="$min_records" -v hi="$max_records" \
    'BEGIN {n = int(r * d); if (n < lo) n = lo; if (n > hi) n = hi; print n}')
fi
note records "$records"
# Disk: both brokers hold their W1 none topic until W3 has read it, and Kafka
# removes a deleted topic's files only a minute later (so W1 lz4 may still be
# there): about three topics of records x 1 KiB, plus a margin.
need_kib=$((records * 3 * RECORD_BYTES / 1024 + 1024 * 1024))
free_kib=$(df -Pk "$tmp" | awk 'NR == 2 {print $4}')
((free_kib > need_kib)) || die "$((free_kib / 1024)) MiB free in $tmp, the run needs about $((need_kib / 1024)) MiB; lower --duration or BENCH_MAX_RECORDS"
blog "measured producer runs send $records records each"

if wants W1 || wants W2; then
  for codec in lz4 none; do
    for b in $(brokers_in_turn); do
      create_topic "$b" "w1-$codec" "$W1_PARTITIONS"
      produce "$b" "w1-$codec" "w1-$codec" "$codec" "$records" -1
    done
    # The lz4 topic is not read again; dropping it bounds the disk in use.
    if [[ $codec == lz4 ]]; then for b in kafka ours; do delete_topic "$b" w1-lz4; done; fi
  done
fi

if wants W3; then
  for b in $(brokers_in_turn); do
    if [[ ! -f $run_dir/$b/w1-none.rc ]]; then
      create_topic "$b" w1-none "$W1_PARTITIONS"
      produce "$b" w3-fill w1-none none "$records" -1
    fi
    blog "w3 on $b: consume $records records from w1-none"
    run_tool "$b" w3 "$tool_timeout_s" kafka-consumer-perf-test --bootstrap-server "$(bootstrap "$b")" \
      --topic w1-none --num-records "$records" --timeout 30000
  done
fi
if wants W1 || wants W2 || wants W3; then for b in kafka ours; do delete_topic "$b" w1-none; done; fi

if wants W2; then
  for codec in lz4 none; do
    # 50% of Kafka's W1 maximum with this codec, in this run.
    if max_rate=$(python3 "$BENCH_DIR/report.py" rate "$run_dir/kafka/w1-$codec.out" 2>/dev/null); then
      rate=$(awk -v r="$max_rate" 'BEGIN {n = int(r / 2); print (n < 1 ? 1 : n)}')
    else
      blog "no Kafka W1 $codec rate to halve; W2 $codec uses 1000 records/s"
      rate=1000
    fi
    w2_records=$(awk -v r="$rate" -v d="$duration_s" -v s="$smoke" \
      'BEGIN {n = int(r * (s ? 2 : d)); print (n < 100 ? 100 : n)}')
    note "w2_${codec}_rate" "$rate"
    for b in $(brokers_in_turn); do
      create_topic "$b" "w2-$codec" "$W1_PARTITIONS"
      produce "$b" "w2-$codec" "w2-$codec" "$codec" "$w2_records" "$rate"
      delete_topic "$b" "w2-$codec"
    done
  done
fi

if wants W4; then
  for b in $(brokers_in_turn); do
    create_topic "$b" w4 "$W4_PARTITIONS"
    produce "$b" w4 w4 "$W4_CODEC" "$records" -1
    delete_topic "$b" w4
  done
fi

# TXN: the W1 producer inside transactions (kafka-producer-perf-test's own
# transactional mode: a commit every TXN_DURATION_MS), so the coordinator's
# writes and the markers are in the measured path.
if wants TXN; then
  note txn_codec "$TXN_CODEC"
  note txn_duration_ms "$TXN_DURATION_MS"
  for b in $(brokers_in_turn); do
    create_topic "$b" txn "$W1_PARTITIONS"
    blog "txn on $b: $records records in transactions of ${TXN_DURATION_MS} ms"
    run_tool "$b" txn "$tool_timeout_s" kafka-producer-perf-test \
      --bootstrap-server "$(bootstrap "$b")" --topic txn --num-records "$records" \
      --record-size "$RECORD_BYTES" --throughput -1 \
      --transactional-id "bench-txn-$b" --transaction-duration-ms "$TXN_DURATION_MS" \
      --command-property "${PRODUCER_PROPS[@]}" compression.type="$TXN_CODEC"
    delete_topic "$b" txn
  done
fi

if wants E2E; then
  note e2e_records "$e2e_records"
  for b in $(brokers_in_turn); do
    create_topic "$b" e2e 1
    blog "e2e on $b: $e2e_records round trips"
    run_tool "$b" e2e "$tool_timeout_s" kafka-e2e-latency --bootstrap-server "$(bootstrap "$b")" \
      --topic e2e --num-records "$e2e_records" --producer-acks all --record-size "$RECORD_BYTES"
    delete_topic "$b" e2e
  done
fi

# Peak RSS and CPU time over the whole life of each broker, read before they stop.
for b in kafka ours; do
  pid=$(broker_pid "$b")
  if kill -0 "$pid" 2>/dev/null; then
    note "${b}_alive" 1
    note "${b}_peak_rss_kib" "$(peak_rss_kib "$pid")"
    note "${b}_cpu_s" "$(awk -v t="$(cpu_ticks "$pid")" -v hz="$clk_tck" 'BEGIN {printf "%.2f\n", t / hz}')"
  else
    note "${b}_alive" 0
  fi
done
note clk_tck "$clk_tck"
note loadavg_end "$(cut -d' ' -f1-3 /proc/loadavg)"

cleanup
trap - EXIT
python3 "$BENCH_DIR/report.py" table "$run_dir" >"$run_dir/table.md"
rc=$?
cat "$run_dir/table.md"
blog "table and raw outputs in $run_dir"
exit $rc
