#!/usr/bin/env bash
# Push throughput of the dispatcher (issue 8):
#   bench/push.sh [--smoke] [--concurrency "16 64"] [--messages M] [--record-bytes S]
# For each push concurrency C, two cases on our broker (release build):
#   fast   an HTTP endpoint that answers 200 at once
#   slow   one that answers after 50 ms: Little's law bounds the rate by
#          C / 0.05 s, and the table shows how close the dispatcher gets
# Each case has its own topic (8 partitions) and a fresh dispatcher whose one
# queue pushes to bench/push/pushbench's endpoint. pushbench pauses the queue,
# produces the messages through the dispatcher's produce API, resumes it, and
# times the pushes until every message was answered (each message id once),
# then until the queue shows nothing left (all acked).
#
# Builds pushbench (go build), the dispatcher and our broker (release) unless
# DISPATCHER_BIN / BROKER_BIN name binaries; installs the Kafka tools
# (compat-tests/install.sh kafka) to create the topics. Raw outputs and the
# table go to ${BENCH_OUT:-bench/out}/push-<UTC time>/. Exit status 0 when
# every case ran to its count.
set -uo pipefail
BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
source "$ROOT/compat-tests/lib.sh"

# Ports of this harness only, below the ephemeral range.
OURS_PORT=28692
HTTP_PORT=28680
GRPC_PORT=28681
INTERNAL_PORT=28682
ENDPOINT_PORT=28690
PARTITIONS=8
SLOW_MS=50

usage() {
  echo "usage: bench/push.sh [--smoke] [--concurrency \"C1 C2 ...\"] [--messages M] [--record-bytes S]" >&2
  exit 2
}
positive() { [[ ${1:-} =~ ^[0-9]+$ && $1 -ge 1 ]]; }
smoke=0
concurrencies="16 64"
fast_messages=100000
record_bytes=1024
while (($#)); do
  case "$1" in
    --smoke) smoke=1; shift ;;
    --concurrency) [[ ${2:-} =~ ^[0-9]+( [0-9]+)*$ ]] || usage; concurrencies=$2; shift 2 ;;
    --messages) positive "${2:-}" || usage; fast_messages=$2; shift 2 ;;
    --record-bytes) positive "${2:-}" || usage; record_bytes=$2; shift 2 ;;
    *) usage ;;
  esac
done
((smoke)) && fast_messages=2000
for c in $concurrencies; do ((c >= 1 && c <= 1000)) || die "a push concurrency is 1 to 1000"; done

