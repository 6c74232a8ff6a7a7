#!/usr/bin/env bash
# ACL authorization through Kafka's own tools (issue 31):
#   acls.sh ours --bin <broker binary> [--matrix]
#   acls.sh kafka [--matrix]               (Apache Kafka 4.4, as kafka-reference/start.sh starts it)
#
# One broker with authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer,
# super.users=User:admin;User:ANONYMOUS (ANONYMOUS: the broker's own PLAINTEXT inter-broker and
# controller principal, as a KRaft cluster with an authorizer needs) and two listeners on loopback:
#   PLAINTEXT       $PLAINTEXT_PORT      (26192)  readiness only
#   SASL_PLAINTEXT  $SASL_PLAINTEXT_PORT (26193)  PLAIN users admin, alice, bob
#   (Kafka's controller on $CONTROLLER_PORT, 26196)
# Then, over SASL with --command-config: kafka-acls.sh as an unauthorized user (refused), the
# console producer and consumer and kafka-topics.sh as bob and alice before their ACLs (each
# refusal checked for Kafka's exception), kafka-acls.sh --add --producer / --consumer /
# --resource-pattern-type prefixed / --deny-principal as admin, the same clients again
# (N records each way), a DENY beating the ALLOW, topics hidden from an unauthorized
# kafka-topics --list, kafka-acls --list and --remove.
#
# --matrix instead runs acl_matrix.py on the same broker: per API, the resource operation
# Kafka checks, bob refused with Kafka's error before an ACL and served after (confluent-kafka's
# AdminClient, Producer and Consumer).
#
# Prints "PASS <check>" / "FAIL <check>: <why>" per check, ends with "<passed> passed,
# <failed> failed" and exits non-zero on any failure. ACL_KEEP=1 keeps the work directory.
set -uo pipefail
: "${N:=50}"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/../lib.sh"

usage() { echo "usage: acls.sh ours --bin <broker binary> [--matrix] | acls.sh kafka [--matrix]" >&2; exit 2; }
broker=${1:-}
shift || true
bin=
case "$broker" in
  ours)
    [[ ${1:-} == --bin && -n ${2:-} ]] || usage
    bin=$2
    shift 2
    [[ -x $bin ]] || die "broker binary $bin is not executable"
    ;;
  kafka) ;;
  *) usage ;;
esac
matrix=0
case "${1:-}" in
  --matrix) matrix=1 ;;
  "") ;;
  *) usage ;;
esac

PLAINTEXT_PORT=${PLAINTEXT_PORT:-26192}
SASL_PLAINTEXT_PORT=${SASL_PLAINTEXT_PORT:-26193}
export CONTROLLER_PORT=${CONTROLLER_PORT:-26196}
CLIENT_TIMEOUT_S=${CLIENT_TIMEOUT_S:-60}
READY_TIMEOUT_S=${READY_TIMEOUT_S:-90}
export READY_TIMEOUT_S

HOST=127.0.0.1
BS=$HOST:$SASL_PLAINTEXT_PORT
JAAS='org.apache.kafka.common.security.plain.PlainLoginModule required user_admin="admin-secret" user_alice="alice-secret" user_bob="bob-secret";'
CLI="$COMPAT_DIR/kafka-cli.sh"
PY="$VENV_DIR/bin/python"
export KAFKA_CLI_JAVA_OPTS=${KAFKA_CLI_JAVA_OPTS:--XX:TieredStopAtLevel=1 -XX:+UseSerialGC}

# Our broker's readiness probe is the security suite's python client.
[[ $broker == kafka || -x $PY ]] || die "python venv missing; run compat-tests/install.sh python"
compgen -G "$KAFKA_LIBS/kafka_2.13-*.jar" >/dev/null || die "no Kafka jars in $KAFKA_LIBS; run compat-tests/install.sh kafka"

work=$(mktemp -d /tmp/compat-acls.XXXXXX)
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
  if [[ ${ACL_KEEP:-0} == 1 ]]; then log "kept $work"; else rm -rf "$work"; fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

passed=0
failed=0
pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() {
  local name=$1
  shift
  echo "FAIL $name: $(tr -s '\n\t' '  ' <<<"$*" | sed 's/ *$//' | cut -c1-600)"
  failed=$((failed + 1))
}
abort() {
  fail "$1" "$2"
  echo "$passed passed, $failed failed"
  exit 1
}

# run <out file> <cmd>...: bounded, stdout and stderr to the file, stdin from $STDIN_FILE.
run() {
  local out=$1
  shift
  timeout -k 5 "$CLIENT_TIMEOUT_S" "$@" >"$out" 2>&1 <"${STDIN_FILE:-/dev/null}"
}

