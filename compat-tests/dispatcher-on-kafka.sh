#!/usr/bin/env bash
# The dispatcher's integration tests against Apache Kafka 4.4 (issue 7: the
# dispatcher must behave the same in front of any Kafka): starts the
# reference Kafka (kafka-reference/start.sh, jars from install.sh kafka), runs
# the queue, forwarding and two-instance kill -9 tests against it through
# DISPATCHER_TEST_BOOTSTRAP, and stops it.
#   compat-tests/dispatcher-on-kafka.sh [extra cargo test args]
# Port 29592 (below the ephemeral range, so no outgoing connection holds it);
# KAFKA_PORT overrides. Honours CARGO_TARGET_DIR.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$COMPAT_DIR/.."

port=${KAFKA_PORT:-29592}
bash "$COMPAT_DIR/install.sh" kafka
data=$(mktemp -d)
stop() {
  bash "$COMPAT_DIR/kafka-reference/stop.sh" "$data" >/dev/null 2>&1 || true
  rm -rf "$data"
}
trap stop EXIT
bash "$COMPAT_DIR/kafka-reference/start.sh" "$port" "$data" >/dev/null
log "reference Kafka on 127.0.0.1:$port; the dispatcher's tests against it"
if ! DISPATCHER_TEST_BOOTSTRAP="127.0.0.1:$port" \
  cargo test -p dispatcher-sidecar --test queue --test forward --test crash "$@"; then
  tail -n 40 "$data/server.log" || true
  exit 1
fi
