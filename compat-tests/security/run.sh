#!/usr/bin/env bash
# Security listeners through real clients (issue 31):
#   run.sh ours --bin <broker binary> [--hostile|--hostile-only] [--peers]
#   run.sh kafka [--hostile|--hostile-only] [--peers]   (Apache Kafka 4.4, as kafka-reference/start.sh starts it)
#
# Makes a throwaway PKI (openssl CA, broker certificate for localhost/127.0.0.1, client
# certificate CN=alice; PEM, PKCS12 and a JKS truststore), starts one broker with four
# listeners on loopback:
#   PLAINTEXT       $PLAINTEXT_PORT      (26092)  admin, SCRAM credentials
#   SSL             $SSL_PORT            (26093)  ssl.client.auth=required, PEM keystore
#   SASL_PLAINTEXT  $SASL_PLAINTEXT_PORT (26094)  PLAIN + SCRAM-SHA-512
#   SASL_SSL        $SASL_SSL_PORT       (26095)  PLAIN + SCRAM-SHA-512, PKCS12 keystore
#   (Kafka's controller on $CONTROLLER_PORT, 26096)
# creates SCRAM-SHA-512 user alice with kafka-configs.sh, then for (SASL_SSL, PLAIN),
# (SASL_SSL, SCRAM-SHA-512), (SASL_PLAINTEXT, SCRAM-SHA-512) and (SSL, client certificate)
# produces N records (default 200) and reads them back with kcat, confluent-kafka-python,
# Kafka's console tools, a KafkaProducer/KafkaConsumer program (java/.../SecureRoundTrip.java),
# franz-go and sarama (go/secure) and kafkajs (js/secure.js), and checks that a wrong password
# (SSL: no client certificate) is refused with an error rather than a hang.
# --hostile adds the raw-socket cases of security/hostile.py (checks on ours, reported only on
# Kafka); --peers adds kgo's SCRAM tests, three kgo tests on mTLS and librdkafka's
# tests.sasl_ssl.allow over SASL_SSL (run_peers). Needs install.sh kafka python kcat java go js
# (and kgo, LIBRDKAFKA_BUILD=ssl librdkafka for --peers).
#
# Prints "PASS <check>" / "FAIL <check>: <why>" per check on stdout (logs on stderr), ends
# with "<passed> passed, <failed> failed" and exits non-zero on any failure. Every client
# run is bounded by CLIENT_TIMEOUT_S (60) and the whole run by RUN_BUDGET_S (420, +120 with
# --hostile, +600 with --peers): checks
# not started by then fail as "not run". SEC_KEEP=1 keeps the work directory (PKI, configs,
# broker log) for a look afterwards.
set -uo pipefail
: "${N:=200}"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/../lib.sh"

usage() { echo "usage: run.sh ours --bin <broker binary> [--hostile|--hostile-only] [--peers] | run.sh kafka [--hostile|--hostile-only] [--peers]" >&2; exit 2; }
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
# --hostile: after the client checks, the hostile-input cases of security/hostile.py;
# --hostile-only: those alone. --peers: also the peer suites' tests over the secure
# listeners (franz-go's kgo SCRAM tests and some over mTLS, librdkafka's suite over SASL_SSL
# from its OpenSSL build; see run_peers).
hostile=0
clients=1
peers=0
for arg in "$@"; do
  case "$arg" in
    --hostile) hostile=1 ;;
    --hostile-only) hostile=1 clients=0 ;;
    --peers) peers=1 ;;
    *) usage ;;
  esac
done

PLAINTEXT_PORT=${PLAINTEXT_PORT:-26092}
SSL_PORT=${SSL_PORT:-26093}
SASL_PLAINTEXT_PORT=${SASL_PLAINTEXT_PORT:-26094}
SASL_SSL_PORT=${SASL_SSL_PORT:-26095}
export CONTROLLER_PORT=${CONTROLLER_PORT:-26096}
CLIENT_TIMEOUT_S=${CLIENT_TIMEOUT_S:-60}
# A refused client must say so well within this; a hang is a failure.
NEGATIVE_TIMEOUT_S=${NEGATIVE_TIMEOUT_S:-20}
RUN_BUDGET_S=${RUN_BUDGET_S:-$((420 + hostile * 120 + peers * 600))}
# How long the stalled-TLS-handshake case waits for the broker to close (ours bounds a
# handshake by socket.request.read.timeout.ms, 30 s by default).
HOSTILE_STALL_WAIT_S=${HOSTILE_STALL_WAIT_S:-40}
READY_TIMEOUT_S=${READY_TIMEOUT_S:-90}
export READY_TIMEOUT_S

HOST=127.0.0.1
PLAINTEXT_BS=$HOST:$PLAINTEXT_PORT
# Passwords of the throwaway PKI and users; nothing here protects anything.
STORE_PASS=compat-store
PLAIN_JAAS='org.apache.kafka.common.security.plain.PlainLoginModule required user_admin="admin-secret" user_alice="alice-secret";'
SCRAM_JAAS='org.apache.kafka.common.security.scram.ScramLoginModule required;'

CLI="$COMPAT_DIR/kafka-cli.sh"
PY="$VENV_DIR/bin/python"
# Quick-starting JVMs for the ~15 tool runs, as cli/scenarios does.
export KAFKA_CLI_JAVA_OPTS=${KAFKA_CLI_JAVA_OPTS:--XX:TieredStopAtLevel=1 -XX:+UseSerialGC}