why() {
  local file=$1 line
  line=$(grep -m1 -oE '[A-Za-z.]+(Exception|Error): .*' "$file")
  [[ -z $line ]] && line=$(grep -v '^\s*$' "$file" | tail -1)
  echo "${line:0:400}"
}

# ------------------------------------------------------------------ broker

properties() {
  cat <<PROPS
listeners=PLAINTEXT://$HOST:$PLAINTEXT_PORT,SASL_PLAINTEXT://$HOST:$SASL_PLAINTEXT_PORT${1:-}
advertised.listeners=PLAINTEXT://$HOST:$PLAINTEXT_PORT,SASL_PLAINTEXT://$HOST:$SASL_PLAINTEXT_PORT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
sasl.enabled.mechanisms=PLAIN
listener.name.sasl_plaintext.plain.sasl.jaas.config=$JAAS
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:admin;User:ANONYMOUS
allow.everyone.if.no.acl.found=false
PROPS
}

start_kafka() {
  KAFKA_EXTRA_PROPERTIES=$(properties ",CONTROLLER://$HOST:$CONTROLLER_PORT") \
    "$COMPAT_DIR/kafka-reference/start.sh" "$PLAINTEXT_PORT" "$data" >"$work/start.out" \
    || { tail -20 "$data/kafka.out" >&2; abort broker.start "Apache Kafka did not start: $(tail -1 "$data/kafka.out")"; }
  broker_pid=$(tail -1 "$work/start.out")
}

start_ours() {
  mkdir -p "$data"
  {
    echo "log.dirs=$data/logs"
    echo "group.initial.rebalance.delay.ms=0"
    echo "metrics.listen.address=127.0.0.1:0"
    properties
  } >"$work/server.properties"
  setsid "$bin" "$work/server.properties" >"$work/broker.log" 2>&1 </dev/null &
  broker_pid=$!
  local deadline=$((SECONDS + READY_TIMEOUT_S))
  while ((SECONDS < deadline)); do
    if ! kill -0 "$broker_pid" 2>/dev/null; then
      tail -20 "$work/broker.log" >&2
      abort broker.start "$bin exited during startup: $(grep -v '^\s*$' "$work/broker.log" | tail -1)"
    fi
    if ss -Hltn "( sport = :$PLAINTEXT_PORT )" | grep -q . \
      && timeout 10 "$PY" "$here/client.py" ready "$HOST:$PLAINTEXT_PORT" 5 >/dev/null 2>&1; then
      log "broker $bin ready (pid $broker_pid, data $data)"
      return
    fi
    sleep 0.3
  done
  tail -20 "$work/broker.log" >&2
  abort broker.start "no metadata on PLAINTEXT within ${READY_TIMEOUT_S} s"
}

# ------------------------------------------------------------------ clients

for user in admin alice bob; do
  cat >"$work/$user.properties" <<PROPS
security.protocol=SASL_PLAINTEXT
sasl.mechanism=PLAIN
sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="$user" password="$user-secret";
PROPS
done

acls() { # acls <user> <out> <kafka-acls args>...
  local user=$1 out=$2
  shift 2
  run "$out" "$CLI" kafka-acls --bootstrap-server "$BS" --command-config "$work/$user.properties" "$@"
}

topics() { # topics <user> <out> <kafka-topics args>...
  local user=$1 out=$2
  shift 2
  run "$out" "$CLI" kafka-topics --bootstrap-server "$BS" --command-config "$work/$user.properties" "$@"
}

produce() { # produce <user> <topic> <out> [count]: N records, or count (a refused one: 1)
  local user=$1 topic=$2 out=$3 count=${4:-$N} i
  for ((i = 0; i < count; i++)); do echo "$topic-$i"; done >"$out.in"
  STDIN_FILE=$out.in run "$out" "$CLI" kafka-console-producer --bootstrap-server "$BS" \
    --producer.config "$work/$user.properties" --topic "$topic" \
    --producer-property acks=all --producer-property max.block.ms=10000 \
    --producer-property delivery.timeout.ms=15000 --producer-property request.timeout.ms=10000
}

consume() { # consume <user> <topic> <group> <out>
  local user=$1 topic=$2 group=$3 out=$4
  run "$out" "$CLI" kafka-console-consumer --bootstrap-server "$BS" \
    --consumer.config "$work/$user.properties" --topic "$topic" --group "$group" \
    --from-beginning --max-messages "$N" --timeout-ms 20000
}

# expect_refused <check> <out> <regex>: the client said the broker refused it, as Kafka's
# exception names it.
expect_refused() {
  local name=$1 out=$2 want=$3
  if grep -qE "$want" "$out"; then
    log "$name: $(grep -m1 -oE "$want.{0,120}" "$out")"
    pass "$name"
  else
    fail "$name" "no $want in the output: $(why "$out")"
  fi
}

