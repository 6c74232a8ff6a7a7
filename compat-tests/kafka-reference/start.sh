#!/usr/bin/env bash
# Starts a single-node Apache Kafka (KRaft, broker+controller in one process) as
# the reference broker: start.sh <port> <datadir>. The client listener is
# 127.0.0.1:<port>, the controller 127.0.0.1:<port+1> (CONTROLLER_PORT
# overrides). Formats <datadir> on first use, waits until a metadata request
# succeeds, then prints the broker's PID. Stop it with stop.sh <datadir>.
# KAFKA_EXTRA_JAVA_OPTS adds JVM options after the defaults (a later -Xms/-Xmx
# wins) and KAFKA_EXTRA_PROPERTIES (key=value lines) is appended to
# server.properties (a later key wins); both are empty for the compat tests.
# KAFKA_FORMAT_FEATURES (space-separated feature=level) pins features when the
# data directory is formatted, e.g. "transaction.version=1" for a broker that
# speaks transactions version 1 only (clients then send AddPartitionsToTxn);
# unset, the format takes the release's defaults (transaction.version=2 in 4.4).
# The wall-clock time of the launch (bash EPOCHREALTIME) is written to
# <datadir>/kafka.launched, so a caller can time start-to-ready itself.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

[[ $# -eq 2 ]] || { echo "usage: start.sh <port> <datadir>" >&2; exit 2; }
port=$1
mkdir -p "$2"
datadir=$(cd "$2" && pwd)
controller_port=${CONTROLLER_PORT:-$((port + 1))}
# Bounds on the waits below; startup normally takes 5-10 s on 2 cores.
ready_timeout_s=${READY_TIMEOUT_S:-90}

compgen -G "$KAFKA_LIBS/kafka_2.13-*.jar" >/dev/null || die "no Kafka jars in $KAFKA_LIBS; run install.sh kafka"

pid_file="$datadir/kafka.pid"
if [[ -f "$pid_file" ]] && kill -0 "$(cat "$pid_file")" 2>/dev/null; then
  die "a broker from $datadir is already running (pid $(cat "$pid_file"))"
fi

config="$datadir/server.properties"
cat >"$config" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$controller_port
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller_port
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$datadir/logs
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=3
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
PROPS
if [[ -n ${KAFKA_EXTRA_PROPERTIES:-} ]]; then
  printf '%s\n' "$KAFKA_EXTRA_PROPERTIES" >>"$config"
fi

java_opts=(-Xms512m -Xmx1g -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true
  -Dkafka.logs.dir="$datadir"
  -Dlog4j2.configurationFile="$COMPAT_DIR/kafka-reference/log4j2.properties")
read -r -a extra_java_opts <<<"${KAFKA_EXTRA_JAVA_OPTS:-}"
java_opts+=("${extra_java_opts[@]}")

if [[ ! -f "$datadir/logs/meta.properties" ]]; then
  # A random cluster id: 16 bytes in URL-safe base64 without padding, as Kafka writes it.
  # It starts with '-' one time in 64, so it is passed as --cluster-id=<id>: as a
  # separate word, argparse would take it for an option and refuse the format.
  cluster_id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')
  feature_args=()
  for feature in ${KAFKA_FORMAT_FEATURES:-}; do feature_args+=(--feature "$feature"); done
  timeout --foreground 60 java "${java_opts[@]}" -cp "$KAFKA_LIBS/*" kafka.tools.StorageTool format \
    --config "$config" --cluster-id="$cluster_id" --standalone "${feature_args[@]}" >"$datadir/format.out" 2>&1 \
    || { cat "$datadir/format.out" >&2; die "formatting $datadir failed"; }
fi

# setsid detaches the broker from this shell's process group, so it outlives start.sh.
echo "$EPOCHREALTIME" >"$datadir/kafka.launched"
setsid java "${java_opts[@]}" -cp "$KAFKA_LIBS/*" kafka.Kafka "$config" \
  >"$datadir/kafka.out" 2>&1 </dev/null &
pid=$!
echo "$pid" >"$pid_file"

# Whether the broker listens on its port. A connect attempt to a port nobody
# listens on yet can pick that very port as its source (it is in the ephemeral
# range) and connect to itself, which holds the port and fails the broker's
# bind; so ss asks the kernel instead, when it is installed.
port_listening() {
  if command -v ss >/dev/null 2>&1; then
    ss -Hltn "( sport = :$port )" | grep -q .
  else
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null
  fi
}

# Wait for the port, then for a metadata request (kafka-topics --list) to succeed.
deadline=$((SECONDS + ready_timeout_s))
ready=0
while ((SECONDS < deadline)); do
  kill -0 "$pid" 2>/dev/null || { tail -40 "$datadir/kafka.out" >&2; die "broker exited during startup"; }
  if port_listening; then
    if timeout --foreground 30 "$COMPAT_DIR/kafka-cli.sh" kafka-topics --bootstrap-server "127.0.0.1:$port" --list \
      >/dev/null 2>&1; then
      ready=1
      break
    fi
  fi
  sleep 0.5
done
if ((ready == 0)); then
  kill "$pid" 2>/dev/null || true
  tail -40 "$datadir/kafka.out" >&2
  die "broker not ready within ${ready_timeout_s}s"
fi
log "reference Kafka ready on 127.0.0.1:$port (controller $controller_port, data $datadir)"
echo "$pid"
