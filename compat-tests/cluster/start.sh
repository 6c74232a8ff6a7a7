#!/usr/bin/env bash
# Starts a local cluster: start.sh <ours|kafka> <n> <datadir>, n = 1, 3 or 5.
# Node i (node.id=i) listens on 127.0.0.i (clients on CLUSTER_PORT, default 30092, the
# controller listener on +1; our broker's metrics on +2), with data under <datadir>/node<i>.
# Waits until a metadata request lists n brokers, writes "<id> <pid> <address>" lines to
# <datadir>/nodes and prints the bootstrap list. Stop it with stop.sh <datadir>; act on one
# node with node.sh.
#   ours:  $BROKER_BIN (default: the repo's release build, built when missing), given the
#          generated server.properties as its first argument.
#   kafka: Apache Kafka in KRaft combined mode (broker+controller) from the jars of
#          `install.sh kafka`; all nodes formatted with one cluster id.
# CLUSTER_EXTRA_PROPERTIES (key=value lines) is appended to every node's properties (a later
# key wins), e.g. replica.lag.time.max.ms=5000 for the fault tests.
# CLUSTER_SECURE=1 (ours only): brokers replicate over SASL_SSL on +3 and voters talk over
# SSL with client certificates, from a throwaway PKI (secure.sh); clients keep PLAINTEXT.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