# expect_ok <check> <status> <out>
expect_ok() {
  local name=$1 rc=$2 out=$3
  if ((rc == 0)) && ! grep -qE 'AuthorizationException|ERROR' "$out"; then
    pass "$name"
  else
    fail "$name" "exit $rc: $(why "$out")"
  fi
}

# expect_records <check> <out>: the console consumer read all N records.
expect_records() {
  local name=$1 out=$2 got
  got=$(grep -cE '^acl-' "$out")
  if ((got == N)); then pass "$name"; else fail "$name" "read $got of $N records: $(why "$out")"; fi
}

# ------------------------------------------------------------------ run

log "starting $broker with StandardAuthorizer on SASL_PLAINTEXT $BS"
if [[ $broker == kafka ]]; then start_kafka; else start_ours; fi

if ((matrix)); then
  [[ -x $PY ]] || die "python venv missing; run compat-tests/install.sh python"
  timeout -k 5 600 "$PY" "$here/acl_matrix.py" "$BS"
  exit $?
fi

o=$work/out
RUN_ID=$RANDOM
T=acl-orders-$RUN_ID
P=acl-p-$RUN_ID
G=acl-g-$RUN_ID

# An unauthorized user may not list ACLs (DescribeAcls needs Describe on the cluster).
acls alice "$o.1" --list
expect_refused acls.list.unauthorized "$o.1" 'ClusterAuthorizationException'

# bob may not create topics; the admin (a super user) may.
topics bob "$o.2" --create --topic "$T" --partitions 1 --replication-factor 1
expect_refused topics.create.unauthorized "$o.2" 'TopicAuthorizationException|Authorization failed'
topics admin "$o.3" --create --topic "$T" --partitions 1 --replication-factor 1
expect_ok topics.create.admin $? "$o.3"
topics admin "$o.3b" --create --topic "$P-1" --partitions 1 --replication-factor 1
expect_ok topics.create.admin.prefixed $? "$o.3b"

# bob's produce is refused until he has the producer ACLs.
produce bob "$T" "$o.4" 1
expect_refused produce.unauthorized "$o.4" 'TopicAuthorizationException'
acls admin "$o.5" --add --allow-principal User:bob --producer --topic "$T"
expect_ok acls.add.producer $? "$o.5"
produce bob "$T" "$o.6"
expect_ok produce.authorized $? "$o.6"

# alice's consume is refused (group first, as the consumer asks for its coordinator), then
# allowed with the consumer ACLs.
consume alice "$T" "$G" "$o.7"
expect_refused consume.unauthorized "$o.7" 'GroupAuthorizationException|TopicAuthorizationException'
acls admin "$o.8" --add --allow-principal User:alice --consumer --topic "$T" --group "$G"
expect_ok acls.add.consumer $? "$o.8"
consume alice "$T" "$G" "$o.9"
expect_records consume.authorized "$o.9"

# Topics alice may not describe are not listed to her.
topics alice "$o.10" --list
if grep -qx "$T" "$o.10" && ! grep -qx "$P-1" "$o.10"; then
  pass topics.list.hides-unauthorized
else
  fail topics.list.hides-unauthorized "listed: $(tr '\n' ' ' <"$o.10")"
fi

# A prefixed ACL: bob may write every topic starting with $P-.
produce bob "$P-1" "$o.11" 1
expect_refused produce.prefixed.unauthorized "$o.11" 'TopicAuthorizationException'
acls admin "$o.12" --add --allow-principal User:bob --operation Write --operation Describe \
  --topic "$P-" --resource-pattern-type prefixed
expect_ok acls.add.prefixed $? "$o.12"
produce bob "$P-1" "$o.13"
expect_ok produce.prefixed.authorized $? "$o.13"

# DENY beats ALLOW.
acls admin "$o.14" --add --deny-principal User:alice --operation Read --topic "$T"
expect_ok acls.add.deny $? "$o.14"
consume alice "$T" "$G-2" "$o.15"
expect_refused consume.denied "$o.15" 'TopicAuthorizationException|GroupAuthorizationException'

# --list shows what was added; --remove takes the DENY away again.
acls admin "$o.16" --list --topic "$T"
if grep -q 'User:bob' "$o.16" && grep -q 'principal=User:alice, host=\*, operation=READ, permissionType=DENY' "$o.16"; then
  pass acls.list
else
  fail acls.list "$(why "$o.16")"
fi
acls admin "$o.17" --remove --force --deny-principal User:alice --operation Read --topic "$T"
expect_ok acls.remove $? "$o.17"
acls admin "$o.18" --list --topic "$T"
if grep -q 'permissionType=DENY' "$o.18"; then
  fail acls.removed "the DENY is still listed"
else
  pass acls.removed
fi

echo "$passed passed, $failed failed"
((failed == 0))
