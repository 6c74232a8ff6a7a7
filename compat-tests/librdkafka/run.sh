#!/usr/bin/env bash
# Runs librdkafka's own test suite (tests/test-runner, built by install.sh)
# against a broker: run.sh <bootstrap> [--all|--allowed] [test ...]
#   --all      every broker test (the runner's own local/mock tests and the
#              socket-emulation tests are left out)
#   --allowed  (default) only the tests in tests.allow; exits non-zero if one fails
#   test ...   only these test numbers or names (e.g. 0001 or 0001_multiobj)
# LIBRDKAFKA_BUILD=ssl runs the OpenSSL build (SSL, SASL_SSL, SCRAM); RDKAFKA_TEST_CONF_EXTRA
# names a file of client properties added to test.conf (security/run.sh --peers uses both).
# One runner process per test number, one test at a time, each bounded by
# TEST_TIMEOUT_S (default 120), so a hang costs one test, not the run.
# Prints `PASS <test>` / `FAIL <test> <reason>` per test on stdout and ends with
# `<N> passed, <M> failed`. Skipped tests and the run's log folder go to stderr.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

RDKAFKA_DIR="$COMPAT_DIR/librdkafka"
ALLOW_FILE="${RDKAFKA_ALLOW_FILE:-$RDKAFKA_DIR/tests.allow}"
# The broker version the runner assumes, so it skips tests for features a 4.x
# broker no longer has and runs those that need newer ones.
: "${TEST_KAFKA_VERSION:=4.0.0}"
: "${TEST_TIMEOUT_S:=120}"

[[ $# -ge 1 ]] || { echo "usage: run.sh <bootstrap> [--all|--allowed] [test ...]" >&2; exit 2; }
bootstrap=$1
shift
mode=allowed
selected=()
for arg in "$@"; do
  case "$arg" in
    --all) mode=all ;;
    --allowed) mode=allowed ;;
    -*) die "unknown option $arg" ;;
    *) mode=selected; selected+=("$arg") ;;
  esac
done

"$RDKAFKA_DIR/install.sh"
# LIBRDKAFKA_BUILD=ssl: the build with OpenSSL (install.sh builds it into .cache/librdkafka-ssl).
build_dir="$CACHE_DIR/librdkafka${LIBRDKAFKA_BUILD:+-$LIBRDKAFKA_BUILD}"
tests_dir=$(echo "$build_dir"/rdkafka-sys-*/librdkafka/tests)
[[ -x "$tests_dir/test-runner" ]] || die "no test runner in $tests_dir"

# The broker tests, in the runner's order: the _TEST(<name>, <flags>, ...) entries
# of test.c without the local (mock cluster), socket-emulation and manual flags,
# which -L/-E and the absence of an explicit TESTS list make the runner skip.
all_names=$(perl -0777 -ne 'while (/_TEST\((\d{4}_\w+)\s*,\s*([^,)]*)/g) { print "$1\n" unless $2 =~ /TEST_F_(LOCAL|SOCKEM|MANUAL)/ }' \
  "$tests_dir/test.c")

# wanted: the names whose results count; numbers: the runner invocations.
case "$mode" in
  all) wanted=$all_names ;;
  allowed)
    [[ -f "$ALLOW_FILE" ]] || die "no $ALLOW_FILE"
    # "<test> full" runs that test's number without quick mode (see below).
    selected=($(sed -e 's/#.*//' "$ALLOW_FILE" | awk 'NF {print $1}'))
    full_numbers=$(sed -e 's/#.*//' "$ALLOW_FILE" | awk '$2 == "full" {print substr($1, 1, 4)}')
    ;;
esac
if [[ "$mode" != all ]]; then
  wanted=$(for t in "${selected[@]}"; do
    if [[ "$t" =~ ^[0-9]{4}$ ]]; then grep -E "^${t}_" <<<"$all_names" || echo "$t"; else echo "$t"; fi
  done)
fi
numbers=$(cut -c1-4 <<<"$wanted" | awk '!seen[$0]++')

run_dir="$CACHE_DIR/librdkafka/runs/$(date -u +%Y%m%dT%H%M%S)-$$"
mkdir -p "$run_dir"
log "logs in $run_dir (TEST_KAFKA_VERSION=$TEST_KAFKA_VERSION, TEST_TIMEOUT_S=$TEST_TIMEOUT_S)"