command -v openssl >/dev/null || die "openssl not found"
command -v keytool >/dev/null || die "keytool not found (a JDK)"
command -v kcat >/dev/null || die "kcat not found; run compat-tests/install.sh kcat"
[[ -x $PY ]] || die "python venv missing; run compat-tests/install.sh python"
compgen -G "$KAFKA_LIBS/kafka_2.13-*.jar" >/dev/null || die "no Kafka jars in $KAFKA_LIBS; run compat-tests/install.sh kafka"
[[ -x $CACHE_DIR/go/bin/secure ]] || die "no go/secure program; run compat-tests/install.sh go"
[[ -d $COMPAT_DIR/js/node_modules/kafkajs ]] || die "no kafkajs; run compat-tests/install.sh js"
[[ -f $JAVA_CLASSES/compat/SecureRoundTrip.class ]] || die "no compat.SecureRoundTrip; run compat-tests/install.sh java"
command -v node >/dev/null || die "node not found"

work=$(mktemp -d /tmp/compat-security.XXXXXX)
pki=$work/pki
data=$work/data
broker_pid=
started=$SECONDS

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
  if [[ ${SEC_KEEP:-0} == 1 ]]; then
    log "kept $work"
  else
    rm -rf "$work"
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ------------------------------------------------------------------ results

passed=0
failed=0
pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() {
  local name=$1
  shift
  # One line: the reason may quote a multi-line client message.
  echo "FAIL $name: $(tr -s '\n\t' '  ' <<<"$*" | sed 's/ *$//' | cut -c1-600)"
  failed=$((failed + 1))
}
# A failure that ends the run (no broker to test): its FAIL line, the summary, exit 1.
abort() {
  fail "$1" "$2"
  echo "$passed passed, $failed failed"
  exit 1
}
# Whether the run budget still allows a check; otherwise it fails as not run.
budget_left() {
  local name=$1
  if ((SECONDS - started >= RUN_BUDGET_S)); then
    fail "$name" "not run: the run budget of ${RUN_BUDGET_S} s is spent"
    return 1
  fi
}
# A client's bound: CLIENT_TIMEOUT_S, less if the run budget has less left (at least 10 s).
bound() {
  local left=$((RUN_BUDGET_S - (SECONDS - started) + 20))
  ((left < 10)) && left=10
  ((left < ${1:-$CLIENT_TIMEOUT_S})) && echo "$left" || echo "${1:-$CLIENT_TIMEOUT_S}"
}

# run_bounded <timeout_s> <out file> <cmd>...: stdout and stderr to <out file>, exit status
# of the command (124 on timeout).
run_bounded() {
  local t=$1 out=$2
  shift 2
  timeout -k 5 "$t" "$@" >"$out" 2>&1 <"${STDIN_FILE:-/dev/null}"
}

# The most telling line of a client's output: a Java exception, a librdkafka error, the
# python verdict, else the last line.
why() {
  local file=$1 line
  line=$(grep -m1 -oE '[A-Za-z.]+(Exception|Error): .*' "$file")
  [[ -z $line ]] && line=$(grep -m1 -E '^error: ' "$file")
  [[ -z $line ]] && line=$(grep -m1 -E '% ERROR|%[0-9]\|' "$file")
  [[ -z $line ]] && line=$(grep -v '^\s*$' "$file" | tail -1)
  echo "${line:0:400}"
}

# ------------------------------------------------------------------ PKI

make_pki() {
  mkdir -p "$pki"
  (
    set -e
    cd "$pki"
    exec 2>"$pki/openssl.log"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 \
      -subj "/CN=compat-security-test-ca"
    cert() { # cert <name> <subject> <extensions>
      openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2"
      printf '%s\n' "$3" >"$1.ext"
      openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
        -extfile "$1.ext" -out "$1.crt"
      # A PEM keystore: the PKCS#8 private key, then the chain (leaf, CA).
      cat "$1.key" "$1.crt" ca.pem >"$1.pem"
      openssl pkcs12 -export -in "$1.crt" -inkey "$1.key" -certfile ca.pem -name "$1" \
        -passout "pass:$STORE_PASS" -out "$1.p12"
    }
    cert broker "/CN=localhost" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:localhost,IP:127.0.0.1"
    cert alice "/CN=alice/O=Example" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
    keytool -importcert -noprompt -alias ca -file ca.pem -keystore truststore.jks -storetype JKS \
      -storepass "$STORE_PASS" >/dev/null
  ) || { cat "$pki/openssl.log" >&2; die "making the PKI failed"; }
  log "PKI in $pki: ca.pem, broker.{pem,p12}, alice.{crt,key,pem,p12}, truststore.jks"
}

# ------------------------------------------------------------------ broker

# The security part of the broker's configuration, in Kafka's keys; both brokers get it.
security_properties() {
  cat <<PROPS
listeners=PLAINTEXT://$HOST:$PLAINTEXT_PORT,SSL://$HOST:$SSL_PORT,SASL_PLAINTEXT://$HOST:$SASL_PLAINTEXT_PORT,SASL_SSL://$HOST:$SASL_SSL_PORT${1:-}
advertised.listeners=PLAINTEXT://$HOST:$PLAINTEXT_PORT,SSL://$HOST:$SSL_PORT,SASL_PLAINTEXT://$HOST:$SASL_PLAINTEXT_PORT,SASL_SSL://$HOST:$SASL_SSL_PORT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
listener.name.ssl.ssl.keystore.type=PEM
listener.name.ssl.ssl.keystore.location=$pki/broker.pem
listener.name.ssl.ssl.truststore.type=PEM
listener.name.ssl.ssl.truststore.location=$pki/ca.pem
listener.name.ssl.ssl.client.auth=required
listener.name.sasl_ssl.ssl.keystore.type=PKCS12
listener.name.sasl_ssl.ssl.keystore.location=$pki/broker.p12
listener.name.sasl_ssl.ssl.keystore.password=$STORE_PASS
sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-512
listener.name.sasl_plaintext.plain.sasl.jaas.config=$PLAIN_JAAS
listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config=$SCRAM_JAAS
listener.name.sasl_ssl.plain.sasl.jaas.config=$PLAIN_JAAS
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=$SCRAM_JAAS
PROPS
}

