#!/usr/bin/env bash
# The whole compatibility matrix:
#   matrix.sh [--families "java cli ..."] [--peers "kgo librdkafka"]
#             [--security "listeners acls acl-matrix quotas librdkafka-auth"] [--report-only]
# Installs every client family and peer suite, starts our broker (release
# build, or $BROKER_BIN) and Apache Kafka (the reference) side by side on
# their own ports, runs every family's scenario list and both peer suites
# against each broker, then the security suites (compat-tests/security/:
# each starts its own broker of either kind with TLS and SASL listeners, an
# authorizer or quotas), and writes compat-tests/REPORT.md (client x
# scenario, and security check, ours vs Kafka). Raw results stay in $MATRIX_OUT (default a temp dir, printed);
# a run with a subset of families or peers adds to an existing $MATRIX_OUT,
# and --report-only rewrites REPORT.md from it without running anything.
# Exits 0 when the report was written, whatever the results: the report is the
# product; CI pins results through run-ci.sh and the tests.allow files.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ROOT=$(cd "$COMPAT_DIR/.." && pwd)

families=("${FAMILIES[@]}")
peers=("${PEER_SUITES[@]}")
# Security suites: name -> the script and, per broker, its arguments.
security=("${SECURITY_SUITES[@]}")
ours_port=${OURS_PORT:-29092}
kafka_port=${KAFKA_PORT:-29192}
# A bound on one family's whole scenario list and one peer suite's run.
family_timeout_s=${FAMILY_TIMEOUT_S:-900}
peer_timeout_s=${PEER_TIMEOUT_S:-3600}
# The listeners suite with --hostile --peers budgets itself 1140 s.
security_timeout_s=${SECURITY_TIMEOUT_S:-1500}

report_only=0
while (($#)); do
  case "$1" in
    --families) read -r -a families <<<"$2"; shift 2 ;;
    --peers) read -r -a peers <<<"$2"; shift 2 ;;
    --security) read -r -a security <<<"$2"; shift 2 ;;
    --report-only) report_only=1; shift ;;
    *) die "usage: matrix.sh [--families \"java cli ...\"] [--peers \"kgo librdkafka\"] [--security \"listeners acls acl-matrix quotas librdkafka-auth\"] [--report-only]" ;;
  esac
done

out=${MATRIX_OUT:-$(mktemp -d)}
mkdir -p "$out/ours" "$out/kafka"
log "raw results in $out"

# The report covers every family and peer suite with results in $out.
write_report() {
  local fams=() ps=() ss=() f
  for f in "${FAMILIES[@]}"; do [[ -f $out/ours/$f.results ]] && fams+=("$f"); done
  for f in "${PEER_SUITES[@]}"; do [[ -f $out/ours/$f.peer ]] && ps+=("$f"); done
  for f in "${SECURITY_SUITES[@]}"; do [[ -f $out/ours/security-$f.checks ]] && ss+=("$f"); done
  python3 "$COMPAT_DIR/report.py" "$out" "${fams[*]}" "${ps[*]}" "${ss[*]}" >"$COMPAT_DIR/REPORT.md" || die "report failed"
  log "wrote $COMPAT_DIR/REPORT.md"
}
if ((report_only)); then
  write_report
  exit 0
fi

