#!/usr/bin/env bash
# Dispatcher vs share groups, on Kafka and on our broker:
#   bench/dispatcher.sh [--smoke] [--workers N] [--messages M] [--partitions P] [--batch B] [--record-bytes S]
#                       [--rounds K] [--warmup W] [--share-commit sync|async] [--api http|grpc]
#                       [--worker-mode receive-ack|prefetch] [--skip-lease-figures]
#                       [--pin servers|broker]
# Leased + acked messages/s with N pull workers, three ways, on this machine:
#   share       Apache Kafka 4.4's KafkaShareConsumer, explicit acknowledgement,
#               N consumers in one share group (bench/dispatcher/share-bench)
#   share-ours  the same share-group workers against our broker
#   dispatcher  our dispatcher in front of our broker, N pull workers doing
#               receive -> ack (bench/dispatcher/loadgen) over the HTTP/JSON
#               API, or the gRPC API with --api grpc. --worker-mode prefetch:
#               each worker asks for its next batch before it acks the one it
#               holds (at most two batches each). In both modes a worker's
#               acks are confirmed before it takes up its next batch, as with
#               commitSync.
#   dispatcher  the same dispatcher in front of the same Apache Kafka
#               (shows what the dispatcher costs, independent of our broker)
# Each side gets its own topic of P partitions pre-loaded with M records of
# S bytes by kafka-producer-perf-test before anything is timed, and drains it:
# the run ends when M acknowledgements have been confirmed. Besides the rate,
# the table gives the servers' CPU per acked message (broker, plus dispatcher)
# and its ratio to the share group's, which depends less on --pin. --rounds K repeats
# the three K times (order reversed every other round, fresh topics and group
# each time) and the table shows the median. --warmup W (default 5, 0 with
# --smoke) first runs W rounds of all three that are reported but not counted:
# the share group got faster round after round while Kafka's JVM warmed up
# (77.6k, 105.7k, 100.2k, 112.9k, 133.3k msgs/s, then 132-153k), so medians
# of cold rounds favoured the dispatcher almost twofold. Then the two
# memory figures of the lease engine: bytes per in-flight lease (the
# lease_memory test) and the rebuild time of a partition from 1M ack-log
# records (the lease_rebuild example).
#
# Installs what it needs (compat-tests/install.sh kafka, mvn package of
# share-bench, go build of loadgen) and builds the dispatcher and our broker
# (release) unless DISPATCHER_BIN / BROKER_BIN name binaries. Raw outputs, logs
# and the table go to ${BENCH_OUT:-bench/out}/dispatcher-<UTC time>/
# (bench/out/dispatcher-latest points at the last run). docs/benchmarks.md
# describes the method and what the comparison leaves out. LOADGEN_GOGC sets
# the Go workers' GOGC (default 400, see below).
#
# --pin servers: the servers (Apache Kafka; our broker and the dispatcher)
# on CPU 0 and each side's workers on CPU 1 (taskset), as when the workers
# run on machines of their own. --pin broker: only the broker on CPU 0, the
# dispatcher beside the workers on CPU 1, as when it runs on the workers'
# machines (the share group's side is the same in both). Without --pin all
# share both CPUs, so the workers' CPU comes out of the servers'
# (docs/benchmarks.md).
#
# --smoke: tiny counts, to prove the harness works end to end in seconds
# (given built binaries). Exit status: 0 when every side ran to its count and
# both memory figures were read, 1 otherwise (the table says which and why).
set -uo pipefail
BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
source "$ROOT/compat-tests/lib.sh"
PROGRAMS="$BENCH_DIR/dispatcher"

# Ports of this harness only (bench/run.sh uses 28092 and 28192/28193), all
# below the ephemeral range (32768-60999), so no outgoing connection holds one.
KAFKA_PORT=28292
KAFKA_CONTROLLER_PORT=28293
OURS_PORT=28392
DISPATCHER_HTTP_PORT=28480
DISPATCHER_GRPC_PORT=28481
DISPATCHER_INTERNAL_PORT=28482