start_kafka() {
  # start.sh writes a PLAINTEXT-only server.properties; the later keys appended here win.
  KAFKA_EXTRA_PROPERTIES=$(security_properties ",CONTROLLER://$HOST:$CONTROLLER_PORT") \
    "$COMPAT_DIR/kafka-reference/start.sh" "$PLAINTEXT_PORT" "$data" >"$work/start.out" \
    || { tail -20 "$data/kafka.out" >&2; abort broker.start "Apache Kafka did not start: $(tail -1 "$data/kafka.out")"; }
  broker_pid=$(tail -1 "$work/start.out")
  broker_log=$data/kafka.out
}

start_ours() {
  mkdir -p "$data"
  {
    echo "log.dirs=$data/logs"
    echo "group.initial.rebalance.delay.ms=0"
    echo "metrics.listen.address=127.0.0.1:0"
    security_properties
  } >"$work/server.properties"
  broker_log=$work/broker.log
  setsid "$bin" "$work/server.properties" >"$broker_log" 2>&1 </dev/null &
  broker_pid=$!
  local deadline=$((SECONDS + READY_TIMEOUT_S))
  while ((SECONDS < deadline)); do
    if ! kill -0 "$broker_pid" 2>/dev/null; then
      tail -20 "$broker_log" >&2
      abort broker.start "$bin exited during startup: $(grep -v '^\s*$' "$broker_log" | tail -1)"
    fi
    if ss -Hltn "( sport = :$PLAINTEXT_PORT )" | grep -q . \
      && timeout 10 "$PY" "$here/client.py" ready "$PLAINTEXT_BS" 5 >/dev/null 2>&1; then
      log "broker $bin ready (pid $broker_pid, data $data)"
      return
    fi
    sleep 0.3
  done
  tail -20 "$broker_log" >&2
  abort broker.start "no metadata on PLAINTEXT $PLAINTEXT_BS within ${READY_TIMEOUT_S} s"
}

# ------------------------------------------------------------------ checks

# The four ways in: combo -> port, security.protocol, SASL mechanism (or "" for mTLS).
COMBOS=(sasl_ssl.plain sasl_ssl.scram-sha-512 sasl_plaintext.scram-sha-512 ssl.mtls)
declare -A COMBO_PORT=([sasl_ssl.plain]=$SASL_SSL_PORT [sasl_ssl.scram-sha-512]=$SASL_SSL_PORT
  [sasl_plaintext.scram-sha-512]=$SASL_PLAINTEXT_PORT [ssl.mtls]=$SSL_PORT)
declare -A COMBO_PROTOCOL=([sasl_ssl.plain]=SASL_SSL [sasl_ssl.scram-sha-512]=SASL_SSL
  [sasl_plaintext.scram-sha-512]=SASL_PLAINTEXT [ssl.mtls]=SSL)
declare -A COMBO_MECHANISM=([sasl_ssl.plain]=PLAIN [sasl_ssl.scram-sha-512]=SCRAM-SHA-512
  [sasl_plaintext.scram-sha-512]=SCRAM-SHA-512 [ssl.mtls]=)
declare -A COMBO_PASSWORD=([sasl_ssl.plain]=alice-secret [sasl_ssl.scram-sha-512]=alice-scram
  [sasl_plaintext.scram-sha-512]=alice-scram [ssl.mtls]=)
# java: Kafka's console tools (--command-config); kafka-clients: a KafkaProducer/KafkaConsumer
# program (java/.../SecureRoundTrip.java); franz-go and sarama: go/secure; kafkajs: js/secure.js.
CLIENTS=(kcat python java kafka-clients franz-go sarama kafkajs)

# librdkafka properties (kcat and python take the same -X key=value pairs) for a combo;
# "bad" gives a wrong password (SSL: no client certificate).
rdkafka_props() {
  local combo=$1 bad=${2:-} client=${3:-kcat} protocol mech password
  protocol=${COMBO_PROTOCOL[$combo]} mech=${COMBO_MECHANISM[$combo]} password=${COMBO_PASSWORD[$combo]}
  [[ -n $bad ]] && password=wrong-password
  echo "-X security.protocol=$protocol"
  [[ $protocol == *SSL ]] && echo "-X ssl.ca.location=$pki/ca.pem"
  if [[ -n $mech ]]; then
    echo "-X sasl.mechanisms=$mech -X sasl.username=alice -X sasl.password=$password"
  elif [[ -z $bad ]]; then
    # kcat takes the client certificate as PEM files, python as a PKCS12 keystore.
    if [[ $client == python ]]; then
      echo "-X ssl.keystore.location=$pki/alice.p12 -X ssl.keystore.password=$STORE_PASS"
    else
      echo "-X ssl.certificate.location=$pki/alice.crt -X ssl.key.location=$pki/alice.key"
    fi
  fi
}

