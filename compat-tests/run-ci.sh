#!/usr/bin/env bash
# Runs the kcat, Python and Java round trips against one broker: run-ci.sh <bootstrap>
# N (environment, default 100000) records per codec. Installs what the clients
# need first (idempotent). Prints each client's lines and ends with
# "<passed> passed, <failed> failed" counting client x codec checks; a client
# that crashed or timed out counts every codec it did not report as failed.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ $# -eq 1 ]] || { echo "usage: run-ci.sh <bootstrap>" >&2; exit 2; }
bootstrap=$1
# A bound on each client's whole run; at N=100000 each takes 15-25 s against Kafka.
client_timeout_s=${CLIENT_TIMEOUT_S:-900}

"$COMPAT_DIR/install.sh" kcat python java || die "install failed"

host=${bootstrap%:*}
port=${bootstrap##*:}
# Without a listener every client would sit out its admin timeouts codec by codec;
# fail all checks at once instead.
if ! timeout 5 bash -c "exec 3<>/dev/tcp/$host/$port" 2>/dev/null; then
  echo "FAIL all clients: nothing accepts connections on $bootstrap"
  echo "0 passed, $((3 * ${#CODECS[@]})) failed"
  exit 1
fi

workdir=$(mktemp -d)
child=
# Clients run in the background with `wait`, because bash defers traps while a
# foreground command runs; an interrupt then stops the running client at once.
trap 'rm -rf "$workdir"' EXIT
trap '[[ -n $child ]] && kill -TERM "$child" 2>/dev/null; exit 130' INT TERM

total_passed=0
total_failed=0
run_client() {
  local name=$1 start=$SECONDS rc passed failed
  shift
  log "running $name round trip (N=$N) against $bootstrap"
  timeout --kill-after=10 "$client_timeout_s" "$@" "$bootstrap" "$N" >"$workdir/$name.out" 2>"$workdir/$name.err" &
  child=$!
  wait "$child"
  rc=$?
  child=
  grep -E '^(PASS|FAIL) ' "$workdir/$name.out"
  passed=$(grep -c '^PASS ' "$workdir/$name.out")
  failed=$(grep -c '^FAIL ' "$workdir/$name.out")
  # Codecs the client never reported (it crashed or was killed) are failures too.
  if ((passed + failed < ${#CODECS[@]})); then
    echo "FAIL $name: exited $rc after reporting $((passed + failed)) of ${#CODECS[@]} codecs"
    failed=$((${#CODECS[@]} - passed))
  elif ((rc != 0 && failed == 0)); then
    echo "FAIL $name: exited $rc although every codec passed"
    failed=1
  fi
  if ((failed > 0)); then
    echo "--- $name stderr (last 20 lines) ---"
    tail -20 "$workdir/$name.err"
  fi
  echo "$name: $passed passed, $failed failed in $((SECONDS - start)) s"
  total_passed=$((total_passed + passed))
  total_failed=$((total_failed + failed))
}

run_client kcat "$COMPAT_DIR/kcat/roundtrip.sh"
run_client python "$VENV_DIR/bin/python" "$COMPAT_DIR/python/roundtrip.py"
run_client java java -cp "$JAVA_CLASSES:$JAVA_LIBS/*" compat.RoundTrip

summary="$total_passed passed, $total_failed failed"
echo "$summary"
# A caller that prints more after this (kafka-reference/run.sh) repeats the line last.
[[ -n ${COMPAT_SUMMARY_FILE:-} ]] && echo "$summary" >"$COMPAT_SUMMARY_FILE"
((total_failed == 0))
