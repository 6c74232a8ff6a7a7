#!/usr/bin/env bash
# Stops every node of the cluster in <datadir>: stop.sh <datadir>. Resumes stopped
# (SIGSTOP) nodes, removes the cluster's network partition rules, then SIGTERM; SIGKILL
# after STOP_TIMEOUT_S (default 30). The data stays (start.sh on the same directory reuses it).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

[[ $# -eq 1 ]] || { echo "usage: stop.sh <datadir>" >&2; exit 2; }
[[ -f "$1/cluster.env" ]] || { log "no cluster in $1: nothing to stop"; exit 0; }
load_cluster "$1"
"$CLUSTER_DIR/node.sh" "$CLUSTER_DATA" heal >/dev/null 2>&1 || true
pids=()
for ((i = 1; i <= N; i++)); do
  if node_alive "$i"; then
    pid=$(node_pid "$i")
    kill -CONT "$pid" 2>/dev/null || true
    kill -TERM "$pid" 2>/dev/null || true
    pids+=("$pid")
  fi
done
deadline=$((SECONDS + ${STOP_TIMEOUT_S:-30}))
for pid in "${pids[@]}"; do
  while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.3; done
  if kill -0 "$pid" 2>/dev/null; then
    log "node pid $pid ignored SIGTERM; killing it"
    kill -KILL "$pid" 2>/dev/null || true
  fi
done
for ((i = 1; i <= N; i++)); do
  rm -f "$CLUSTER_DATA/node$i/pid"
  [[ -n ${CGROUP_ROOT:-} ]] && rmdir "$CGROUP_ROOT/$CGROUP_PREFIX-node$i" 2>/dev/null || true
done
write_nodes_file
log "$KIND cluster in $CLUSTER_DATA stopped (${#pids[@]} nodes were running)"
