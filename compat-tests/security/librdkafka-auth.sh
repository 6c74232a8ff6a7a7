#!/usr/bin/env bash
# librdkafka's authorization tests (issue 31):
#   librdkafka-auth.sh ours --bin <broker binary>
#   librdkafka-auth.sh kafka                    (Apache Kafka 4.4, as kafka-reference/start.sh starts it)
#
# 0115_producer_auth and 0119_consumer_auth add a DENY ACL for User:* on a topic (and a group)
# with kafka-acls.sh, then expect the producer's delivery reports and the consumer's errors to
# say TOPIC_AUTHORIZATION_FAILED / GROUP_AUTHORIZATION_FAILED rather than hang. They run on a
# plaintext listener without authentication (they skip themselves when the cluster needs it), so
# the broker here has one PLAINTEXT listener on $AUTH_PORT (26392; Kafka's controller on 26393)
# with authorizer.class.name=StandardAuthorizer and allow.everyone.if.no.acl.found=true: every
# anonymous client may do anything until the test's DENY.
#
# Prints librdkafka/run.sh's "PASS <test>" / "FAIL <test> <reason>" lines, ends with "<passed>
# passed, <failed> failed" and exits non-zero on any failure. Needs install.sh kafka python
# librdkafka. AUTH_KEEP=1 keeps the work directory.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/../lib.sh"

usage() { echo "usage: librdkafka-auth.sh ours --bin <broker binary> | librdkafka-auth.sh kafka" >&2; exit 2; }
broker=${1:-}
shift || true
bin=
case "$broker" in
  ours)
    [[ ${1:-} == --bin && -n ${2:-} ]] || usage
    bin=$2
    [[ -x $bin ]] || die "broker binary $bin is not executable"
    ;;
  kafka) [[ $# -eq 0 ]] || usage ;;
  *) usage ;;
esac

AUTH_PORT=${AUTH_PORT:-26392}
export CONTROLLER_PORT=${CONTROLLER_PORT:-26393}
READY_TIMEOUT_S=${READY_TIMEOUT_S:-90}
export READY_TIMEOUT_S
HOST=127.0.0.1
PY="$VENV_DIR/bin/python"
TESTS=(0115 0119)

[[ $broker == kafka || -x $PY ]] || die "python venv missing; run compat-tests/install.sh python"
compgen -G "$KAFKA_LIBS/kafka_2.13-*.jar" >/dev/null || die "no Kafka jars in $KAFKA_LIBS; run compat-tests/install.sh kafka"

work=$(mktemp -d /tmp/compat-rdkafka-auth.XXXXXX)
data=$work/data
broker_pid=
cleanup() {
  local status=$?
  if [[ $broker == kafka ]]; then
    "$COMPAT_DIR/kafka-reference/stop.sh" "$data" >/dev/null 2>&1 || true
  elif [[ -n $broker_pid ]] && kill -0 "$broker_pid" 2>/dev/null; then
    kill -TERM "$broker_pid" 2>/dev/null
    local deadline=$((SECONDS + 15))
    while kill -0 "$broker_pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
    kill -KILL "$broker_pid" 2>/dev/null || true
  fi
  if [[ ${AUTH_KEEP:-0} == 1 ]]; then log "kept $work"; else rm -rf "$work"; fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

not_started() {
  local t
  for t in "${TESTS[@]}"; do echo "FAIL $t broker did not start: $1"; done
  echo "0 passed, ${#TESTS[@]} failed"
  exit 1
}

# num.partitions=4: librdkafka's harness assumes it (its tests produce to partitions 1..3).
properties() {
  cat <<PROPS
listeners=PLAINTEXT://$HOST:$AUTH_PORT${1:-}
advertised.listeners=PLAINTEXT://$HOST:$AUTH_PORT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=true
num.partitions=4
PROPS
}

if [[ $broker == kafka ]]; then
  KAFKA_EXTRA_PROPERTIES=$(properties ",CONTROLLER://$HOST:$CONTROLLER_PORT") \
    "$COMPAT_DIR/kafka-reference/start.sh" "$AUTH_PORT" "$data" >"$work/start.out" \
    || not_started "$(tail -1 "$data/kafka.out" 2>/dev/null)"
else
  mkdir -p "$data"
  {
    echo "log.dirs=$data/logs"
    echo "group.initial.rebalance.delay.ms=0"
    echo "metrics.listen.address=127.0.0.1:0"
    properties
  } >"$work/server.properties"
  setsid "$bin" "$work/server.properties" >"$work/broker.log" 2>&1 </dev/null &
  broker_pid=$!
  deadline=$((SECONDS + READY_TIMEOUT_S))
  until timeout 10 "$PY" "$here/client.py" ready "$HOST:$AUTH_PORT" 5 >/dev/null 2>&1; do
    kill -0 "$broker_pid" 2>/dev/null || not_started "$(grep -v '^\s*$' "$work/broker.log" | tail -1)"
    ((SECONDS < deadline)) || not_started "no metadata within ${READY_TIMEOUT_S} s"
    sleep 0.3
  done
fi
log "$broker broker with an authorizer on $HOST:$AUTH_PORT"

# 0119 consumes for 15 s and runs kafka-acls.sh four times inside its own 20 s timeout: a
# multiplier of 2 gives the JVM tool runs room (librdkafka's harness adds 2 itself under CI=...).
echo "test.timeout.multiplier=2" >"$work/extra.conf"
# Quick mode (-Q) would skip their sub-tests; they are short without it.
QUICK=0 RDKAFKA_TEST_CONF_EXTRA="$work/extra.conf" "$COMPAT_DIR/librdkafka/run.sh" "$HOST:$AUTH_PORT" "${TESTS[@]}"