# The runner reads its client configuration from test.conf; one per run, so
# that runs against two brokers at once do not overwrite each other's.
cat >"$run_dir/test.conf" <<CONF
bootstrap.servers=$bootstrap
# Random topic names, so that reruns never meet topics an earlier run left.
test.topic.random=true
CONF
# RDKAFKA_TEST_CONF_EXTRA: a file of more client properties for every test (e.g.
# security.protocol=SASL_SSL, sasl.mechanism, sasl.username, sasl.password,
# ssl.ca.location), as security/run.sh --peers writes it.
if [[ -n ${RDKAFKA_TEST_CONF_EXTRA:-} ]]; then
  [[ -f $RDKAFKA_TEST_CONF_EXTRA ]] || die "no RDKAFKA_TEST_CONF_EXTRA file $RDKAFKA_TEST_CONF_EXTRA"
  cat "$RDKAFKA_TEST_CONF_EXTRA" >>"$run_dir/test.conf"
  log "test.conf adds $(grep -v '^#' "$RDKAFKA_TEST_CONF_EXTRA" | sed -E 's/(password)=.*/\1=***/' | paste -sd' ')"
fi

# Some tests create topics with Kafka's kafka-topics.sh or ACLs with kafka-acls.sh
# ($KAFKA_PATH/bin, broker list in $BROKERS). When `install.sh kafka` has resolved
# Kafka's jars, a bin/ of scripts that run kafka-cli.sh stands in for a Kafka distribution.
runner_env=()
if compgen -G "$KAFKA_LIBS/kafka_2.13-*.jar" >/dev/null; then
  mkdir -p "$run_dir/kafka-path/bin"
  # kafka-acls.sh: the auth tests (0115, 0119) add DENY ACLs with it.
  for tool in kafka-topics kafka-acls; do
    printf '#!/usr/bin/env bash\nexec "%s/kafka-cli.sh" %s "$@"\n' "$COMPAT_DIR" "$tool" \
      >"$run_dir/kafka-path/bin/$tool.sh"
    chmod +x "$run_dir/kafka-path/bin/$tool.sh"
  done
  # Tests with a Java peer (0098_consumer_txn's TransactionProducerCli) compile it against
  # $KAFKA_PATH/libs/kafka-clients-*.jar and run it with bin/kafka-run-class.sh, which
  # gets the class's folder in CLASSPATH.
  ln -sfn "$KAFKA_LIBS" "$run_dir/kafka-path/libs"
  printf '#!/usr/bin/env bash\nexec java -cp "${CLASSPATH:+$CLASSPATH:}%s/*" "$@"\n' "$KAFKA_LIBS" \
    >"$run_dir/kafka-path/bin/kafka-run-class.sh"
  chmod +x "$run_dir/kafka-path/bin/kafka-run-class.sh"
  runner_env=(KAFKA_PATH="$run_dir/kafka-path" BROKERS="$bootstrap")
else
  log "no Kafka jars (install.sh kafka): tests that run kafka-topics.sh will fail"
fi

# Quick mode (-Q) shrinks message counts, and also skips every sub-test not
# marked SUB_TEST_QUICK, which leaves some tests empty. QUICK=0 drops -Q for
# all tests; full_numbers (from "<test> full" in tests.allow) for some.
: "${QUICK:=1}"
full_numbers=${full_numbers:-}

# One runner process per test number. PARALLEL (default 1) > 1 runs that many
# numbers at once: quicker for --all, where most time is spent waiting on
# tests that hang, but timing-sensitive tests then see a busier machine.
: "${PARALLEL:=1}"
run_number() {
  local num=$1 out="$run_dir/$1.log" start_s=$SECONDS rc quick=-Q
  if [[ "$QUICK" == 0 ]] || grep -qx "$num" <<<"$full_numbers"; then quick=; fi
  # -L: no local (mock cluster) tests; -E: no socket emulation; -Q: quick mode;
  # -p1: one test at a time. The runner exits non-zero when a test failed.
  # The subshell's stderr is dropped so that bash's "Aborted" notice for a
  # runner that gave up (it aborts on a failed assertion) stays out of the output.
  rc=0
  (
    cd "$tests_dir" && env "${runner_env[@]}" TESTS="$num" RDKAFKA_TEST_CONF="$run_dir/test.conf" \
      TEST_KAFKA_VERSION="$TEST_KAFKA_VERSION" LD_LIBRARY_PATH="../src:../src-cpp" \
      timeout -k 10 "$TEST_TIMEOUT_S" ./test-runner -L -E $quick -p1 >"$out" 2>&1
    exit $?
  ) 2>/dev/null || rc=$?
  echo "$rc" >"$run_dir/$num.rc"
  log "$num done in $((SECONDS - start_s)) s (runner exit $rc${quick:+, quick mode})"
}