# The lease both sides grant: the dispatcher's default lease, and the share
# group's record lock duration set to the same (Kafka's default is 30 s; its
# broker maximum, group.share.max.record.lock.duration.ms, is 60 s).
LEASE_S=60
# The producer of the pre-load: bench/run.sh's.
PRODUCER_PROPS=(acks=all linger.ms=5 batch.size=65536)
KAFKA_JAVA_OPTS="-Xms512m -Xmx1g -XX:+AlwaysPreTouch"
# The workers' heaps: the share group's consumers run in a JVM with -Xmx1g;
# the dispatcher's Go workers get GOGC=400 (a heap goal of about 16 MiB).
# With Go's default (100) their live heap of 2 MiB meant a collection about
# every 5 ms (891 in a 4.5 s run, 10% of their CPU, gctrace) and 40% more
# worker CPU in all, on the cores the dispatcher needs (docs/benchmarks.md).
LOADGEN_GOGC=${LOADGEN_GOGC:-400}
# Settings both brokers get (as in bench/run.sh).
SHARED_PROPS=(
  num.partitions=1
  auto.create.topics.enable=true
  log.flush.interval.messages=9223372036854775807
  log.flush.interval.ms=9223372036854775807
  log.retention.ms=604800000
  log.retention.bytes=-1
  log.segment.bytes=1073741824
  group.initial.rebalance.delay.ms=0
  offsets.topic.num.partitions=3
  offsets.topic.replication.factor=1
)

usage() {
  echo "usage: bench/dispatcher.sh [--smoke] [--workers N] [--messages M] [--partitions P] [--batch B] [--record-bytes S]" >&2
  echo "                           [--rounds K] [--warmup W] [--share-commit sync|async] [--api http|grpc]" >&2
  echo "                           [--worker-mode receive-ack|prefetch] [--skip-lease-figures] [--pin servers|broker]" >&2
  exit 2
}
positive() { [[ ${1:-} =~ ^[0-9]+$ && $1 -ge 1 ]]; }

smoke=0
workers=4
# 600,000: each side then runs for about ten seconds, so the JVM's warm-up
# (JIT) weighs little in the share group's rate (at 200,000 it held it down
# by up to a half).
messages=600000
partitions=8
batch=100
record_bytes=1024
explicit_messages=0
lease_figures=1
rounds=1
warmup=
# How share-bench's workers commit their acknowledgements: sync (commitSync(),
# what a worker that must know its work is settled does) or async.
share_commit=sync
# The API the dispatcher's pull workers use, and how they cycle.
api=http
worker_mode=receive-ack
pin=
while (($#)); do
  case "$1" in
    --smoke) smoke=1; shift ;;
    --workers) positive "${2:-}" || usage; workers=$2; shift 2 ;;
    --messages) positive "${2:-}" || usage; messages=$2; explicit_messages=1; shift 2 ;;
    --partitions) positive "${2:-}" || usage; partitions=$2; shift 2 ;;
    --batch) positive "${2:-}" || usage; batch=$2; shift 2 ;;
    --record-bytes) positive "${2:-}" || usage; record_bytes=$2; shift 2 ;;
    --share-commit) [[ ${2:-} == sync || ${2:-} == async ]] || usage; share_commit=$2; shift 2 ;;
    --api) [[ ${2:-} == http || ${2:-} == grpc ]] || usage; api=$2; shift 2 ;;
    --worker-mode)
      [[ ${2:-} == receive-ack || ${2:-} == prefetch ]] || usage
      worker_mode=$2; shift 2 ;;
    --rounds) positive "${2:-}" || usage; rounds=$2; shift 2 ;;
    --warmup) [[ ${2:-} =~ ^[0-9]+$ ]] || usage; warmup=$2; shift 2 ;;
    --skip-lease-figures) lease_figures=0; shift ;;
    --pin) [[ ${2:-} == servers || ${2:-} == broker ]] || usage; pin=$2; shift 2 ;;
    *) usage ;;
  esac
done
# The dispatcher's API caps one receive at 100 messages (MAX_RECEIVE_MESSAGES).
((batch <= 100)) || die "--batch is at most 100 (the dispatcher's largest receive)"
rebuild_records=1000000
if ((smoke)); then
  ((explicit_messages)) || messages=2000
  rebuild_records=100000
