#!/usr/bin/env bash
# Validates the suites against Apache Kafka itself: run.sh [port] [--perf]
# Installs everything, starts the reference broker on 127.0.0.1:<port> (default
# 19092, so it never collides with our broker on 9092) in a temporary data
# directory, runs run-ci.sh (and perf.sh with --perf), and always stops the
# broker and removes the data directory on the way out.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

port=19092
with_perf=0
for arg in "$@"; do
  case "$arg" in
    --perf) with_perf=1 ;;
    *) port=$arg ;;
  esac
done

"$COMPAT_DIR/install.sh" all || die "install failed"

datadir=$(mktemp -d)
child=
cleanup() {
  [[ -n $child ]] && kill -TERM "$child" 2>/dev/null
  "$COMPAT_DIR/kafka-reference/stop.sh" "$datadir" || true
  rm -rf "$datadir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM


"$COMPAT_DIR/kafka-reference/start.sh" "$port" "$datadir" >/dev/null || die "reference Kafka did not start"

rc=0
if ((with_perf)); then
  step "$COMPAT_DIR/perf.sh" "127.0.0.1:$port" || rc=1
fi
summary_file="$datadir/summary"
COMPAT_SUMMARY_FILE="$summary_file" step "$COMPAT_DIR/run-ci.sh" "127.0.0.1:$port" || rc=1
summary=$(cat "$summary_file" 2>/dev/null || echo "0 passed, 1 failed")
# Stop the broker now rather than in the trap, so that the closing
# "N passed, N failed" line is printed after the broker's shutdown log.
cleanup
trap - EXIT
echo "$summary"
exit $rc