declare -A parts=([kafka]=1)
for f in "${families[@]}"; do for p in ${FAMILY_INSTALL[$f]}; do parts[$p]=1; done; done
for p in "${peers[@]}"; do parts[$p]=1; done
# The security suites' clients (go and js for franz-go/sarama and kafkajs over TLS and
# SASL), and for the listeners suite's --peers: kgo and librdkafka's OpenSSL build.
((${#security[@]})) && for p in kcat python java go js kgo librdkafka-ssl; do parts[$p]=1; done
"$COMPAT_DIR/install.sh" "${!parts[@]}" || die "install failed"

if [[ -z ${BROKER_BIN:-} ]]; then
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/kafka-rs/target}"
  (cd "$ROOT" && cargo build --release --bin broker) || die "broker build failed"
  BROKER_BIN="$CARGO_TARGET_DIR/release/broker"
fi

ours_data=$(mktemp -d)
kafka_data=$(mktemp -d)
ours_pid=
child=
cleanup() {
  [[ -n $child ]] && kill -TERM "$child" 2>/dev/null
  [[ -n $ours_pid ]] && { kill "$ours_pid" 2>/dev/null; wait "$ours_pid" 2>/dev/null; }
  "$COMPAT_DIR/kafka-reference/stop.sh" "$kafka_data" >/dev/null 2>&1 || true
  rm -rf "$ours_data" "$kafka_data"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# group.initial.rebalance.delay.ms=0 as in kafka-reference/start.sh: the default
# 3 s wait before a new group's first rebalance would only slow every group test.
"$BROKER_BIN" --override "log.dirs=$ours_data" \
  --override "listeners=PLAINTEXT://127.0.0.1:$ours_port" \
  --override "group.initial.rebalance.delay.ms=0" \
  --override "metrics.listen.address=127.0.0.1:0" >"$out/ours/broker.log" 2>&1 &
ours_pid=$!
"$COMPAT_DIR/kafka-reference/start.sh" "$kafka_port" "$kafka_data" >/dev/null || die "reference Kafka did not start"
for _ in $(seq 1 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$ours_port") 2>/dev/null && break
  sleep 0.1
done

# Runs one step in the background so an interrupt stops it at once.
step() {
  "$@" &
  child=$!
  wait "$child"
  local rc=$?
  child=
  return $rc
}

broker_version() {
  case "$1" in
    ours) echo "$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)" ;;
    kafka) basename "$(compgen -G "$KAFKA_LIBS/kafka_2.13-*.jar" | head -1)" .jar | sed 's/kafka_2.13-/Apache Kafka /' ;;
  esac
}

for broker in ours kafka; do
  port=$ours_port
  [[ $broker == kafka ]] && port=$kafka_port
  broker_version "$broker" >"$out/$broker/version"
  for f in "${families[@]}"; do
    log "$f scenarios against $broker (127.0.0.1:$port)"
    start=$SECONDS
    step timeout --kill-after=10 "$family_timeout_s" "$COMPAT_DIR/${FAMILY_CMD[$f]}" "127.0.0.1:$port" \
      >"$out/$broker/$f.results" 2>"$out/$broker/$f.err"
    echo "$?" >"$out/$broker/$f.rc"
    echo $((SECONDS - start)) >"$out/$broker/$f.seconds"
    log "$f on $broker: $(grep -c '^RESULT [^ ]* PASS' "$out/$broker/$f.results") passed"
  done
  for p in "${peers[@]}"; do
    log "$p peer suite against $broker"
    start=$SECONDS
    step timeout --kill-after=10 "$peer_timeout_s" "$COMPAT_DIR/$p/run.sh" "127.0.0.1:$port" --all \
      >"$out/$broker/$p.peer" 2>"$out/$broker/$p.err"
    echo "$?" >"$out/$broker/$p.rc"
    echo $((SECONDS - start)) >"$out/$broker/$p.seconds"
    log "$p on $broker: $(tail -1 "$out/$broker/$p.peer")"
  done
done
kill -0 "$ours_pid" 2>/dev/null || log "WARNING: our broker exited during the run (see $out/ours/broker.log)"

# The security suites start their own brokers on their own ports (26092-26296).
for broker in ours kafka; do
  args=(kafka)
  [[ $broker == ours ]] && args=(ours --bin "$BROKER_BIN")
  for s in "${security[@]}"; do
    extra=()
    [[ $s == listeners ]] && extra=(--hostile --peers)
    [[ $s == acl-matrix ]] && extra=(--matrix)
    log "security suite $s against $broker"
    start=$SECONDS
    step timeout --kill-after=10 "$security_timeout_s" bash "$COMPAT_DIR/security/${SECURITY_SCRIPT[$s]}" "${args[@]}" "${extra[@]}" \
      >"$out/$broker/security-$s.checks" 2>"$out/$broker/security-$s.err"
    echo "$?" >"$out/$broker/security-$s.rc"
    echo $((SECONDS - start)) >"$out/$broker/security-$s.seconds"
    log "security $s on $broker: $(tail -1 "$out/$broker/security-$s.checks")"
  done
done

write_report