fi
[[ -n $warmup ]] || warmup=$((smoke ? 0 : 5))
# What --pin puts before the brokers', the dispatcher's and the workers' commands.
pin_broker=()
pin_dispatcher=()
pin_workers=()
if [[ -n $pin ]]; then
  (($(nproc) >= 2)) || die "--pin needs two CPUs"
  pin_broker=(taskset -c 0)
  pin_workers=(taskset -c 1)
  if [[ $pin == servers ]]; then pin_dispatcher=(taskset -c 0); else pin_dispatcher=(taskset -c 1); fi
fi
# Bounds: a side gets 60 s plus 1 ms per message (over 16 minutes at
# 1,000,000), far above any rate seen, so only a stuck side hits it.
run_timeout_s=$((60 + messages / 1000))
produce_timeout_s=$((120 + messages / 1000))
admin_timeout_s=90
ready_timeout_s=120
cargo_timeout_s=${BENCH_CARGO_TIMEOUT_S:-3600}

out_root=${BENCH_OUT:-$ROOT/bench/out}
run_dir="$out_root/dispatcher-$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$run_dir" || die "cannot create $run_dir"
ln -sfn "$(basename "$run_dir")" "$out_root/dispatcher-latest"
meta="$run_dir/meta.env"
: >"$meta"
note() { printf '%s=%s\n' "$1" "$2" >>"$meta"; }
blog() { printf '[bench %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
blog "raw results in $run_dir"

tmp=$(mktemp -d -t bench-dispatcher.XXXXXX)
kafka_data="$tmp/kafka"
ours_data="$tmp/ours"
mkdir -p "$kafka_data" "$ours_data"
ours_pid=
dispatcher_pid=
child=
stop_pid() {
  # stop_pid <pid> <name>: SIGTERM, SIGKILL after 30 s.
  local pid=$1 name=$2
  [[ -n $pid ]] || return 0
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && { blog "$name ignored SIGTERM for 30 s; killing it"; kill -KILL "$pid"; }
  wait "$pid" 2>/dev/null
}
cleanup() {
  [[ -n $child ]] && kill -TERM "$child" 2>/dev/null
  stop_pid "$dispatcher_pid" dispatcher
  dispatcher_pid=
  stop_pid "$ours_pid" "our broker"
  ours_pid=
  STOP_TIMEOUT_S=30 "$COMPAT_DIR/kafka-reference/stop.sh" "$kafka_data" >/dev/null 2>&1 || true
  [[ -f $kafka_data/kafka.out ]] && cp "$kafka_data/kafka.out" "$run_dir/kafka-broker.log"
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A bounded command in the background (so that an interrupt stops it at once),
# its stdout/stderr to <name>.out/.err and exit status to <name>.rc.
bounded() {
  local name=$1 limit=$2 rc
  shift 2
  step timeout --kill-after=10 "$limit" "$@" >"$run_dir/$name.out" 2>"$run_dir/$name.err"
  rc=$?
  echo "$rc" >"$run_dir/$name.rc"
  ((rc == 0)) || blog "$name failed (exit $rc): $(grep . "$run_dir/$name.err" | tail -1)"
  return $rc
}

clk_tck=$(getconf CLK_TCK)
cpu_ticks() {
  local stat rest fields
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || { echo 0; return; }
  rest=${stat##*) }
  read -r -a fields <<<"$rest"
  echo $((fields[11] + fields[12]))
}
# Busy clock ticks of the whole machine, all CPUs (/proc/stat: all but idle and iowait).
machine_ticks() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9; exit}' /proc/stat; }
peak_rss_kib() { awk '/^VmHWM:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
port_in_use() { ss -Htan "( sport = :$1 )" 2>/dev/null | grep -q .; }
port_listening() { ss -Hltn "( sport = :$1 )" 2>/dev/null | grep -q .; }
# A Kafka tool that compat-tests/kafka-cli.sh does not name, from the same jars.
KAFKA_JAVA=(java -Xmx512m -Djava.awt.headless=true
  -Dlog4j2.configurationFile="$COMPAT_DIR/kafka-reference/tools-log4j2.properties" -cp "$KAFKA_LIBS/*")

# --- install and build ---------------------------------------------------------

"$COMPAT_DIR/install.sh" kafka >"$run_dir/install.log" 2>&1 \
  || { cat "$run_dir/install.log" >&2; die "installing the Kafka jars failed"; }
kafka_jar=$(compgen -G "$KAFKA_LIBS/kafka_2.13-*.jar" | head -1)
kafka_version=$(basename "$kafka_jar" .jar)
kafka_version=${kafka_version#kafka_2.13-}

# share-bench: rebuilt when its pom or sources change (a stamp, as install.sh does).
share_dir="$PROGRAMS/share-bench"
share_stamp="$share_dir/target/.bench-stamp"
share_want=$(cat "$share_dir/pom.xml" $(find "$share_dir/src" -type f | sort) | sha256sum | cut -d' ' -f1)
if [[ ! -f $share_stamp || $(cat "$share_stamp") != "$share_want" ]]; then
  blog "building share-bench (mvn package)"
  "${MVN[@]}" -f "$share_dir/pom.xml" package >"$run_dir/share-bench-build.log" 2>&1 \
    || { cat "$run_dir/share-bench-build.log" >&2; die "building share-bench failed"; }
  echo "$share_want" >"$share_stamp"
fi
blog "building loadgen (go build)"
(cd "$PROGRAMS/loadgen" && go build -o loadgen .) >"$run_dir/loadgen-build.log" 2>&1 \
  || { cat "$run_dir/loadgen-build.log" >&2; die "building loadgen failed"; }

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
commit=$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)
# origin_of <bin> <built here?>: a given binary may come from any commit.
origin_of() {
  local origin="commit $commit"
  [[ $2 == 1 ]] || origin="given binary of $(date -u -r "$1" '+%Y-%m-%d %H:%M UTC')"
  echo "$origin, sha256 $(sha256sum "$1" | cut -c1-12)"
}
dispatcher_built=0
if [[ -z ${DISPATCHER_BIN:-} ]]; then
  blog "building the dispatcher (cargo build --release -p dispatcher-sidecar --bin dispatcher)"
  if bounded dispatcher-build "$cargo_timeout_s" bash -c "cd '$ROOT' && cargo build --release -p dispatcher-sidecar --bin dispatcher"; then
    DISPATCHER_BIN="$CARGO_TARGET_DIR/release/dispatcher"
    dispatcher_built=1
  fi
fi
broker_built=0
if [[ -z ${BROKER_BIN:-} ]]; then
  blog "building our broker (cargo build --release -p broker)"
  if bounded broker-build "$cargo_timeout_s" bash -c "cd '$ROOT' && cargo build --release -p broker"; then
    BROKER_BIN="$CARGO_TARGET_DIR/release/broker"
    broker_built=1
  fi
fi
[[ -n ${DISPATCHER_BIN:-} && -x $DISPATCHER_BIN ]] && note dispatcher_version "$(origin_of "$DISPATCHER_BIN" $dispatcher_built)"
[[ -n ${BROKER_BIN:-} && -x $BROKER_BIN ]] && note ours_version "$(origin_of "$BROKER_BIN" $broker_built)"

# --- start the brokers -----------------------------------------------------------

for port in "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT" "$OURS_PORT" "$DISPATCHER_HTTP_PORT" "$DISPATCHER_GRPC_PORT"; do
  for _ in $(seq 1 70); do port_in_use "$port" || break; sleep 1; done
  port_in_use "$port" && die "port $port is in use: $(ss -Htanp "( sport = :$port )" | head -1)"
done

blog "starting Apache Kafka $kafka_version on 127.0.0.1:$KAFKA_PORT"
kafka_pid=$(KAFKA_EXTRA_JAVA_OPTS="$KAFKA_JAVA_OPTS" KAFKA_EXTRA_PROPERTIES=$(printf '%s\n' "${SHARED_PROPS[@]}") \
  CONTROLLER_PORT=$KAFKA_CONTROLLER_PORT READY_TIMEOUT_S=$ready_timeout_s \
  "${pin_broker[@]}" "$COMPAT_DIR/kafka-reference/start.sh" "$KAFKA_PORT" "$kafka_data" 2>"$run_dir/kafka-start.err") \
  || { cat "$run_dir/kafka-start.err" >&2; die "Apache Kafka did not start"; }
cp "$kafka_data/server.properties" "$run_dir/kafka-server.properties"

# Share groups: a cluster formatted by Kafka 4.2 or later finalizes
# share.version at its release's level (4.4: share.version=2), so nothing is
# needed; an older metadata version would need the feature raised, which is
# done here when `describe` shows it at 0 or absent.
share_version() {
  bounded kafka-features "$admin_timeout_s" "${KAFKA_JAVA[@]}" org.apache.kafka.tools.FeatureCommand \
    --bootstrap-server "127.0.0.1:$KAFKA_PORT" describe || return 1
  awk '$1 == "Feature:" && $2 == "share.version" {for (i = 3; i <= NF; i++) if ($i == "FinalizedVersionLevel:") print $(i + 1)}' \
    "$run_dir/kafka-features.out"
}
sv=$(share_version)
if [[ -z $sv || $sv == 0 ]]; then
  blog "share.version is ${sv:-absent}: upgrading it to 1"
  bounded kafka-features-upgrade "$admin_timeout_s" "${KAFKA_JAVA[@]}" org.apache.kafka.tools.FeatureCommand \
    --bootstrap-server "127.0.0.1:$KAFKA_PORT" upgrade --feature share.version=1 \
    || die "cannot enable share groups (kafka-features upgrade --feature share.version=1)"
  sv=$(share_version)
fi
[[ -n $sv && $sv != 0 ]] || die "share groups are not enabled on Kafka (share.version ${sv:-absent})"
note share_version "$sv"

if [[ -n ${BROKER_BIN:-} && -x $BROKER_BIN ]]; then
  blog "starting our broker ($BROKER_BIN) on 127.0.0.1:$OURS_PORT"
  overrides=(--override "listeners=PLAINTEXT://127.0.0.1:$OURS_PORT" --override "log.dirs=$ours_data/logs"
    --override "metrics.listen.address=none")
  for p in "${SHARED_PROPS[@]}"; do overrides+=(--override "$p"); done
  "${pin_broker[@]}" "$BROKER_BIN" "${overrides[@]}" >"$run_dir/ours-broker.log" 2>&1 </dev/null &
  ours_pid=$!
  if ! python3 "$BENCH_DIR/ready.py" 127.0.0.1 "$OURS_PORT" "$ready_timeout_s" >/dev/null; then
    blog "our broker did not answer a Metadata request within ${ready_timeout_s}s"
    stop_pid "$ours_pid" "our broker"
    ours_pid=
  fi
else
  blog "no broker binary: the dispatcher on our broker is not run"
fi

note kafka_version "$kafka_version"
note bench_commit "$commit"
note date_utc "$(date -u '+%Y-%m-%d %H:%M UTC')"
note cpus "$(nproc)"
note cpu_model "$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)"
note java "$(java -version 2>&1 | head -1)"
note go "$(go version)"
note smoke "$smoke"
note loadavg_start "$(cut -d' ' -f1-3 /proc/loadavg)"
note workers "$workers"
note messages "$messages"
note partitions "$partitions"
note batch "$batch"
note share_commit "$share_commit"
note api "$api"
note worker_mode "$worker_mode"
note pin "$pin"
note rounds "$rounds"
note warmup "$warmup"
note record_bytes "$record_bytes"
note lease_s "$LEASE_S"
note producer_props "${PRODUCER_PROPS[*]}"
note kafka_java_opts "$KAFKA_JAVA_OPTS"
note loadgen_gogc "$LOADGEN_GOGC"
note clk_tck "$clk_tck"

# Each run keeps its pre-loaded topic until the end: 4 x (rounds + warm-up)
# topics of M x S bytes (and Kafka's and our broker's indexes), plus a margin.
need_kib=$((4 * (rounds + warmup) * messages * (record_bytes + 100) / 1024 + 1024 * 1024))
free_kib=$(df -Pk "$tmp" | awk 'NR == 2 {print $4}')
((free_kib > need_kib)) || die "$((free_kib / 1024)) MiB free in $tmp, the run needs about $((need_kib / 1024)) MiB"

# --- pre-load ----------------------------------------------------------------------

# preload <side> <bootstrap> <port> <topic>: create the topic, wait until every
# partition answers, write the records.
preload() {
  local side=$1 bootstrap=$2 port=$3 topic=$4
  bounded "$side.topic" "$admin_timeout_s" "$COMPAT_DIR/kafka-cli.sh" kafka-topics --bootstrap-server "$bootstrap" \
    --create --topic "$topic" --partitions "$partitions" --replication-factor 1 \
    || { echo "creating its topic failed: see $side.topic.err" >"$run_dir/$side.why"; return 1; }
  step python3 "$BENCH_DIR/ready.py" 127.0.0.1 "$port" "$admin_timeout_s" "$topic" "$partitions" >/dev/null \
    || { echo "not every partition of $topic answered ListOffsets within ${admin_timeout_s}s" >"$run_dir/$side.why"; return 1; }
  blog "$side: pre-loading $messages records of $record_bytes B into $topic ($partitions partitions)"
  bounded "$side.preload" "$produce_timeout_s" "$COMPAT_DIR/kafka-cli.sh" kafka-producer-perf-test \
    --bootstrap-server "$bootstrap" --topic "$topic" --num-records "$messages" --record-size "$record_bytes" \
    --throughput -1 --command-property "${PRODUCER_PROPS[@]}" \
    || { echo "pre-loading failed: see $side.preload.err" >"$run_dir/$side.why"; return 1; }
}

# measured <side> <limit> <broker pid> cmd...: the client run, with the CPU
# ticks of the broker (and of the dispatcher, when one runs) around it, those
# of the other broker and the whole machine's busy ticks, and the client's
# own CPU and peak RSS (GNU time) in <side>.time.
measured() {
  local side=$1 limit=$2 broker=$3 b_before d_before=0 o_before m_before other
  shift 3
  # The broker this side does not use: its CPU during the run is work left
  # over from the previous side (log cleaning, JIT) competing for the cores.
  other=$kafka_pid
  [[ $broker == "$kafka_pid" ]] && other=$ours_pid
  b_before=$(cpu_ticks "$broker")
  # No other broker (ours not built or skipped): no figure, not a zero.
  [[ -n $other && -d /proc/$other ]] || other=
  o_before=
  [[ -n $other ]] && o_before=$(cpu_ticks "$other")
  m_before=$(machine_ticks)
  [[ -n $dispatcher_pid ]] && d_before=$(cpu_ticks "$dispatcher_pid")
  bounded "$side" "$limit" /usr/bin/time -f '%U %S %M' -o "$run_dir/$side.time" "$@"
  local rc=$?
  echo "$b_before $(cpu_ticks "$broker")" >"$run_dir/$side.broker_cpu"
  [[ -n $other ]] && echo "$o_before $(cpu_ticks "$other")" >"$run_dir/$side.other_broker_cpu"
  echo "$m_before $(machine_ticks)" >"$run_dir/$side.machine_cpu"
  if [[ -n $dispatcher_pid ]]; then
    echo "$d_before $(cpu_ticks "$dispatcher_pid")" >"$run_dir/$side.dispatcher_cpu"
    peak_rss_kib "$dispatcher_pid" >"$run_dir/$side.dispatcher_rss_kib"
  fi
  return $rc
}

# --- side 1: the share group on Kafka ------------------------------------------------

# run_share <name> <port> <broker pid>: <name> is the topic, the share group
# and the file prefix.
run_share() {
  local name=$1 port=$2 broker=$3
  preload "$name" "127.0.0.1:$port" "$port" "$name" || return 1
  # The records are there before the group exists: it must start at the
  # earliest offset (the default, latest, would skip them all). The record
  # lock gets the dispatcher's lease.
  bounded "$name.group-config" "$admin_timeout_s" "$COMPAT_DIR/kafka-cli.sh" kafka-configs \
    --bootstrap-server "127.0.0.1:$port" --alter --entity-type groups --entity-name "$name" \
    --add-config "share.auto.offset.reset=earliest,share.record.lock.duration.ms=$((LEASE_S * 1000))" \
    || { echo "setting the share group's configs failed: see $name.group-config.err" >"$run_dir/$name.why"; return 1; }
  blog "$name: $workers KafkaShareConsumer workers, explicit acknowledgement, until $messages acks"
  measured "$name" "$((run_timeout_s + 30))" "$broker" "${pin_workers[@]}" java -Xmx1g -cp "$share_dir/target/classes:$share_dir/target/lib/*" \
    bench.ShareBench --bootstrap "127.0.0.1:$port" --topic "$name" --group "$name" \
    --workers "$workers" --messages "$messages" --batch "$batch" --timeout-s "$run_timeout_s" --commit "$share_commit"
}

# --- sides 2 and 3: the dispatcher --------------------------------------------------------

# start_dispatcher <name> <bootstrap>: config (queue "bench" on the topic
# <name>), launch, wait until the HTTP API answers GET /queues/bench.
start_dispatcher() {
  local name=$1 bootstrap=$2 config="$tmp/$1.toml"
  cat >"$config" <<TOML
bootstrap_servers = "$bootstrap"
http_listen = "127.0.0.1:$DISPATCHER_HTTP_PORT"
grpc_listen = "127.0.0.1:$DISPATCHER_GRPC_PORT"
internal_listen = "127.0.0.1:$DISPATCHER_INTERNAL_PORT"
receipt_secret = "bench-secret-0123456789"

[[queue]]
name = "bench"
topic = "$name"
lease = "${LEASE_S}s"
TOML
  cp "$config" "$run_dir/$name.toml"
  for port in "$DISPATCHER_HTTP_PORT" "$DISPATCHER_GRPC_PORT" "$DISPATCHER_INTERNAL_PORT"; do
    for _ in $(seq 1 70); do port_in_use "$port" || break; sleep 1; done
  done
  NO_COLOR=1 RUST_LOG=${RUST_LOG:-info} "${pin_dispatcher[@]}" "$DISPATCHER_BIN" --config "$config" >"$run_dir/$name.dispatcher.log" 2>&1 </dev/null &
  dispatcher_pid=$!
  local deadline=$((SECONDS + ready_timeout_s))
  while ((SECONDS < deadline)); do
    if ! kill -0 "$dispatcher_pid" 2>/dev/null; then
      wait "$dispatcher_pid"
      echo "the dispatcher exited with status $? before serving: $(grep . "$run_dir/$name.dispatcher.log" | tail -1)" >"$run_dir/$name.why"
      dispatcher_pid=
      return 1
    fi
    if port_listening "$DISPATCHER_HTTP_PORT" &&
      curl -fsS -m 5 "http://127.0.0.1:$DISPATCHER_HTTP_PORT/queues/bench" >"$run_dir/$name.queue.json" 2>/dev/null; then
      return 0
    fi
    sleep 0.2
  done
  echo "the dispatcher's HTTP API did not answer GET /queues/bench within ${ready_timeout_s}s" >"$run_dir/$name.why"
  stop_pid "$dispatcher_pid" dispatcher
  dispatcher_pid=
  return 1
}

# run_dispatcher <name> <bootstrap> <port> <broker pid>: <name> is the topic and the file prefix.
run_dispatcher() {
  local name=$1 bootstrap=$2 port=$3 broker=$4
  preload "$name" "$bootstrap" "$port" "$name" || return 1
  blog "$name: starting the dispatcher"
  start_dispatcher "$name" "$bootstrap" || { blog "$name: not run: $(cat "$run_dir/$name.why")"; return 1; }
  local mode=()
  [[ $worker_mode == receive-ack ]] || mode=("-$worker_mode")
  blog "$name: $workers $api pull workers ($worker_mode), until $messages acks"
  measured "$name" "$((run_timeout_s + 30))" "$broker" "${pin_workers[@]}" env GOGC="$LOADGEN_GOGC" "$PROGRAMS/loadgen/loadgen" -api "$api" "${mode[@]}" \
    -url "http://127.0.0.1:$DISPATCHER_HTTP_PORT" -grpc "127.0.0.1:$DISPATCHER_GRPC_PORT" -queue bench -workers "$workers" -messages "$messages" \
    -batch "$batch" -wait 1s -lease "${LEASE_S}s" -timeout "${run_timeout_s}s"
  local rc=$?
  # What the dispatcher saw, for the raw results (depth, in flight).
  curl -fsS -m 5 "http://127.0.0.1:$DISPATCHER_HTTP_PORT/queues/bench" >"$run_dir/$name.queue-after.json" 2>/dev/null
  stop_pid "$dispatcher_pid" dispatcher
  dispatcher_pid=
  return $rc
}

# run_side <side> <tag>: one run of one side (tag r<k>: measured round k,
# w<k>: warm-up round k), or why it cannot run.
run_side() {
  local side=$1 name="$1-$2"
  if [[ $side == share ]]; then
    run_share "$name" "$KAFKA_PORT" "$kafka_pid"
    return
  fi
  if [[ $side == share-ours ]]; then
    if [[ -z $ours_pid ]]; then
      echo "our broker is not running (no binary, or it did not start: see ours-broker.log)" >"$run_dir/$name.why"
      return 1
    fi
    run_share "$name" "$OURS_PORT" "$ours_pid"
    return
  fi
  if [[ -z ${DISPATCHER_BIN:-} || ! -x ${DISPATCHER_BIN:-} ]]; then
    if [[ -f $run_dir/dispatcher-build.rc ]]; then
      echo "the dispatcher build failed: see dispatcher-build.err" >"$run_dir/$name.why"
    else
      echo "no dispatcher binary at ${DISPATCHER_BIN:-<none>}" >"$run_dir/$name.why"
    fi
    return 1
  fi
  if [[ $side == dispatcher-ours ]]; then
    if [[ -z $ours_pid ]]; then
      echo "our broker is not running (no binary, or it did not start: see ours-broker.log)" >"$run_dir/$name.why"
      return 1
    fi
    run_dispatcher "$name" "127.0.0.1:$OURS_PORT" "$OURS_PORT" "$ours_pid"
  else
    run_dispatcher "$name" "127.0.0.1:$KAFKA_PORT" "$KAFKA_PORT" "$kafka_pid"
  fi
}

# Every other round runs the sides in reverse, so that none always meets a
# warmer or a busier machine. Each run has its own topic (and share group).
status=0
tags=()
for ((k = 1; k <= warmup; k++)); do tags+=("w$k"); done
for ((k = 1; k <= rounds; k++)); do tags+=("r$k"); done
i=0
for tag in "${tags[@]}"; do
  i=$((i + 1))
  order=(share share-ours dispatcher-ours dispatcher-kafka)
  ((i % 2 == 0)) && order=(dispatcher-kafka dispatcher-ours share-ours share)
  for side in "${order[@]}"; do
    run_side "$side" "$tag" || status=1
  done
done

note loadavg_end "$(cut -d' ' -f1-3 /proc/loadavg)"
# The brokers are not needed any more; cleanup is idempotent, so the trap stays
# for the cargo runs below.
cleanup

# --- the lease engine's memory figures (no broker needed) -----------------------------

if ((lease_figures)); then
  blog "lease memory: cargo test -p dispatcher-sidecar --release --test lease_memory"
  bounded lease-memory "$cargo_timeout_s" bash -c \
    "cd '$ROOT' && cargo test -p dispatcher-sidecar --release --test lease_memory -- --nocapture" || status=1
  blog "lease rebuild: cargo run --release -p dispatcher-sidecar --example lease_rebuild $rebuild_records"
  bounded lease-rebuild "$cargo_timeout_s" bash -c \
    "cd '$ROOT' && cargo run --release -p dispatcher-sidecar --example lease_rebuild $rebuild_records" || status=1
else
  note lease_figures skipped
fi

python3 "$PROGRAMS/report.py" "$run_dir" >"$run_dir/table.md" || status=1
cat "$run_dir/table.md"
blog "table and raw outputs in $run_dir"
exit $status
