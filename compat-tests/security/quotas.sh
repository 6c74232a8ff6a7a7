#!/usr/bin/env bash
# Client quotas through Kafka's own kafka-configs.sh (issue 31):
#   quotas.sh ours --bin <broker binary>
#   quotas.sh kafka            (Apache Kafka 4.4, as kafka-reference/start.sh starts it)
#
# Starts one broker with a PLAINTEXT listener on $QUOTA_PORT (26292; Kafka's controller on
# 26293), then with kafka-configs.sh: sets producer_byte_rate=1024 on user alice and reads it
# back, sets default-user and client-id quotas and an IP's connection_creation_rate, removes
# alice's quota again, and checks that an unknown key is refused. Then a producer
# (kafka-producer-perf-test, client.id quota-perf) above a 200 KB/s producer_byte_rate must
# see throttling (producer-metrics produce-throttle-time-max > 0).
#
# Prints "PASS <check>" / "FAIL <check>: <why>" per check, ends with "<passed> passed,
# <failed> failed" and exits non-zero on any failure. Every tool run is bounded by
# CLIENT_TIMEOUT_S (60). Ports 26292-26296 are this script's, so it runs beside the others.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/../lib.sh"

usage() { echo "usage: quotas.sh ours --bin <broker binary> | quotas.sh kafka" >&2; exit 2; }
broker=${1:-}
shift || true
bin=
case "$broker" in
  ours)
    [[ ${1:-} == --bin && -n ${2:-} ]] || usage
    bin=$2
    [[ -x $bin ]] || die "broker binary $bin is not executable"
    ;;
  kafka) ;;
  *) usage ;;
esac

: "${QUOTA_PORT:=26292}"
: "${CLIENT_TIMEOUT_S:=60}"
: "${READY_TIMEOUT_S:=90}"
export CONTROLLER_PORT=$((QUOTA_PORT + 1))
BS=127.0.0.1:$QUOTA_PORT
CLI="$COMPAT_DIR/kafka-cli.sh"
PY="$VENV_DIR/bin/python"
export KAFKA_CLI_JAVA_OPTS=${KAFKA_CLI_JAVA_OPTS:--XX:TieredStopAtLevel=1 -XX:+UseSerialGC}
compgen -G "$KAFKA_LIBS/kafka_2.13-*.jar" >/dev/null || die "no Kafka jars in $KAFKA_LIBS; run compat-tests/install.sh kafka"

work=$(mktemp -d /tmp/compat-quotas.XXXXXX)
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
  [[ ${SEC_KEEP:-0} == 1 ]] && log "kept $work" || rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

passed=0
failed=0
pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() {
  echo "FAIL $1: $(tr -s '\n\t' '  ' <<<"$2" | cut -c1-600)"
  failed=$((failed + 1))
}
abort() { fail "$1" "$2"; echo "$passed passed, $failed failed"; exit 1; }

start_ours() {
  mkdir -p "$data"
  {
    echo "listeners=PLAINTEXT://127.0.0.1:$QUOTA_PORT"
    echo "log.dirs=$data/logs"
    echo "metrics.listen.address=127.0.0.1:0"
  } >"$work/server.properties"
  setsid "$bin" "$work/server.properties" >"$work/broker.log" 2>&1 </dev/null &
  broker_pid=$!
  local deadline=$((SECONDS + READY_TIMEOUT_S))
  while ((SECONDS < deadline)); do
    kill -0 "$broker_pid" 2>/dev/null || abort broker.start "$bin exited: $(tail -1 "$work/broker.log")"
    if ss -Hltn "( sport = :$QUOTA_PORT )" | grep -q . \
      && timeout 10 "$PY" "$here/client.py" ready "$BS" 5 >/dev/null 2>&1; then
      return
    fi
    sleep 0.3
  done
  abort broker.start "not ready on $BS within ${READY_TIMEOUT_S} s"
}

start_kafka() {
  "$COMPAT_DIR/kafka-reference/start.sh" "$QUOTA_PORT" "$data" >"$work/start.out" \
    || abort broker.start "Apache Kafka did not start: $(tail -1 "$data/kafka.out" 2>/dev/null)"
}

configs() { # configs <out file> <kafka-configs args>...
  local out=$1
  shift
  timeout -k 5 "$CLIENT_TIMEOUT_S" "$CLI" kafka-configs --bootstrap-server "$BS" "$@" >"$out" 2>&1 </dev/null
}