[[ $# -eq 3 ]] || { echo "usage: start.sh <ours|kafka> <n> <datadir>" >&2; exit 2; }
kind=$1
n=$2
[[ $kind == ours || $kind == kafka ]] || die "kind must be ours or kafka, not '$kind'"
[[ $n == 1 || $n == 3 || $n == 5 ]] || die "n must be 1, 3 or 5, not '$n'"
mkdir -p "$3"
CLUSTER_DATA=$(cd "$3" && pwd)
# Below Linux's ephemeral range (32768-60999). Node 1 listens on 127.0.0.1, the source
# address of every loopback connection; a client socket, open or in TIME_WAIT, that holds
# one of node 1's ports as its source port makes the bind fail with EADDRINUSE even with
# SO_REUSEADDR. The old default 40092 is the likely cause of a CI run whose node 1 never
# listened on 40093 while nodes 2 and 3 started.
port=${CLUSTER_PORT:-30092}
cport=$((port + 1))
mport=$((port + 2))
secure=${CLUSTER_SECURE:-0}
[[ $secure == 0 || $kind == ours ]] || die "CLUSTER_SECURE=1 is for ours only"

if [[ -f "$CLUSTER_DATA/cluster.env" ]]; then
  load_cluster "$CLUSTER_DATA"
  for ((i = 1; i <= N; i++)); do
    node_alive "$i" && die "node $i of $CLUSTER_DATA still runs (pid $(node_pid "$i")); stop.sh it first"
  done
  [[ $KIND == "$kind" && $N == "$n" && $PORT == "$port" ]] \
    || die "$CLUSTER_DATA holds a $KIND cluster of $N on port $PORT; use a new directory"
fi

"$COMPAT_DIR/install.sh" java >/dev/null 2>"$CLUSTER_DATA/install.log" || { cat "$CLUSTER_DATA/install.log" >&2; die "install.sh java failed"; }
if [[ $kind == kafka ]]; then
  "$COMPAT_DIR/install.sh" kafka >/dev/null 2>>"$CLUSTER_DATA/install.log" || { cat "$CLUSTER_DATA/install.log" >&2; die "install.sh kafka failed"; }
else
  BROKER_BIN=${BROKER_BIN:-${CARGO_TARGET_DIR:-$REPO_DIR/target}/release/broker}
  if [[ ! -x $BROKER_BIN ]]; then
    log "building $BROKER_BIN"
    (cd "$REPO_DIR" && cargo build --release --bin broker) || die "cargo build failed"
  fi
  BROKER_BIN=$(cd "$(dirname "$BROKER_BIN")" && pwd)/$(basename "$BROKER_BIN")
fi

voters=""
bootstrap=""
for ((i = 1; i <= n; i++)); do
  voters+="${voters:+,}$i@$(node_addr "$i"):$cport"
  bootstrap+="${bootstrap:+,}$(node_addr "$i"):$port"
done
rf=$((n < 3 ? n : 3))
min_isr=$((n < 2 ? 1 : 2))
cg_root=$(cgroup2_root || true)
cg_prefix="kafka-faults-$port"

cat >"$CLUSTER_DATA/cluster.env" <<ENV
KIND=$kind
N=$n
PORT=$port
CONTROLLER_PORT=$cport
METRICS_PORT=$mport
BOOTSTRAP=$bootstrap
CGROUP_ROOT=$cg_root
CGROUP_PREFIX=$cg_prefix
ENV
if [[ $secure != 0 ]]; then
  echo "INTERNAL_PORT=$((port + 3))" >>"$CLUSTER_DATA/cluster.env"
  [[ -f "$CLUSTER_DATA/pki/ca.pem" ]] || "$CLUSTER_DIR/secure.sh" pki "$CLUSTER_DATA" "$n"
fi
load_cluster "$CLUSTER_DATA"

kafka_java_opts="-Xms256m -Xmx768m -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true"
# Passed as --cluster-id=<id>: it starts with '-' one time in 64.
cluster_id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')
format_pids=()
for ((i = 1; i <= n; i++)); do
  dir="$CLUSTER_DATA/node$i"
  addr=$(node_addr "$i")
  mkdir -p "$dir"
  {
    echo "node.id=$i"
    echo "controller.quorum.voters=$voters"
    echo "listeners=PLAINTEXT://$addr:$port,CONTROLLER://$addr:$cport"
    echo "controller.listener.names=CONTROLLER"
    echo "log.dirs=$dir/data"
    echo "default.replication.factor=$rf"
    echo "min.insync.replicas=$min_isr"
    echo "offsets.topic.replication.factor=$rf"
    echo "group.initial.rebalance.delay.ms=0"
    if [[ $kind == ours ]]; then
      echo "metrics.listen.address=$addr:$mport"
    else
      echo "process.roles=broker,controller"
      echo "advertised.listeners=PLAINTEXT://$addr:$port"
      echo "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
      echo "inter.broker.listener.name=PLAINTEXT"
      echo "offsets.topic.num.partitions=3"
      echo "transaction.state.log.replication.factor=$rf"
      echo "transaction.state.log.min.isr=$min_isr"
      echo "share.coordinator.state.topic.replication.factor=$rf"
      echo "share.coordinator.state.topic.min.isr=$min_isr"
    fi
    [[ -n ${CLUSTER_EXTRA_PROPERTIES:-} ]] && printf '%s\n' "$CLUSTER_EXTRA_PROPERTIES"
    [[ $secure == 0 ]] || "$CLUSTER_DIR/secure.sh" properties "$CLUSTER_DATA" "$i"
  } >"$dir/server.properties"

  # The launch script joins the node's own cgroup (for node.sh isolate) and execs the node,
  # so its pid is the node's pid.
  {
    echo '#!/usr/bin/env bash'
    if [[ -n $cg_root ]]; then
      mkdir -p "$cg_root/$cg_prefix-node$i" 2>/dev/null || true
      echo "[[ -w '$cg_root/$cg_prefix-node$i/cgroup.procs' ]] && echo \$\$ >'$cg_root/$cg_prefix-node$i/cgroup.procs'"
    fi
    if [[ $kind == ours ]]; then
      echo "exec '$BROKER_BIN' '$dir/server.properties'"
    else
      echo "exec java $kafka_java_opts -Dkafka.logs.dir='$dir' -Dlog4j2.configurationFile='$COMPAT_DIR/kafka-reference/log4j2.properties' -cp '$KAFKA_LIBS/*' kafka.Kafka '$dir/server.properties'"
    fi
  } >"$dir/launch"
  chmod +x "$dir/launch"

  if [[ $kind == kafka && ! -f "$dir/data/meta.properties" ]]; then
    # With controller.quorum.voters (static quorum) format needs no --standalone.
    timeout 120 java $kafka_java_opts -cp "$KAFKA_LIBS/*" kafka.tools.StorageTool format \
      --config "$dir/server.properties" --cluster-id="$cluster_id" >"$dir/format.out" 2>&1 &
    format_pids+=($!)
  fi
done
for pid in "${format_pids[@]}"; do
  wait "$pid" || { cat "$CLUSTER_DATA"/node*/format.out >&2; die "kafka-storage format failed"; }
done

start=$SECONDS
# A node that does not come up takes the others down with it.
# shellcheck disable=SC2154 # rc is assigned inside the trap
trap 'rc=$?; ((rc == 0)) || "$CLUSTER_DIR/stop.sh" "$CLUSTER_DATA" >/dev/null 2>&1; exit $rc' EXIT
for ((i = 1; i <= n; i++)); do spawn_node "$i"; done
write_nodes_file
for ((i = 1; i <= n; i++)); do wait_listening "$i"; done
if ! wait_cluster; then
  for ((i = 1; i <= n; i++)); do echo "--- node $i" >&2; tail -15 "$CLUSTER_DATA/node$i/out.log" >&2; done
  die "cluster not ready: a metadata request did not list $n brokers (nodes stopped)"
fi
log "$kind cluster of $n ready in $((SECONDS - start)) s: $bootstrap (data $CLUSTER_DATA)"
echo "$bootstrap"
