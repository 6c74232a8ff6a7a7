# shellcheck shell=bash disable=SC2034 # variables for the scripts that source this file
# Shared by the cluster scripts; sourced, never executed.
# A cluster lives in one data directory:
#   <datadir>/cluster.env        KIND, N, PORT, CONTROLLER_PORT, METRICS_PORT, BOOTSTRAP, CGROUP_PREFIX
#                                (and INTERNAL_PORT with CLUSTER_SECURE=1, see secure.sh)
#   <datadir>/nodes              "<id> <pid> <address>" per node, rewritten when a node (re)starts
#   <datadir>/node<i>/           server.properties, launch (execs the node), out.log, pid, data/
# Node i listens on 127.0.0.i: every node uses the same ports (CLUSTER_PORT, default 30092, for
# clients; +1 for the controller listener; +2 for our broker's metrics).
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

CLUSTER_DIR="$COMPAT_DIR/cluster"
REPO_DIR=$(cd "$COMPAT_DIR/.." && pwd)

# The fault client (compat.Faults) with JVM options for a quick start.
FAULTS_JAVA=(java -Xmx512m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true
  -Dorg.slf4j.simpleLogger.defaultLogLevel="${FAULTS_LOG_LEVEL:-warn}"
  -cp "$JAVA_CLASSES:$JAVA_LIBS/*" compat.Faults)
faults() { "${FAULTS_JAVA[@]}" "$@"; }

node_addr() { echo "127.0.0.$1"; }

# Loads <datadir>/cluster.env; dies when the directory holds no cluster.
load_cluster() {
  local dir=$1
  [[ -f "$dir/cluster.env" ]] || die "$dir holds no cluster (no cluster.env)"
  # shellcheck disable=SC1091
  source "$dir/cluster.env"
  CLUSTER_DATA=$(cd "$dir" && pwd)
}

node_pid() {
  local f="$CLUSTER_DATA/node$1/pid"
  [[ -f $f ]] && cat "$f"
}

node_alive() {
  local pid
  pid=$(node_pid "$1") || return 1
  [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null
}

# The cgroup v2 hierarchy, where each node gets its own group so that iptables'
# cgroup match can tell the nodes' packets apart (they all leave from 127.0.0.1).
cgroup2_root() { awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts; }

write_nodes_file() {
  local i tmp="$CLUSTER_DATA/nodes.tmp"
  : >"$tmp"
  for ((i = 1; i <= N; i++)); do
    echo "$i $(node_pid "$i" || echo -) $(node_addr "$i")" >>"$tmp"
  done
  mv -f "$tmp" "$CLUSTER_DATA/nodes"
}

# Whether something listens on addr:port, asked of the kernel (a connect attempt could
# pick the very port as its source while nobody listens yet).
# A JVM shows an IPv4 listener as [::ffff:a.b.c.d]:port.
listening() {
  ss -Hltn "( sport = :$2 )" | awk '{print $4}' | grep -qxE "(${1//./\\.}|\\[::ffff:${1//./\\.}\\]):$2"
}

# Launches node i from its launch script, detached so that it outlives the caller.
spawn_node() {
  local i=$1 dir="$CLUSTER_DATA/node$1"
  node_alive "$i" && die "node $i already runs (pid $(node_pid "$i"))"
  echo "--- launch $(date -u +%FT%T.%3NZ)" >>"$dir/out.log"
  setsid "$dir/launch" >>"$dir/out.log" 2>&1 </dev/null &
  echo $! >"$dir/pid"
}

# Waits until node i listens on its client port (not for the cluster).
wait_listening() {
  local i=$1 dir="$CLUSTER_DATA/node$1" deadline=$((SECONDS + ${NODE_START_TIMEOUT_S:-90}))
  until listening "$(node_addr "$i")" "$PORT"; do
    if ! node_alive "$i"; then
      tail -30 "$dir/out.log" >&2
      die "node $i exited during startup"
    fi
    ((SECONDS < deadline)) || { tail -30 "$dir/out.log" >&2; die "node $i not listening within ${NODE_START_TIMEOUT_S:-90}s"; }
    sleep 0.3
  done
}

# Waits until a metadata request lists all N brokers.
wait_cluster() {
  faults wait-brokers "$BOOTSTRAP" "$N" "${1:-${READY_TIMEOUT_S:-120}}" >/dev/null
}