if [[ $broker == ours ]]; then start_ours; else start_kafka; fi
log "broker ($broker) ready on $BS"
out=$work/out

# 1. The issue's example: a user's producer_byte_rate, set and described.
if configs "$out" --alter --add-config 'producer_byte_rate=1024' --entity-type users --entity-name alice; then
  pass quota.alter.user
else
  fail quota.alter.user "$(tail -3 "$out")"
fi
if configs "$out" --describe --entity-type users --entity-name alice \
  && grep -q "producer_byte_rate=1024" "$out"; then
  pass quota.describe.user
else
  fail quota.describe.user "no producer_byte_rate=1024 in: $(cat "$out")"
fi

# 2. The default user, a client id, a (user, client id) pair and an IP.
ok=1
configs "$out" --alter --add-config 'consumer_byte_rate=2048,request_percentage=50' --entity-type users --entity-default || ok=0
configs "$out" --alter --add-config 'producer_byte_rate=4096' --entity-type clients --entity-name app || ok=0
configs "$out" --alter --add-config 'controller_mutation_rate=10' --entity-type users --entity-name alice --entity-type clients --entity-name app || ok=0
configs "$out" --alter --add-config 'connection_creation_rate=5' --entity-type ips --entity-name 10.0.0.7 || ok=0
if ((ok)); then pass quota.alter.entities; else fail quota.alter.entities "$(tail -3 "$out")"; fi
if configs "$out" --describe --entity-type users --entity-default \
  && grep -q "consumer_byte_rate=2048" "$out" && grep -q "request_percentage=50" "$out"; then
  pass quota.describe.default-user
else
  fail quota.describe.default-user "$(cat "$out")"
fi
if configs "$out" --describe --entity-type clients --entity-name app && grep -q "producer_byte_rate=4096" "$out"; then
  pass quota.describe.client
else
  fail quota.describe.client "$(cat "$out")"
fi
if configs "$out" --describe --entity-type users --entity-name alice --entity-type clients --entity-name app \
  && grep -q "controller_mutation_rate=10" "$out"; then
  pass quota.describe.user-client
else
  fail quota.describe.user-client "$(cat "$out")"
fi
if configs "$out" --describe --entity-type ips --entity-name 10.0.0.7 && grep -q "connection_creation_rate=5" "$out"; then
  pass quota.describe.ip
else
  fail quota.describe.ip "$(cat "$out")"
fi

# 3. Removal.
if configs "$out" --alter --delete-config producer_byte_rate --entity-type users --entity-name alice \
  && configs "$out" --describe --entity-type users --entity-name alice \
  && ! grep -q "producer_byte_rate" "$out"; then
  pass quota.delete
else
  fail quota.delete "$(cat "$out")"
fi

# 4. An unknown key is refused (by the tool or the broker), not stored.
if configs "$out" --alter --add-config 'producer_byte_ratex=1' --entity-type users --entity-name bob; then
  fail quota.refuse-unknown-key "accepted: $(cat "$out")"
else
  pass quota.refuse-unknown-key
fi

# 5. Throttling seen by a real producer: 1.5 MB at full speed against 200 KB/s.
topic=quota-perf
timeout -k 5 "$CLIENT_TIMEOUT_S" "$CLI" kafka-topics --bootstrap-server "$BS" --create --topic "$topic" \
  --partitions 1 --replication-factor 1 >"$out" 2>&1 </dev/null || true
configs "$out" --alter --add-config 'producer_byte_rate=200000' --entity-type clients --entity-name quota-perf
if timeout -k 5 90 "$CLI" kafka-producer-perf-test --topic "$topic" --num-records 3000 --record-size 1000 \
  --throughput -1 --print-metrics --producer-props "bootstrap.servers=$BS" client.id=quota-perf acks=1 \
  >"$out" 2>&1 </dev/null; then
  max=$(grep -E "producer-metrics:produce-throttle-time-max:\{client-id=quota-perf\}" "$out" | awk '{print $NF}' | head -1)
  if [[ -n $max ]] && awk -v m="$max" 'BEGIN { exit !(m > 0) }'; then
    pass "quota.throttled (produce-throttle-time-max $max ms)"
  else
    fail quota.throttled "produce-throttle-time-max is '${max:-missing}'"
  fi
else
  fail quota.throttled "kafka-producer-perf-test failed: $(tail -3 "$out")"
fi

echo "$passed passed, $failed failed"
((failed == 0))
