#!/usr/bin/env bash
# Captures request frames from real clients and derives the fuzz seeds:
#   protocol/fuzz/capture.sh [family...]
# Starts the broker binary ($BROKER_BIN, default the debug build in
# $CARGO_TARGET_DIR) with KAFKA_BROKER_CAPTURE_DIR set, runs the compat
# round trips (N records per codec, default 200) and the pinned scenarios
# of each named client family (default: kcat python java kafkajs franz-go
# sarama; the clients come from compat-tests/install.sh), stops it, and
# writes the seeds derived from the frames and from its log.dirs into
# $CAPTURE_OUT (default a temp directory, printed), one directory per fuzz
# target. Minimise them into the committed corpus with run.sh --cmin.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# Before lib.sh, whose default is the CI round trips' 100000.
N=${N:-200}
source "$root/compat-tests/lib.sh"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
broker_bin=${BROKER_BIN:-$CARGO_TARGET_DIR/debug/broker}
families=("$@")
((${#families[@]})) || families=(kcat python java kafkajs franz-go sarama)
out=${CAPTURE_OUT:-$(mktemp -d)}
# Its own loopback address, so it does not collide with a broker on 127.0.0.1.
host=${CAPTURE_HOST:-127.0.0.7}
port=${CAPTURE_PORT:-9092}

[[ -x $broker_bin ]] || die "no broker binary at $broker_bin (cargo build -p broker)"
work=$(mktemp -d)
mkdir -p "$work/frames" "$work/data"
KAFKA_BROKER_CAPTURE_DIR="$work/frames" "$broker_bin" \
  --override "log.dirs=$work/data" \
  --override "listeners=PLAINTEXT://$host:$port" \
  --override "group.initial.rebalance.delay.ms=0" \
  --override "metrics.listen.address=127.0.0.1:0" >"$work/broker.log" 2>&1 &
broker_pid=$!
stop_broker() { kill "$broker_pid" 2>/dev/null || true; wait "$broker_pid" 2>/dev/null || true; }
trap 'stop_broker; rm -rf "$work"' EXIT
for _ in $(seq 100); do
  timeout 1 bash -c "exec 3<>/dev/tcp/$host/$port" 2>/dev/null && break
  sleep 0.2
done
bootstrap="$host:$port"

for family in "${families[@]}"; do
  case $family in
    kcat) step "$COMPAT_DIR/kcat/roundtrip.sh" "$bootstrap" "$N" || true ;;
    python) step "$VENV_DIR/bin/python" "$COMPAT_DIR/python/roundtrip.py" "$bootstrap" "$N" || true ;;
    java) step java -cp "$JAVA_CLASSES:$JAVA_LIBS/*" compat.RoundTrip "$bootstrap" "$N" || true ;;
  esac
  ids=$(awk -v f="$family" '$1 == f { $1 = ""; print }' "$COMPAT_DIR/scenarios.allow")
  [[ -n $ids ]] || continue
  log "capturing $family scenarios"
  # shellcheck disable=SC2086 # ids are words
  timeout --kill-after=10 600 "$COMPAT_DIR/${FAMILY_CMD[$family]}" "$bootstrap" $ids >"$work/$family.out" 2>&1 || true
  log "$family: $(grep -c "^RESULT .* PASS" "$work/$family.out") scenarios passed"
done
stop_broker
log "$(find "$work/frames" -type f | wc -l) distinct frames captured"

cargo run -q -p protocol --example fuzz_seeds -- "$work/frames" "$out/protocol"
cargo run -q -p broker --example fuzz_seeds -- "$work/data" "$out/broker"
echo "$out"
