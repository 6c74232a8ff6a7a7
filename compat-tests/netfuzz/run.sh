#!/usr/bin/env bash
# The network fuzzer against the running broker and against Apache Kafka:
#   netfuzz/run.sh [ours] [kafka]      (both by default)
# Each broker is started fresh, fuzzed by netfuzz for $NETFUZZ_SECONDS
# (default 60) over $NETFUZZ_CONNS connections (default 32) with mutations
# of the protocol crate's captured request corpus, and stopped; then one
# table with a column per broker. Our binary is $BROKER_BIN (default the
# debug build in $CARGO_TARGET_DIR); Kafka comes from install.sh kafka.
# $NETFUZZ_SEED replays a run's mutations. Exits 1 if a broker died or
# missed a liveness check.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
root=$(cd "$COMPAT_DIR/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
broker_bin=${BROKER_BIN:-$CARGO_TARGET_DIR/debug/broker}
seconds=${NETFUZZ_SECONDS:-60}
conns=${NETFUZZ_CONNS:-32}
seed=${NETFUZZ_SEED:-$(date +%s)}
corpus=${NETFUZZ_CORPUS:-$root/protocol/fuzz/corpus/request_stream}
which=("$@")
((${#which[@]})) || which=(ours kafka)

work=$(mktemp -d)
bin="$work/netfuzz"
(cd "$COMPAT_DIR/netfuzz" && go build -o "$bin" .)
pid=
cleanup() {
  [[ -n $pid ]] && kill "$pid" 2>/dev/null || true
  [[ -f $work/kafka/kafka.pid ]] && "$COMPAT_DIR/kafka-reference/stop.sh" "$work/kafka" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

wait_port() {
  for _ in $(seq 300); do
    timeout 1 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null && return 0
    sleep 0.2
  done
  return 1
}

status=0
results=()
for broker in "${which[@]}"; do
  case $broker in
    ours)
      # Its own loopback address, so it does not collide with a broker on 127.0.0.1.
      host=127.0.0.8 port=9092
      mkdir -p "$work/ours"
      "$broker_bin" --override "log.dirs=$work/ours/data" \
        --override "listeners=PLAINTEXT://$host:$port" \
        --override "metrics.listen.address=127.0.0.1:0" >"$work/ours/broker.log" 2>&1 &
      pid=$!
      wait_port "$host" "$port" || die "our broker did not start"
      ;;
    kafka)
      "$COMPAT_DIR/install.sh" kafka >&2
      host=127.0.0.1 port=${NETFUZZ_KAFKA_PORT:-19392}
      pid=$("$COMPAT_DIR/kafka-reference/start.sh" "$port" "$work/kafka" | tail -1)
      ;;
    *) die "unknown broker '$broker' (ours or kafka)" ;;
  esac
  log "fuzzing $broker (pid $pid) for $seconds s over $conns connections, seed $seed"
  "$bin" -bootstrap "$host:$port" -pid "$pid" -seconds "$seconds" -conns "$conns" \
    -corpus "$corpus" -seed "$seed" -label "$broker" >"$work/$broker.json"
  results+=("$work/$broker.json")
  case $broker in
    ours)
      kill "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
      grep -m3 -iE 'panicked|fatal' "$work/ours/broker.log" >&2 || true
      ;;
    kafka) "$COMPAT_DIR/kafka-reference/stop.sh" "$work/kafka" >/dev/null 2>&1 || true ;;
  esac
  pid=
  if grep -qE '"died":true|"liveness_failures":[1-9]' "$work/$broker.json"; then status=1; fi
done

python3 - "${results[@]}" <<'PY'
import json, sys
cols = [json.load(open(p)) for p in sys.argv[1:]]
rows = [
    ("seconds", lambda r: f"{r['seconds']:.0f}"),
    ("connections opened", lambda r: r["connections"]),
    ("requests sent", lambda r: r["requests"]),
    ("responses read", lambda r: r["responses"]),
    ("connections closed by the broker", lambda r: r["closed_by_broker"]),
    ("MiB sent", lambda r: f"{r['bytes_sent'] / 2**20:.1f}"),
    ("broker died", lambda r: f"yes, after {r['died_after_seconds']:.0f} s" if r["died"] else "no"),
    ("RSS at start (MiB)", lambda r: f"{r['start_rss_mib']:.0f}"),
    ("peak RSS (MiB)", lambda r: f"{r['peak_rss_mib']:.0f}"),
    ("liveness checks failed", lambda r: f"{r['liveness_failures']} of {r['liveness_checks']}"),
    ("slowest ApiVersions (ms)", lambda r: f"{r['max_api_versions_ms']:.0f}"),
    ("seed", lambda r: r["seed"]),
]
w = max(len(n) for n, _ in rows)
print("| " + "what".ljust(w) + " | " + " | ".join(c["label"] for c in cols) + " |")
print("|" + "-" * (w + 2) + "|" + "|".join("-" * (len(c["label"]) + 2) for c in cols) + "|")
for name, f in rows:
    print("| " + name.ljust(w) + " | " + " | ".join(str(f(c)) for c in cols) + " |")
for c in cols:
    if c.get("first_liveness_error"):
        print(f"{c['label']}: first liveness failure {c['first_liveness_error']}")
PY
exit "$status"
