#!/usr/bin/env bash
# The resource-exhaustion suite: each hostile request of issue 29 sent to a
# freshly started broker, one case at a time (src/main.rs says what each
# case sends and what is checked).
#
#   run.sh ours [--bin PATH] [hostile args...]   our broker; fails unless every case holds
#   run.sh kafka [hostile args...]               Apache Kafka 4.4 (reference; reports only)
#   run.sh both [--bin PATH] [hostile args...]   both, then a side-by-side table
#
# --bin defaults to $BROKER_BIN, else the release build
# ($CARGO_TARGET_DIR or target/, built if missing). Extra arguments go to the
# hostile client (e.g. --cases stalled_frames,future_timestamp --bomb-mib 1000).
# Outputs land in $HOSTILE_OUT (default: a new temporary directory).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
root=$(cd "$COMPAT_DIR/.." && pwd)

[[ $# -ge 1 ]] || { echo "usage: run.sh ours|kafka|both [--bin PATH] [hostile args...]" >&2; exit 2; }
mode=$1
shift
bin=${BROKER_BIN:-}
if [[ ${1:-} == --bin ]]; then
  bin=$2
  shift 2
fi
target_dir=${CARGO_TARGET_DIR:-$root/target}
out=${HOSTILE_OUT:-$(mktemp -d)}
mkdir -p "$out"
ours_port=${HOSTILE_OURS_PORT:-29392}
kafka_port=${HOSTILE_KAFKA_PORT:-29492}

hostile_bin="$target_dir/debug/hostile"
(cd "$root" && cargo build -q -p hostile) || die "building the hostile client failed"

run_ours() {
  if [[ -z $bin ]]; then
    bin="$target_dir/release/broker"
    [[ -x $bin ]] || (cd "$root" && cargo build -q --release --bin broker) || die "building the broker failed"
  fi
  local data="$out/ours-data" pid rc=0
  rm -rf "$data"
  mkdir -p "$data"
  "$bin" --override "log.dirs=$data" \
    --override "listeners=PLAINTEXT://127.0.0.1:$ours_port" \
    --override "metrics.listen.address=none" >"$out/ours-broker.log" 2>&1 &
  pid=$!
  local deadline=$((SECONDS + 60))
  until (exec 3<>"/dev/tcp/127.0.0.1/$ours_port") 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || { tail -30 "$out/ours-broker.log"; die "our broker exited during startup"; }
    ((SECONDS < deadline)) || { kill "$pid"; die "our broker did not listen within 60 s"; }
    sleep 0.2
  done
  log "our broker ($bin, pid $pid) on 127.0.0.1:$ours_port"
  "$hostile_bin" --bootstrap "127.0.0.1:$ours_port" --pid "$pid" --check "$@" | tee "$out/ours.txt" || rc=$?
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "our broker died"; tail -30 "$out/ours-broker.log"; rc=1
  fi
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  return $rc
}

run_kafka() {
  "$COMPAT_DIR/install.sh" kafka >/dev/null || die "installing the Kafka jars failed"
  local data="$out/kafka-data" pid
  rm -rf "$data"
  pid=$("$COMPAT_DIR/kafka-reference/start.sh" "$kafka_port" "$data" | tail -1)
  log "Apache Kafka (pid $pid) on 127.0.0.1:$kafka_port"
  "$hostile_bin" --bootstrap "127.0.0.1:$kafka_port" --pid "$pid" "$@" | tee "$out/kafka.txt" || true
  "$COMPAT_DIR/kafka-reference/stop.sh" "$data" >/dev/null 2>&1 || true
}

table() {
  python3 - "$out/ours.txt" "$out/kafka.txt" <<'PY'
import re, sys
def load(path):
    rows = {}
    for line in open(path):
        m = re.match(r'case (\S+) answer="(.*)" expected="(.*)" alive_ms=(\S+) peak_rss_mib=(\d+) verdict=(\S+)', line)
        if m:
            rows[m[1]] = m.groups()[1:]
    return rows
ours, kafka = load(sys.argv[1]), load(sys.argv[2])
print("| case | ours: answer | alive ms | peak RSS MiB | Kafka 4.4: answer | alive ms | peak RSS MiB |")
print("|---|---|---|---|---|---|---|")
for case in list(ours) + [c for c in kafka if c not in ours]:
    o = ours.get(case, ("-",) * 5)
    k = kafka.get(case, ("-",) * 5)
    print(f"| {case} | {o[0]} | {o[2]} | {o[3]} | {k[0]} | {k[2]} | {k[3]} |")
PY
}

case $mode in
  ours) run_ours "$@" ;;
  kafka) run_kafka "$@" ;;
  both)
    rc=0
    run_ours "$@" || rc=$?
    run_kafka "$@"
    table
    exit $rc
    ;;
  *) die "unknown mode $mode" ;;
esac