out_root=${BENCH_OUT:-$ROOT/bench/out}
run_dir="$out_root/push-$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$run_dir" || die "cannot create $run_dir"
ln -sfn "$(basename "$run_dir")" "$out_root/push-latest"
blog() { printf '[bench %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
blog "raw results in $run_dir"

tmp=$(mktemp -d -t bench-push.XXXXXX)
ours_pid=
dispatcher_pid=
stop_pid() {
  local pid=$1
  [[ -n $pid ]] || return 0
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
}
cleanup() {
  stop_pid "$dispatcher_pid"
  stop_pid "$ours_pid"
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
port_in_use() { ss -Htan "( sport = :$1 )" 2>/dev/null | grep -q .; }

# --- install and build -------------------------------------------------------------

"$COMPAT_DIR/install.sh" kafka >"$run_dir/install.log" 2>&1 \
  || { cat "$run_dir/install.log" >&2; die "installing the Kafka tools failed"; }
(cd "$BENCH_DIR/push/pushbench" && go build -o pushbench .) >"$run_dir/pushbench-build.log" 2>&1 \
  || { cat "$run_dir/pushbench-build.log" >&2; die "building pushbench failed"; }
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
if [[ -z ${DISPATCHER_BIN:-} ]]; then
  blog "building the dispatcher (release)"
  (cd "$ROOT" && timeout 3600 cargo build --release -p dispatcher-sidecar --bin dispatcher) >"$run_dir/build.log" 2>&1 \
    || { tail -20 "$run_dir/build.log" >&2; die "building the dispatcher failed"; }
  DISPATCHER_BIN="$CARGO_TARGET_DIR/release/dispatcher"
fi
if [[ -z ${BROKER_BIN:-} ]]; then
  blog "building our broker (release)"
  (cd "$ROOT" && timeout 3600 cargo build --release -p broker) >>"$run_dir/build.log" 2>&1 \
    || { tail -20 "$run_dir/build.log" >&2; die "building our broker failed"; }
  BROKER_BIN="$CARGO_TARGET_DIR/release/broker"
fi
{
  echo "date_utc=$(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "commit=$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "dispatcher=$(date -u -r "$DISPATCHER_BIN" '+%Y-%m-%d %H:%M UTC') sha256 $(sha256sum "$DISPATCHER_BIN" | cut -c1-12)"
  echo "cpus=$(nproc)"
  echo "loadavg_start=$(cut -d' ' -f1-3 /proc/loadavg)"
} >"$run_dir/meta.env"

# --- our broker ----------------------------------------------------------------------

for port in "$OURS_PORT" "$HTTP_PORT" "$GRPC_PORT" "$INTERNAL_PORT" "$ENDPOINT_PORT"; do
  port_in_use "$port" && die "port $port is in use"
done
blog "starting our broker on 127.0.0.1:$OURS_PORT"
"$BROKER_BIN" --override "listeners=PLAINTEXT://127.0.0.1:$OURS_PORT" --override "log.dirs=$tmp/broker" \
  --override "metrics.listen.address=none" --override "group.initial.rebalance.delay.ms=0" \
  --override "offsets.topic.num.partitions=3" >"$run_dir/broker.log" 2>&1 </dev/null &
ours_pid=$!
python3 "$BENCH_DIR/ready.py" 127.0.0.1 "$OURS_PORT" 120 >/dev/null || die "our broker did not start"

# --- the cases ---------------------------------------------------------------------------

# run_case <name> <concurrency> <delay ms> <messages>
run_case() {
  local name=$1 c=$2 delay=$3 n=$4 config="$tmp/$1.toml" rc
  timeout 120 "$COMPAT_DIR/kafka-cli.sh" kafka-topics --bootstrap-server "127.0.0.1:$OURS_PORT" --create \
    --topic "$name" --partitions "$PARTITIONS" --replication-factor 1 >"$run_dir/$name.topic.log" 2>&1 \
    || { echo "creating the topic failed" >"$run_dir/$name.why"; return 1; }
  cat >"$config" <<TOML
bootstrap_servers = "127.0.0.1:$OURS_PORT"
http_listen = "127.0.0.1:$HTTP_PORT"
grpc_listen = "127.0.0.1:$GRPC_PORT"
internal_listen = "127.0.0.1:$INTERNAL_PORT"
receipt_secret = "bench-secret-0123456789"

[[queue]]
name = "bench"
topic = "$name"

[queue.push]
url = "http://127.0.0.1:$ENDPOINT_PORT/push"
concurrency = $c
timeout = "10s"
TOML
  cp "$config" "$run_dir/$name.toml"
  NO_COLOR=1 RUST_LOG=${RUST_LOG:-info} "$DISPATCHER_BIN" --config "$config" >"$run_dir/$name.dispatcher.log" 2>&1 </dev/null &
  dispatcher_pid=$!
  local ready=0
  for _ in $(seq 1 600); do
    curl -fsS -m 2 "http://127.0.0.1:$HTTP_PORT/queues/bench" >/dev/null 2>&1 && { ready=1; break; }
    kill -0 "$dispatcher_pid" 2>/dev/null || break
    sleep 0.2
  done
  if ((!ready)); then
    echo "the dispatcher did not serve: $(tail -1 "$run_dir/$name.dispatcher.log")" >"$run_dir/$name.why"
    stop_pid "$dispatcher_pid"; dispatcher_pid=
    return 1
  fi
  blog "$name: push concurrency $c, endpoint answering after ${delay} ms, $n messages"
  timeout 400 "$BENCH_DIR/push/pushbench/pushbench" -dispatcher "http://127.0.0.1:$HTTP_PORT" -queue bench \
    -listen "127.0.0.1:$ENDPOINT_PORT" -delay "${delay}ms" -messages "$n" -size "$record_bytes" \
    -concurrency "$c" -timeout 300s >"$run_dir/$name.out" 2>"$run_dir/$name.err"
  rc=$?
  ((rc == 0)) || echo "pushbench failed (exit $rc): $(tail -1 "$run_dir/$name.err")" >"$run_dir/$name.why"
  stop_pid "$dispatcher_pid"; dispatcher_pid=
  return $rc
}

status=0
cases=()
for c in $concurrencies; do
  run_case "fast-c$c" "$c" 0 "$fast_messages" || status=1
  # About ten seconds at the Little's-law bound (C / 50 ms).
  slow=$((c * 1000 / SLOW_MS * 10))
  ((smoke)) && slow=$((c * 4))
  run_case "slow-c$c" "$c" "$SLOW_MS" "$slow" || status=1
  cases+=("fast-c$c" "slow-c$c")
done
echo "loadavg_end=$(cut -d' ' -f1-3 /proc/loadavg)" >>"$run_dir/meta.env"

# --- the table -----------------------------------------------------------------------------
{
  echo "Push throughput: $(grep ^date_utc "$run_dir/meta.env" | cut -d= -f2), commit $(grep ^commit "$run_dir/meta.env" | cut -d= -f2),"
  echo "dispatcher $(grep ^dispatcher= "$run_dir/meta.env" | cut -d= -f2-), our broker, $PARTITIONS partitions, $record_bytes B payloads,"
  echo "load average at start $(grep ^loadavg_start "$run_dir/meta.env" | cut -d= -f2), at end $(grep ^loadavg_end "$run_dir/meta.env" | cut -d= -f2)."
  echo
  echo "| case | concurrency | endpoint delay ms | messages | pushed msgs/s | Little's-law bound msgs/s | rate ÷ bound | all acked after s | pushes beyond one per message | max in flight at the endpoint |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  for name in "${cases[@]}"; do
    line=$(grep '^RESULT' "$run_dir/$name.out" 2>/dev/null)
    if [[ -z $line ]]; then
      echo "| $name | not run: $(cat "$run_dir/$name.why" 2>/dev/null) |||||||||"
      continue
    fi
    get() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$line"; }
    bound=$(get littles_law_bound)
    ratio=-
    [[ $bound != -1 ]] && ratio=$(awk -v r="$(get msgs_per_s)" -v b="$bound" 'BEGIN {printf "%.2f", r / b}')
    [[ $bound == -1 ]] && bound=-
    echo "| $name | $(get concurrency) | $(get delay_ms) | $(get messages) | $(get msgs_per_s) | $bound | $ratio | $(get all_acked_s) | $(get duplicates) | $(get max_in_flight) |"
  done
} >"$run_dir/table.md"
cat "$run_dir/table.md"
exit $status