# A Java client's --command-config file for a combo.
java_props() {
  local combo=$1 bad=${2:-} file=$3 protocol mech password module
  protocol=${COMBO_PROTOCOL[$combo]} mech=${COMBO_MECHANISM[$combo]} password=${COMBO_PASSWORD[$combo]}
  [[ -n $bad ]] && password=wrong-password
  {
    echo "security.protocol=$protocol"
    if [[ $protocol == SSL ]]; then
      # The SSL client uses Java's own store types: a JKS truststore, a PKCS12 keystore.
      echo "ssl.truststore.type=JKS"
      echo "ssl.truststore.location=$pki/truststore.jks"
      echo "ssl.truststore.password=$STORE_PASS"
      if [[ -z $bad ]]; then
        echo "ssl.keystore.type=PKCS12"
        echo "ssl.keystore.location=$pki/alice.p12"
        echo "ssl.keystore.password=$STORE_PASS"
      fi
    elif [[ $protocol == SASL_SSL ]]; then
      echo "ssl.truststore.type=PEM"
      echo "ssl.truststore.location=$pki/ca.pem"
    fi
    if [[ -n $mech ]]; then
      module=org.apache.kafka.common.security.scram.ScramLoginModule
      [[ $mech == PLAIN ]] && module=org.apache.kafka.common.security.plain.PlainLoginModule
      echo "sasl.mechanism=$mech"
      echo "sasl.jaas.config=$module required username=\"alice\" password=\"$password\";"
    fi
  } >"$file"
}

# --key value flags of go/secure and js/secure.js for a combo (PEM files); "bad" as above.
prog_flags() {
  local combo=$1 bad=${2:-} protocol mech password
  protocol=${COMBO_PROTOCOL[$combo]} mech=${COMBO_MECHANISM[$combo]} password=${COMBO_PASSWORD[$combo]}
  [[ -n $bad ]] && password=wrong-password
  echo "--protocol $protocol"
  [[ $protocol == *SSL ]] && echo "--ca $pki/ca.pem"
  if [[ -n $mech ]]; then
    echo "--mechanism $mech --user alice --password $password"
  elif [[ -z $bad ]]; then
    echo "--cert $pki/alice.crt --key $pki/alice.key"
  fi
}

topic_of() { echo "sec-${1//./-}-$2-$RUN_ID"; }

expected_lines() { # expected_lines <topic>: the N key:value records of a round trip
  local i
  for ((i = 0; i < N; i++)); do echo "k-$i:$1-v-$i"; done
}

roundtrip_kcat() {
  local combo=$1 name=$2 topic bs props out=$work/$2.out rc
  topic=$(topic_of "$combo" kcat) bs=$HOST:${COMBO_PORT[$combo]}
  read -r -a props <<<"$(rdkafka_props "$combo" "" kcat | tr '\n' ' ')"
  # Debian's kcat links librdkafka 2.0.2, whose SCRAM client-final-message repeats the client
  # nonce (librdkafka#4895, fixed in 2.6.1); Kafka 4.x refuses it as RFC 5802 requires (see
  # the .old-librdkafka check). The SCRAM round trips run the same kcat on the wheel's newer
  # librdkafka instead.
  local -x LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
  [[ $combo == *scram* ]] && LD_LIBRARY_PATH=$new_rdkafka_dir
  expected_lines "$topic" >"$work/$name.in"
  STDIN_FILE=$work/$name.in run_bounded "$(bound)" "$out" kcat -P -b "$bs" -t "$topic" -p 0 -K: \
    -X acks=all "${props[@]}"
  rc=$?
  ((rc == 0)) || { fail "$name" "kcat -P (Produce) exit $rc: $(why "$out")"; return; }
  run_bounded "$(bound)" "$out" kcat -C -b "$bs" -t "$topic" -p 0 -o beginning -c "$N" -e -q \
    -f '%k:%s\n' "${props[@]}"
  rc=$?
  ((rc == 0)) || { fail "$name" "kcat -C (Fetch) exit $rc: $(why "$out")"; return; }
  if cmp -s "$out" "$work/$name.in"; then
    pass "$name"
  else
    fail "$name" "kcat -C read $(grep -c . "$out") lines, not the $N produced (first: $(head -1 "$out"))"
  fi
}

roundtrip_python() {
  local combo=$1 name=$2 topic bs props out=$work/$2.out
  topic=$(topic_of "$combo" python) bs=$HOST:${COMBO_PORT[$combo]}
  read -r -a props <<<"$(rdkafka_props "$combo" "" python | tr '\n' ' ')"
  if run_bounded "$(bound)" "$out" "$PY" "$here/client.py" roundtrip "$bs" "$topic" "$N" "${props[@]}"; then
    pass "$name"
  else
    fail "$name" "confluent-kafka: $(why "$out")"
  fi
}

