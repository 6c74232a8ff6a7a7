#!/usr/bin/env bash
# Acts on one node of the cluster in <datadir>: node.sh <datadir> <op> [id]
#   pid <id>       prints the node's pid (empty when it does not run)
#   kill <id>      SIGKILL (kill -9), waits until the process is gone
#   term <id>      SIGTERM (clean shutdown), SIGKILL after STOP_TIMEOUT_S (default 30)
#   pause <id>     SIGSTOP          resume <id>  SIGCONT
#   start <id>     starts a stopped node from its saved config; waits until it listens
#   restart <id>   kill + start
#   wait           waits until a metadata request lists all N brokers (READY_TIMEOUT_S)
#   isolate <id>   network partition: the node cannot reach the other nodes nor they it,
#                  while clients still reach every node (iptables, cgroup match; see below)
#   heal           removes every partition rule of this cluster
# The nodes all connect from 127.0.0.1 whatever address they listen on, so source addresses
# cannot tell nodes apart. Each node runs in its own cgroup (v2) instead, and the rules drop
# the packets a node's processes send to the other nodes' listener ports (client and
# controller), in both directions of the pair. A client (any other cgroup) is not affected;
# one dropped direction is enough to stop a TCP connection.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[[ $# -ge 2 ]] || usage
load_cluster "$1"
op=$2
id=${3:-}
case "$op" in
  wait | heal) ;;
  *)
    [[ $id =~ ^[0-9]+$ ]] && ((id >= 1 && id <= N)) || die "node id must be 1..$N, not '$id'"
    ;;
esac

chain="FAULTS-$PORT"

ensure_iptables() {
  if ! command -v iptables >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-cache show iptables >/dev/null 2>&1 || apt-get update -qq
    apt-get install -y -qq iptables >/dev/null || die "cannot install iptables"
  fi
  [[ -n ${CGROUP_ROOT:-} ]] || die "no cgroup v2 hierarchy: cannot partition nodes"
  iptables -n -L "$chain" >/dev/null 2>&1 || iptables -N "$chain"
  iptables -C OUTPUT -j "$chain" 2>/dev/null || iptables -I OUTPUT -j "$chain"
}

kill_wait() {
  local pid=$1 bound=$2
  local deadline=$((SECONDS + bound))
  while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
  ! kill -0 "$pid" 2>/dev/null
}

case "$op" in
  pid) node_pid "$id" || true ;;
  kill)
    if node_alive "$id"; then
      pid=$(node_pid "$id")
      kill -KILL "$pid"
      kill_wait "$pid" 30 || die "node $id (pid $pid) survived SIGKILL"
    fi
    ;;
  term)
    if node_alive "$id"; then
      pid=$(node_pid "$id")
      kill -CONT "$pid" 2>/dev/null || true
      kill -TERM "$pid"
      if ! kill_wait "$pid" "${STOP_TIMEOUT_S:-30}"; then
        log "node $id ignored SIGTERM; killing it"
        kill -KILL "$pid"
        kill_wait "$pid" 30 || true
      fi
    fi
    ;;
  pause) node_alive "$id" && kill -STOP "$(node_pid "$id")" ;;
  resume) node_alive "$id" && kill -CONT "$(node_pid "$id")" ;;
  start)
    spawn_node "$id"
    write_nodes_file
    wait_listening "$id"
    ;;
  restart)
    "$0" "$1" kill "$id"
    "$0" "$1" start "$id"
    ;;
  wait) wait_cluster ;;
  isolate)
    ensure_iptables
    for ((j = 1; j <= N; j++)); do
      ((j == id)) && continue
      for p in "$PORT" "$CONTROLLER_PORT" ${INTERNAL_PORT:-}; do
        iptables -A "$chain" -p tcp -m cgroup --path "/$CGROUP_PREFIX-node$id" \
          -d "$(node_addr "$j")" --dport "$p" -j DROP
        iptables -A "$chain" -p tcp -m cgroup --path "/$CGROUP_PREFIX-node$j" \
          -d "$(node_addr "$id")" --dport "$p" -j DROP
      done
    done
    ;;
  heal)
    if command -v iptables >/dev/null 2>&1 && iptables -n -L "$chain" >/dev/null 2>&1; then
      iptables -F "$chain"
      iptables -D OUTPUT -j "$chain" 2>/dev/null || true
      iptables -X "$chain" 2>/dev/null || true
    fi
    ;;
  *) usage ;;
esac
