#!/usr/bin/env bash
# Runs franz-go's own pkg/kgo integration tests against a broker, one test per
# process: run.sh <bootstrap> [--all|--allowed|Test...]
#   --all      every integration test of the pinned franz-go (the default)
#   --allowed  only the tests listed in compat-tests/kgo/tests.allow; exits
#              non-zero if any of them does not pass (what CI pins)
#   Test...    only these tests (e.g. TestTxnEtl), as --all does; besides the integration
#              tests also kgo's env-gated ones (TestSCRAMAuth with KGO_TEST_SCRAM_SEEDS)
# Prints `PASS <Test>`, `FAIL <Test> <reason>` or `SKIP <Test> <reason>` per
# test on stdout (durations go to stderr) and ends with
# `N passed, M failed, K skipped`. Full output of each test
# goes to .cache/kgo/logs/<run id>/<Test>.log (the path is printed on stderr).
#
# Environment (defaults in brackets):
#   KGO_TEST_TIMEOUT_S  bound on one top-level test                        [120]
#   KGO_TEST_RECORDS    records of the group, transaction and share ETL tests;
#                       franz-go's own default, 500000, takes many minutes [20000]
#   KGO_LOG_LEVEL       client log level in the per-test logs (info|debug|none) [info]
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

usage() { echo "usage: run.sh <bootstrap> [--all|--allowed|Test...]" >&2; exit 2; }
[[ $# -ge 1 ]] || usage
bootstrap=$1
shift
mode=${1:---all}
named=()
if [[ $mode == Test* ]]; then
  named=("$@")
  mode=--named
elif [[ $# -gt 1 || ( $mode != --all && $mode != --allowed ) ]]; then
  usage
fi

KGO_CACHE="$CACHE_DIR/kgo"
allow_file="$COMPAT_DIR/kgo/tests.allow"
test_timeout_s=${KGO_TEST_TIMEOUT_S:-120}

"$COMPAT_DIR/kgo/install.sh" || die "installing the kgo tests failed"

if [[ $mode == --allowed ]]; then
  [[ -f $allow_file ]] || die "no $allow_file"
  # One test name per line; '#' starts a comment.
  mapfile -t tests < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$allow_file" | grep -v '^$')
  # A name that is not an integration test of the pinned version would
  # otherwise "pass" by running nothing.
  for t in "${tests[@]}"; do
    grep -qx "$t" "$KGO_CACHE/integration-tests" || die "$t in tests.allow is not a kgo integration test of franz-go $(cat "$KGO_CACHE/version")"
  done
elif [[ $mode == --named ]]; then
  tests=("${named[@]}")
  # Named tests may also be the ones that find their broker through other variables than
  # KGO_SEEDS (TestSCRAMAuth and TestSCRAMAuthBadCredentials: KGO_TEST_SCRAM_SEEDS), which
  # the integration list leaves out; they must still be tests of the binary.
  for t in "${tests[@]}"; do
    grep -qx "$t" "$KGO_CACHE/integration-tests" \
      || "$KGO_CACHE/kgo.test" -test.list "^${t}\$" 2>/dev/null | grep -qx "$t" \
      || die "$t is not a kgo test of franz-go $(cat "$KGO_CACHE/version")"
  done
else
  mapfile -t tests <"$KGO_CACHE/integration-tests"
fi

run_id=$(date -u +%Y%m%dT%H%M%SZ)-$$
log_dir="$KGO_CACHE/logs/$run_id"
mkdir -p "$log_dir"
# Keep the logs of the last 20 runs only; each --all run writes a few MB.
ls -1dt "$KGO_CACHE/logs"/*/ 2>/dev/null | tail -n +21 | xargs -r rm -rf
log "franz-go $(cat "$KGO_CACHE/version"): ${#tests[@]} tests against $bootstrap ($mode), logs in $log_dir"

# The first message of the first failed (sub)test, or of a skipped test: go
# test -v names the running test in `=== RUN|CONT|NAME  <test>` lines, so each
# `file_test.go:N: message` line is credited to the test above it, and the
# result lines (`--- FAIL: <test>`) say which tests failed. Messages of skipped
# subtests and the helpers' routine log lines are not reasons.
first_message() {
  local file=$1 result=$2
  awk -v want="$result" '
    $1 == "===" { cur = $3; next }
    /^[ \t]+[A-Za-z0-9_]+_test\.go:[0-9]+: / {
      if ($0 ~ /deleting (topic|group)|NOT DELETING|unable to delete|writes (succeeded|failed):|completed in /) next
      line = $0; sub(/^[ \t]+/, "", line)
      if (!(cur in msg)) { msg[cur] = line; order[++n] = cur }
      next
    }
    $1 == "---" && $2 == want":" { failed[$3] = 1 }
    END {
      # The deepest failed test names the cause; its parents only inherit it.
      best = ""
      for (i = 1; i <= n; i++) {
        t = order[i]
        if ((t in failed) && length(t) > length(best)) best = t
      }
      if (best != "") print msg[best]
    }' "$file"
}

failure_reason() {
  local file=$1 line
  line=$(grep -m1 -E '^panic: test timed out after' "$file") && { echo "timeout: ${line#panic: }"; return; }
  line=$(grep -m1 -E '^panic: ' "$file") && { echo "$line"; return; }
  line=$(first_message "$file" FAIL)
  [[ -n $line ]] && { echo "$line"; return; }
  echo "exit status $2, no message; see $file"
}

passed=0 failed=0 skipped=0
start_s=$SECONDS

# Without a listener every test would spend 10 s in the helpers' ApiVersions
# retry before panicking; say it once per test and stop.
first_seed=${bootstrap%%,*}
if ! (exec 3<>"/dev/tcp/${first_seed%:*}/${first_seed##*:}") 2>/dev/null; then
  for t in "${tests[@]}"; do echo "FAIL $t nothing listens on $first_seed"; done
  echo "0 passed, ${#tests[@]} failed, 0 skipped"
  exit 1
fi

for t in "${tests[@]}"; do
  out="$log_dir/$t.log"
  t0=$SECONDS
  # -test.timeout makes the binary dump its goroutines and exit; the outer
  # timeout is a backstop for a process that cannot even do that.
  (cd "$log_dir" && KGO_SEEDS=$bootstrap KGO_TEST_RF=1 KGO_TEST_RECORDS=${KGO_TEST_RECORDS:-20000} \
    KGO_LOG_LEVEL=${KGO_LOG_LEVEL:-info} \
    timeout --kill-after=10 $((test_timeout_s + 30)) "$KGO_CACHE/kgo.test" \
    -test.run "^${t}\$" -test.timeout "${test_timeout_s}s" -test.count=1 -test.v) >"$out" 2>&1 </dev/null
  rc=$?
  took=$((SECONDS - t0))
  if [[ $rc -eq 0 ]] && grep -q -E "^--- PASS: ${t} " "$out"; then
    log "$t passed in ${took}s"
    echo "PASS $t"
    passed=$((passed + 1))
  elif [[ $rc -eq 0 ]] && grep -q -E "^--- SKIP: ${t} " "$out"; then
    reason=$(first_message "$out" SKIP)
    log "$t skipped in ${took}s"
    echo "SKIP $t $reason"
    skipped=$((skipped + 1))
  else
    [[ $rc -eq 124 || $rc -eq 137 ]] && ! grep -q '^panic: test timed out' "$out" \
      && echo "panic: test timed out after ${test_timeout_s}s (killed by the outer timeout)" >>"$out"
    log "$t failed in ${took}s"
    echo "FAIL $t $(failure_reason "$out" "$rc" | cut -c1-300)"
    failed=$((failed + 1))
  fi
done
log "ran ${#tests[@]} tests in $((SECONDS - start_s))s"
echo "$passed passed, $failed failed, $skipped skipped"

# Under --allowed every listed test must pass: a skip means the broker no
# longer advertises what the test needs, which is a regression too.
if [[ $mode == --allowed ]]; then
  ((failed == 0 && skipped == 0))
else
  ((failed == 0))
fi