roundtrip_java() {
  local combo=$1 name=$2 topic bs out=$work/$2.out cfg=$work/$2.properties rc
  topic=$(topic_of "$combo" java) bs=$HOST:${COMBO_PORT[$combo]}
  java_props "$combo" "" "$cfg"
  expected_lines "$topic" >"$work/$name.in"
  STDIN_FILE=$work/$name.in run_bounded "$(bound)" "$out" "$CLI" kafka-console-producer \
    --bootstrap-server "$bs" --topic "$topic" --command-config "$cfg" \
    --reader-property parse.key=true --reader-property key.separator=: \
    --command-property acks=all --command-property delivery.timeout.ms=30000 \
    --command-property request.timeout.ms=15000 --command-property max.block.ms=30000
  rc=$?
  # The console producer exits 0 after a failed send; its error is in the output.
  if ((rc != 0)) || grep -qE 'Exception|ERROR' "$out"; then
    fail "$name" "kafka-console-producer (Produce) exit $rc: $(why "$out")"
    return
  fi
  run_bounded "$(bound)" "$out" "$CLI" kafka-console-consumer --bootstrap-server "$bs" --topic "$topic" \
    --command-config "$cfg" --partition 0 --from-beginning --max-messages "$N" --timeout-ms 30000 \
    --formatter-property print.key=true --formatter-property key.separator=:
  rc=$?
  grep -v -E '^Processed a total of|^\[|WARN|ERROR|Exception|^\s+at ' "$out" >"$out.records"
  if ((rc == 0)) && cmp -s "$out.records" "$work/$name.in"; then
    pass "$name"
  else
    fail "$name" "kafka-console-consumer (Fetch) exit $rc, read $(grep -c . "$out.records") of $N records: $(why "$out")"
  fi
}

# The programs of the other families print one "ok ..." / "error: ..." line and exit 0 only
# when their own check held (the round trip read back all N records in order; the bad
# credentials were refused with the authentication error of the listener).
# prog_verdict <name> <what> <exit status> <out file> <bound s>
prog_verdict() {
  local name=$1 what=$2 rc=$3 out=$4 t=$5
  if ((rc == 124)); then
    fail "$name" "$what still running after $t s (hang): $(why "$out")"
  elif ((rc == 0)) && grep -q '^ok ' "$out"; then
    log "$name: $(grep -m1 '^ok ' "$out")"
    pass "$name"
  else
    local line
    line=$(grep -m1 '^error: ' "$out")
    fail "$name" "$what exit $rc: ${line:-$(why "$out")}"
  fi
}

GO_SECURE=$CACHE_DIR/go/bin/secure
JS_SECURE=$COMPAT_DIR/js/secure.js
JAVA_CP="$JAVA_CLASSES:$JAVA_LIBS/*"
JAVA_OPTS=(-XX:TieredStopAtLevel=1 -XX:+UseSerialGC)

roundtrip_go() { # roundtrip_go <franz|sarama> <client> <combo> <name>
  local prog=$1 combo=$3 name=$4 topic bs flags out=$work/$4.out t
  topic=$(topic_of "$combo" "$2") bs=$HOST:${COMBO_PORT[$combo]} t=$(bound)
  read -r -a flags <<<"$(prog_flags "$combo" | tr '\n' ' ')"
  run_bounded "$t" "$out" "$GO_SECURE" "$prog" roundtrip "$bs" "$topic" "$N" "${flags[@]}" --timeout 30s
  prog_verdict "$name" "$prog (Produce + Fetch)" $? "$out" "$t"
}
refused_go() {
  local prog=$1 combo=$2 name=$3 bs flags out=$work/$3.out t
  bs=$HOST:${COMBO_PORT[$combo]} t=$(bound "$NEGATIVE_TIMEOUT_S")
  read -r -a flags <<<"$(prog_flags "$combo" bad | tr '\n' ' ')"
  run_bounded "$t" "$out" "$GO_SECURE" "$prog" refused "$bs" "${flags[@]}" --timeout 15s
  prog_verdict "$name" "$prog (Metadata with bad credentials)" $? "$out" "$t"
}
roundtrip_franz_go() { roundtrip_go franz franz-go "$@"; }
refused_franz_go() { refused_go franz "$@"; }
roundtrip_sarama() { roundtrip_go sarama sarama "$@"; }
refused_sarama() { refused_go sarama "$@"; }

roundtrip_kafkajs() {
  local combo=$1 name=$2 topic bs flags out=$work/$2.out t
  topic=$(topic_of "$combo" kafkajs) bs=$HOST:${COMBO_PORT[$combo]} t=$(bound)
  read -r -a flags <<<"$(prog_flags "$combo" | tr '\n' ' ')"
  run_bounded "$t" "$out" node "$JS_SECURE" roundtrip "$bs" "$topic" "$N" "${flags[@]}" --timeout-ms 45000
  prog_verdict "$name" "kafkajs (Produce + group Fetch)" $? "$out" "$t"
}
refused_kafkajs() {
  local combo=$1 name=$2 bs flags out=$work/$2.out t
  bs=$HOST:${COMBO_PORT[$combo]} t=$(bound "$NEGATIVE_TIMEOUT_S")
  read -r -a flags <<<"$(prog_flags "$combo" bad | tr '\n' ' ')"
  run_bounded "$t" "$out" node "$JS_SECURE" refused "$bs" "${flags[@]}" --timeout-ms 15000
  prog_verdict "$name" "kafkajs (admin connect with bad credentials)" $? "$out" "$t"
}

roundtrip_kafka_clients() {
  local combo=$1 name=$2 topic bs out=$work/$2.out cfg=$work/$2.properties t
  topic=$(topic_of "$combo" kafka-clients) bs=$HOST:${COMBO_PORT[$combo]} t=$(bound)
  java_props "$combo" "" "$cfg"
  run_bounded "$t" "$out" java "${JAVA_OPTS[@]}" -cp "$JAVA_CP" compat.SecureRoundTrip roundtrip "$bs" "$cfg" "$topic" "$N"
  prog_verdict "$name" "KafkaProducer/KafkaConsumer" $? "$out" "$t"
}
refused_kafka_clients() {
  local combo=$1 name=$2 bs out=$work/$2.out cfg=$work/$2.properties t
  bs=$HOST:${COMBO_PORT[$combo]} t=$(bound "$NEGATIVE_TIMEOUT_S")
  java_props "$combo" bad "$cfg"
  run_bounded "$t" "$out" java "${JAVA_OPTS[@]}" -cp "$JAVA_CP" compat.SecureRoundTrip refused "$bs" "$cfg"
  prog_verdict "$name" "Admin describeCluster with bad credentials" $? "$out" "$t"
}

