#!/usr/bin/env bash
# The compat part of CI, against one broker: run-ci.sh <bootstrap>
#  1. kcat, Python and Java round trips: N (environment, default 100000)
#     records per codec; a client that crashed or timed out counts every codec
#     it did not report as failed.
#  2. The pinned scenarios of every client family (scenarios.allow): each
#     listed scenario must pass; one that never reports counts as failed.
#  3. Both peer suites' pinned tests (<suite>/tests.allow), through
#     <suite>/run.sh --allowed.
# Before those, cluster/validate-compose.py checks docker-compose.yml and
# cluster/validate-k8s.py the Kubernetes manifests in config/kubernetes (one check each).
# Installs what it needs first (idempotent). Ends with
# "<passed> passed, <failed> failed" counting every check above.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ $# -eq 1 ]] || { echo "usage: run-ci.sh <bootstrap>" >&2; exit 2; }
bootstrap=$1
# A bound on each client's whole run; at N=100000 each takes 15-25 s against Kafka.
client_timeout_s=${CLIENT_TIMEOUT_S:-900}

"$COMPAT_DIR/install.sh" ci || die "install failed"

host=${bootstrap%:*}
port=${bootstrap##*:}
# Without a listener every client would sit out its admin timeouts codec by codec;
# fail all checks at once instead.
if ! timeout 5 bash -c "exec 3<>/dev/tcp/$host/$port" 2>/dev/null; then
  echo "FAIL all clients: nothing accepts connections on $bootstrap"
  echo "0 passed, 1 failed"
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
# The 3-broker docker-compose.yml keeps its structure (node ids, one quorum, ports, volumes).
if "$VENV_DIR/bin/python" "$COMPAT_DIR/cluster/validate-compose.py" --selftest; then total_passed=$((total_passed + 1)); else total_failed=$((total_failed + 1)); fi
# The Kubernetes StatefulSet keeps its structure (ordinal node ids, voters per replica, probes).
if "$VENV_DIR/bin/python" "$COMPAT_DIR/cluster/validate-k8s.py" --selftest; then total_passed=$((total_passed + 1)); else total_failed=$((total_failed + 1)); fi
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

# 2. Pinned scenarios: "<family> <id>..." lines of scenarios.allow.
while read -r family ids; do
  [[ -z $family || $family == \#* ]] && continue
  cmd=${FAMILY_CMD[$family]:-}
  [[ -n $cmd ]] || die "scenarios.allow names unknown family '$family'"
  read -r -a want <<<"${ids%%#*}"
  start=$SECONDS
  log "running $family scenarios (${#want[@]} pinned) against $bootstrap"
  timeout --kill-after=10 "$client_timeout_s" "$COMPAT_DIR/$cmd" "$bootstrap" "${want[@]}" \
    >"$workdir/$family.out" 2>"$workdir/$family.err" &
  child=$!
  wait "$child"
  child=
  passed=0
  failed=0
  for id in "${want[@]}"; do
    line=$(grep -m1 "^RESULT $id " "$workdir/$family.out")
    if [[ $line == "RESULT $id PASS"* ]]; then
      passed=$((passed + 1))
    else
      failed=$((failed + 1))
      echo "FAIL $family $id: ${line:-never reported}"
    fi
  done
  if ((failed > 0)); then
    echo "--- $family stderr (last 20 lines) ---"
    tail -20 "$workdir/$family.err"
  fi
  echo "$family scenarios: $passed passed, $failed failed in $((SECONDS - start)) s"
  total_passed=$((total_passed + passed))
  total_failed=$((total_failed + failed))
done <"$COMPAT_DIR/scenarios.allow"

# 3. Peer suites' pinned tests.
for suite in "${PEER_SUITES[@]}"; do
  start=$SECONDS
  log "running the $suite peer suite's pinned tests against $bootstrap"
  "$COMPAT_DIR/$suite/run.sh" "$bootstrap" --allowed >"$workdir/$suite.out" 2>"$workdir/$suite.err" &
  child=$!
  wait "$child"
  rc=$?
  child=
  passed=$(grep -c '^PASS ' "$workdir/$suite.out")
  failed=$(grep -c '^FAIL ' "$workdir/$suite.out")
  grep '^FAIL ' "$workdir/$suite.out"
  allowed=$(grep -cvE '^[[:space:]]*(#|$)' "$COMPAT_DIR/$suite/tests.allow")
  if ((passed < allowed && failed == 0)) || ((rc != 0 && failed == 0)); then
    echo "FAIL $suite: exited $rc with $passed of $allowed pinned tests passed"
    failed=$((allowed - passed))
    ((failed == 0)) && failed=1
  fi
  if ((failed > 0)); then
    echo "--- $suite stderr (last 20 lines) ---"
    tail -20 "$workdir/$suite.err"
  fi
  echo "$suite peer suite: $passed passed, $failed failed in $((SECONDS - start)) s"
  total_passed=$((total_passed + passed))
  total_failed=$((total_failed + failed))
done

summary="$total_passed passed, $total_failed failed"
echo "$summary"
# A caller that prints more after this (kafka-reference/run.sh) repeats the line last.
[[ -n ${COMPAT_SUMMARY_FILE:-} ]] && echo "$summary" >"$COMPAT_SUMMARY_FILE"
((total_failed == 0))