for num in $numbers; do
  while (($(jobs -rp | wc -l) >= PARALLEL)); do wait -n || true; done
  run_number "$num" &
done
wait

# The runner reports a failure as '### Test "<name>[ (<sub-test>)]" failed at
# <file:line>: ###' followed by the message.
# One sed reads the whole log (no early `q`): under pipefail, a reader that quits
# first would fail the pipe with SIGPIPE, and set -e would end the run silently.
failure_message() {
  sed -nE 's/\x1b\[[0-9;]*m//g; /^### Test "'"$1"'[" ]/{n; s/\x1b\[[0-9;]*m//g; p}' "$2" | head -c 240 | head -n 1 || true
}

passed=0 failed=0 skipped=0
declare -A state reason
for num in $numbers; do
  out="$run_dir/$num.log"
  rc=$(cat "$run_dir/$num.rc")
  # The summary table: "| <name> | <STATE> | <seconds>s | <reason>", after removing colours.
  while IFS='|' read -r name st rest; do
    state[$name]=$st
    reason[$name]=$rest
  done < <(sed -E 's/\x1b\[[0-9;]*m//g' "$out" |
    sed -nE 's/^\|\s*([0-9]{4}_[A-Za-z0-9_]+)\s*\|\s*([A-Z ]+[A-Z])\s*\|\s*[0-9.]+s\s*\|\s*(.*)$/\1|\2|\3/p')
  for name in $(grep -E "^${num}" <<<"$wanted"); do
    # Quick mode (-Q) skips every sub-test not marked SUB_TEST_QUICK without a
    # word, so a test made only of such sub-tests "passes" having done nothing.
    # The runner prints "[<name> / <s>] [ <sub-test> ]" when a sub-test starts.
    # (No `grep -q` at the end of a pipe: under pipefail its early exit fails the pipe.)
    if [[ "${state[$name]:-}" == PASSED ]] && grep -q 'Test mode *: quick' "$out" &&
      grep -qs 'SUB_TEST' "$tests_dir/$num"-*.c* &&
      ! sed -E 's/\x1b\[[0-9;]*m//g' "$out" | grep -E "^\[${name} */ *[0-9.]+s\] \[ " >/dev/null; then
      state[$name]=SKIPPED reason[$name]="quick mode ran none of its sub-tests"
    fi
    if [[ -z "${state[$name]:-}" ]]; then
      # No summary line: the runner hung, crashed or skipped the test silently.
      if ((rc == 124 || rc == 137)) && [[ -z "$(failure_message "$name" "$out")" ]]; then
        state[$name]=FAILED reason[$name]="timeout after ${TEST_TIMEOUT_S}s (runner killed)"
      elif grep -qE "Test ${name} PASSED" "$out"; then
        state[$name]=PASSED
      elif grep -qE "Test ${name} FAILED" "$out" || ((rc != 0)); then
        state[$name]=FAILED reason[$name]="runner exit $rc: $(failure_message "$name" "$out")"
      else
        state[$name]=NOTRUN reason[$name]="not run (local-only, sockem, manual or another scenario)"
      fi
    fi
  done
done

for name in $wanted; do
  st=${state[$name]:-NOTRUN}
  why=$(tr -s ' ' <<<"${reason[$name]:-}" | sed -E 's/^ //; s/ $//')
  case "$st" in
    PASSED) echo "PASS $name"; passed=$((passed + 1)) ;;
    SKIPPED | NOTRUN)
      if [[ "$mode" == all ]]; then
        [[ "$st" == SKIPPED ]] && log "SKIP $name ${why}"
        skipped=$((skipped + 1))
      else
        # A test that is asked for must run: a skip means the setup changed.
        echo "FAIL $name skipped: ${why:-not run}"; failed=$((failed + 1))
      fi
      ;;
    *) echo "FAIL $name ${st}: ${why:-see $run_dir/${name:0:4}.log}"; failed=$((failed + 1)) ;;
  esac
done
log "$skipped skipped or not applicable; logs in $run_dir"
echo "$passed passed, $failed failed"
((failed == 0))