# Negative checks: bad credentials must end in an authentication error within the bound.
refused_kcat() {
  local combo=$1 name=$2 bs props out=$work/$2.out rc
  bs=$HOST:${COMBO_PORT[$combo]}
  read -r -a props <<<"$(rdkafka_props "$combo" bad kcat | tr '\n' ' ')"
  # SCRAM on the newer librdkafka, as in roundtrip_kcat, so that the password is what fails.
  local -x LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
  [[ $combo == *scram* ]] && LD_LIBRARY_PATH=$new_rdkafka_dir
  # -L (Metadata) with a metadata bound below the timeout: kcat exits non-zero when it gets none.
  run_bounded "$(bound "$NEGATIVE_TIMEOUT_S")" "$out" kcat -L -b "$bs" -m 5 "${props[@]}"
  rc=$?
  # The broker's SASL_AUTHENTICATION_FAILED, as librdkafka logs it; a client that gives up
  # before asking ("SASL Handshake not supported by broker") is no refusal of the password.
  local want='SASL authentication error: Authentication failed'
  [[ $combo == ssl.mtls ]] && want='SSL|handshake|certificate|Disconnected'
  if ((rc == 124)); then
    fail "$name" "kcat -L still running after ${NEGATIVE_TIMEOUT_S} s (hang): $(why "$out")"
  elif ((rc == 0)); then
    fail "$name" "kcat -L got metadata with bad credentials"
  elif ! grep -qE "$want" "$out"; then
    fail "$name" "kcat -L exit $rc without an authentication error: $(why "$out")"
  else
    log "$name: $(grep -m1 -E "$want" "$out")"
    pass "$name"
  fi
}

# librdkafka 2.0.2 (Debian's kcat) with the right SCRAM password: its client-final-message
# carries the client nonce twice, so the combined nonce differs from the server's; Kafka 4.x
# answers SASL_AUTHENTICATION_FAILED (the check RFC 5802 section 5.1 asks for), and so must we.
old_librdkafka_scram() {
  local combo=$1 name=$2 bs props out=$work/$2.out rc
  bs=$HOST:${COMBO_PORT[$combo]}
  read -r -a props <<<"$(rdkafka_props "$combo" "" kcat | tr '\n' ' ')"
  run_bounded "$(bound "$NEGATIVE_TIMEOUT_S")" "$out" kcat -L -b "$bs" -m 5 "${props[@]}"
  rc=$?
  if ((rc == 124)); then
    fail "$name" "kcat -L (librdkafka 2.0.2) still running after ${NEGATIVE_TIMEOUT_S} s (hang): $(why "$out")"
  elif ((rc == 0)); then
    fail "$name" "kcat -L (librdkafka 2.0.2) authenticated although its client-final-message nonce is not the server's (Kafka 4.4 refuses it)"
  elif ! grep -qE 'SASL authentication error: Authentication failed' "$out"; then
    fail "$name" "kcat -L (librdkafka 2.0.2) exit $rc without the broker's SASL_AUTHENTICATION_FAILED: $(why "$out")"
  else
    log "$name: $(grep -m1 -E 'SASL authentication error' "$out")"
    pass "$name"
  fi
}

refused_python() {
  local combo=$1 name=$2 bs props out=$work/$2.out kind=auth rc
  bs=$HOST:${COMBO_PORT[$combo]}
  [[ $combo == ssl.mtls ]] && kind=ssl
  read -r -a props <<<"$(rdkafka_props "$combo" bad python | tr '\n' ' ')"
  run_bounded "$(bound "$NEGATIVE_TIMEOUT_S")" "$out" "$PY" "$here/client.py" auth-fail "$bs" \
    $((NEGATIVE_TIMEOUT_S - 5)) "$kind" "${props[@]}"
  rc=$?
  if ((rc == 0)); then
    log "$name: $(tail -1 "$out")"
    pass "$name"
  elif ((rc == 124)); then
    fail "$name" "confluent-kafka still running after ${NEGATIVE_TIMEOUT_S} s (hang)"
  else
    fail "$name" "confluent-kafka: $(why "$out")"
  fi
}

refused_java() {
  local combo=$1 name=$2 bs out=$work/$2.out cfg=$work/$2.properties topic rc
  bs=$HOST:${COMBO_PORT[$combo]} topic=$(topic_of "$combo" java)
  java_props "$combo" bad "$cfg"
  run_bounded "$(bound "$NEGATIVE_TIMEOUT_S")" "$out" "$CLI" kafka-console-consumer --bootstrap-server "$bs" \
    --topic "$topic" --command-config "$cfg" --partition 0 --from-beginning --max-messages 1 --timeout-ms 10000
  rc=$?
  if ((rc == 124)); then
    fail "$name" "kafka-console-consumer still running after ${NEGATIVE_TIMEOUT_S} s (hang): $(why "$out")"
  elif grep -qE '(Sasl|Ssl)?AuthenticationException' "$out"; then
    log "$name: exit $rc, $(grep -m1 -oE '[A-Za-z.]*AuthenticationException: .*' "$out")"
    pass "$name"
  else
    fail "$name" "kafka-console-consumer exit $rc without an AuthenticationException: $(why "$out")"
  fi
}

