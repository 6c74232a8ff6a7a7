#!/usr/bin/env bash
# Throughput with Kafka's own perf tools: perf.sh <bootstrap>
# Creates an 8-partition topic, runs kafka-producer-perf-test (1 KiB records,
# acks=all, linger.ms=5, batch.size=65536) and kafka-consumer-perf-test over
# the same records, and prints their summary lines. A benchmark, not a test:
# it fails only when a tool fails. PERF_RECORDS (default 500000) bounds the count.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ $# -eq 1 ]] || { echo "usage: perf.sh <bootstrap>" >&2; exit 2; }
bootstrap=$1
records=${PERF_RECORDS:-500000}
record_bytes=1024
partition_count=8
# Bounds on each tool run; 500000 records take well under a minute against Kafka.
tool_timeout_s=${PERF_TIMEOUT_S:-300}
topic="compat-perf-$(date +%s%3N)"

"$COMPAT_DIR/install.sh" kafka >/dev/null 2>&1 || "$COMPAT_DIR/install.sh" kafka

workdir=$(mktemp -d)
trap 'rm -rf "$workdir"' EXIT

timeout 60 "$COMPAT_DIR/kafka-cli.sh" kafka-topics --bootstrap-server "$bootstrap" --create \
  --topic "$topic" --partitions "$partition_count" --replication-factor 1 >/dev/null

echo "producer: $records records of $record_bytes bytes to $topic ($partition_count partitions)"
# The last line of ProducerPerformance is the run's summary; earlier ones are 5 s windows.
timeout --kill-after=10 "$tool_timeout_s" "$COMPAT_DIR/kafka-cli.sh" kafka-producer-perf-test \
  --topic "$topic" --num-records "$records" --record-size "$record_bytes" --throughput -1 \
  --producer-props bootstrap.servers="$bootstrap" acks=all linger.ms=5 batch.size=65536 \
  >"$workdir/producer.out"
tail -1 "$workdir/producer.out"

echo "consumer: the same $records records"
timeout --kill-after=10 "$tool_timeout_s" "$COMPAT_DIR/kafka-cli.sh" kafka-consumer-perf-test \
  --bootstrap-server "$bootstrap" --topic "$topic" --num-records "$records" --timeout 60000 \
  >"$workdir/consumer.out"
cat "$workdir/consumer.out"

timeout 60 "$COMPAT_DIR/kafka-cli.sh" kafka-topics --bootstrap-server "$bootstrap" --delete \
  --topic "$topic" >/dev/null || log "could not delete $topic"
