#!/usr/bin/env bash
# Stops the reference broker started by start.sh: stop.sh <datadir>.
# SIGTERM first (a clean shutdown takes a few seconds), SIGKILL after a bound.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

[[ $# -eq 1 ]] || { echo "usage: stop.sh <datadir>" >&2; exit 2; }
pid_file="$1/kafka.pid"
[[ -f "$pid_file" ]] || { log "no $pid_file: nothing to stop"; exit 0; }
pid=$(cat "$pid_file")
stop_timeout_s=${STOP_TIMEOUT_S:-30}

if kill -0 "$pid" 2>/dev/null; then
  kill -TERM "$pid"
  deadline=$((SECONDS + stop_timeout_s))
  while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.5; done
  if kill -0 "$pid" 2>/dev/null; then
    log "broker $pid ignored SIGTERM for ${stop_timeout_s}s; killing it"
    kill -KILL "$pid" 2>/dev/null || true
  fi
fi
rm -f "$pid_file"
log "reference Kafka (pid $pid) stopped"