# ------------------------------------------------------------------ run

RUN_ID=$(date +%s)-$$
make_pki
# kcat on the confluent-kafka wheel's librdkafka (ABI-compatible): a folder holding it
# under the soname kcat links.
new_rdkafka=$(compgen -G "$VENV_DIR/lib/python3*/site-packages/confluent_kafka.libs/librdkafka*.so*" | head -1)
[[ -n $new_rdkafka ]] || die "no librdkafka in the confluent-kafka wheel under $VENV_DIR"
new_rdkafka_dir=$work/librdkafka
mkdir -p "$new_rdkafka_dir"
ln -s "$new_rdkafka" "$new_rdkafka_dir/librdkafka.so.1"
log "kcat: $(kcat -V 2>&1 | grep -oE 'librdkafka [0-9.]+') (SCRAM round trips: $(LD_LIBRARY_PATH=$new_rdkafka_dir kcat -V 2>&1 | grep -oE 'librdkafka [0-9.]+'))"
log "starting $broker with PLAINTEXT $PLAINTEXT_PORT, SSL $SSL_PORT, SASL_PLAINTEXT $SASL_PLAINTEXT_PORT, SASL_SSL $SASL_SSL_PORT"
# Loopback ports of our own: a broker left from another run would be tested instead.
for port in "$PLAINTEXT_PORT" "$SSL_PORT" "$SASL_PLAINTEXT_PORT" "$SASL_SSL_PORT" "$CONTROLLER_PORT"; do
  ss -Hltn "( sport = :$port )" | grep -q . && abort broker.start "port $port is already in use"
done
if [[ $broker == kafka ]]; then start_kafka; else start_ours; fi

# The hostile-input cases (security/hostile.py) against the running broker: on ours each
# case is a check (PASS/FAIL), on Kafka the cases are reported only (as hostile/run.sh does).
run_hostile() {
  local out=$work/hostile.out check=() rc line name verdict
  [[ $broker == ours ]] && check=(--check)
  budget_left hostile || return
  run_bounded "$(bound $((HOSTILE_STALL_WAIT_S + 120)))" "$out" "$PY" "$here/hostile.py" --pid "$broker_pid" \
    --plaintext "$PLAINTEXT_BS" --ssl "$HOST:$SSL_PORT" --sasl-plaintext "$HOST:$SASL_PLAINTEXT_PORT" \
    --sasl-ssl "$HOST:$SASL_SSL_PORT" --ca "$pki/ca.pem" --stall-wait-s "$HOSTILE_STALL_WAIT_S" "${check[@]}"
  rc=$?
  grep -v '^case ' "$out" >&2
  while read -r line; do
    echo "$line"
    name=hostile.$(awk '{print $2}' <<<"$line") verdict=${line##*verdict=}
    if [[ $verdict == PASS ]]; then
      passed=$((passed + 1))
    elif [[ $verdict == FAIL ]]; then
      failed=$((failed + 1))
      echo "FAIL $name: $(sed -E 's/^case [^ ]+ //; s/ verdict=FAIL$//' <<<"$line")"
    fi
  done < <(grep '^case ' "$out")
  if ((rc == 124)); then
    fail hostile "security/hostile.py still running after its bound (hang)"
  elif ((rc != 0)) && [[ $broker == ours ]] && ! grep -q 'verdict=FAIL' "$out"; then
    fail hostile "security/hostile.py exit $rc: $(why "$out")"
  fi
  if [[ $broker == ours ]] && ! kill -0 "$broker_pid" 2>/dev/null; then
    fail hostile.broker-alive "the broker died during the hostile cases"
  fi
}

# Lines "PASS <test>" / "FAIL <test> <why>" of a peer suite's runner as checks <suite>.<test>;
# a runner that printed none of the tests asked for fails as a whole.
# peer_results <suite> <out file> <runner exit> <tests>...
peer_results() {
  local suite=$1 out=$2 rc=$3 t line
  shift 3
  for t in "$@"; do
    line=$(grep -m1 -E "^(PASS|FAIL|SKIP) $t( |$)" "$out")
    case "$line" in
      PASS*) pass "$suite.$t" ;;
      FAIL* | SKIP*) fail "$suite.$t" "${line#* $t }" ;;
      *) fail "$suite.$t" "no result from the runner (exit $rc): $(why "$out")" ;;
    esac
  done
}

# franz-go's kgo suite: its SCRAM tests read KGO_TEST_SCRAM_SEEDS/KGO_TEST_SCRAM (a client on
# that listener with SASL alone: SASL_PLAINTEXT); KGO_TEST_TLS puts every other test's client
# on TLS with a client certificate (the SSL listener).
KGO_SCRAM_TESTS=(TestSCRAMAuth TestSCRAMAuthBadCredentials)
KGO_MTLS_TESTS=(TestPing TestClient_Produce TestGroupSimple)
# librdkafka's suite (OpenSSL build) with test.conf on SASL_SSL + SCRAM-SHA-512 as alice: the
# tests of librdkafka/tests.sasl_ssl.allow.
run_peers() {
  local out rc tests
  out=$work/kgo-scram.out
  if budget_left kgo.scram; then
    run_bounded "$(bound 240)" "$out" env KGO_TEST_SCRAM_SEEDS="$HOST:$SASL_PLAINTEXT_PORT" \
      KGO_TEST_SCRAM=alice:alice-scram:512 KGO_TEST_TIMEOUT_S=60 \
      "$COMPAT_DIR/kgo/run.sh" "$PLAINTEXT_BS" "${KGO_SCRAM_TESTS[@]}"
    peer_results kgo "$out" $? "${KGO_SCRAM_TESTS[@]}"
  fi
  out=$work/kgo-mtls.out
  if budget_left kgo.mtls; then
    run_bounded "$(bound 300)" "$out" env KGO_TEST_TLS="ca:$pki/ca.pem,cert:$pki/alice.crt,key:$pki/alice.key" \
      KGO_TEST_RECORDS=2000 KGO_TEST_TIMEOUT_S=90 \
      "$COMPAT_DIR/kgo/run.sh" "$HOST:$SSL_PORT" "${KGO_MTLS_TESTS[@]}"
    rc=$?
    local t
    for t in "${KGO_MTLS_TESTS[@]}"; do sed -i "s/^\(PASS\|FAIL\|SKIP\) $t\b/\1 $t.mtls/" "$out"; done
    peer_results kgo "$out" $rc "${KGO_MTLS_TESTS[@]/%/.mtls}"
  fi
  out=$work/librdkafka.out
  if budget_left librdkafka.sasl_ssl; then
    {
      echo "security.protocol=SASL_SSL"
      echo "ssl.ca.location=$pki/ca.pem"
      echo "sasl.mechanism=SCRAM-SHA-512"
      echo "sasl.username=alice"
      echo "sasl.password=alice-scram"
    } >"$work/librdkafka-sasl_ssl.conf"
    mapfile -t tests < <(sed -e 's/#.*//' "$COMPAT_DIR/librdkafka/tests.sasl_ssl.allow" | awk 'NF {print $1}')
    run_bounded "$(bound 600)" "$out" env LIBRDKAFKA_BUILD=ssl RDKAFKA_TEST_CONF_EXTRA="$work/librdkafka-sasl_ssl.conf" \
      RDKAFKA_ALLOW_FILE="$COMPAT_DIR/librdkafka/tests.sasl_ssl.allow" TEST_TIMEOUT_S=90 \
      "$COMPAT_DIR/librdkafka/run.sh" "$HOST:$SASL_SSL_PORT" --allowed
    peer_results librdkafka "$out" $? "${tests[@]}"
  fi
}

if ((clients == 0)); then
  run_hostile
  log "$broker: $((SECONDS - started)) s"
  echo "$passed passed, $failed failed"
  ((failed == 0))
  exit
fi

# SCRAM-SHA-512 credentials for alice through Kafka's own tool (AlterUserScramCredentials),
# then DescribeUserScramCredentials must show them.
out=$work/scram.out
if run_bounded "$(bound)" "$out" "$CLI" kafka-configs --bootstrap-server "$PLAINTEXT_BS" --alter \
  --add-config 'SCRAM-SHA-512=[iterations=8192,password=alice-scram]' --entity-type users --entity-name alice \
  && grep -q "Completed updating config" "$out"; then
  pass scram.alter
else
  fail scram.alter "kafka-configs --alter (AlterUserScramCredentials): $(why "$out")"
fi
if run_bounded "$(bound)" "$out" "$CLI" kafka-configs --bootstrap-server "$PLAINTEXT_BS" --describe \
  --entity-type users --entity-name alice && grep -q "SCRAM-SHA-512=iterations=8192" "$out"; then
  pass scram.describe
else
  fail scram.describe "kafka-configs --describe (DescribeClientQuotas + DescribeUserScramCredentials) has no SCRAM-SHA-512=iterations=8192: $(why "$out")"
fi

# The same credentials through the Admin API alone (confluent-kafka), so a failure above can
# be told apart from the tool's other requests.
if run_bounded "$(bound)" "$out" "$PY" "$here/client.py" describe-scram "$PLAINTEXT_BS" alice SCRAM-SHA-512 8192; then
  pass scram.describe.admin
else
  fail scram.describe.admin "confluent-kafka describe_user_scram_credentials: $(why "$out")"
fi

topics=()
for combo in "${COMBOS[@]}"; do
  for client in "${CLIENTS[@]}"; do topics+=("$(topic_of "$combo" "$client")"); done
done
out=$work/topics.out
if ! run_bounded "$(bound)" "$out" "$PY" "$here/client.py" create-topics "$PLAINTEXT_BS" "${topics[@]}"; then
  fail topics.create "CreateTopics on PLAINTEXT: $(why "$out")"
fi

for combo in "${COMBOS[@]}"; do
  for client in "${CLIENTS[@]}"; do
    name=$client.$combo
    budget_left "$name" && "roundtrip_${client//-/_}" "$combo" "$name"
    name=$client.$combo.refused
    budget_left "$name" && "refused_${client//-/_}" "$combo" "$name"
  done
  if [[ $combo == *scram* ]]; then
    name=kcat.$combo.old-librdkafka-refused
    budget_left "$name" && old_librdkafka_scram "$combo" "$name"
  fi
done

((hostile)) && run_hostile
((peers)) && run_peers

if ((failed > 0)); then
  log "last lines of the broker log ($broker_log):"
  tail -15 "$broker_log" >&2
fi
log "$broker: $((SECONDS - started)) s"
echo "$passed passed, $failed failed"
((failed == 0))
