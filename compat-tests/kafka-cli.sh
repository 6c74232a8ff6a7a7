#!/usr/bin/env bash
# Runs an Apache Kafka command-line tool from the jars that `install.sh kafka`
# resolved, under the name of its bin/ script: kafka-cli.sh <tool> args...
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
  echo "usage: kafka-cli.sh <tool> args..." >&2
  echo "tools: kafka-topics kafka-console-producer kafka-console-consumer kafka-configs" >&2
  echo "       kafka-get-offsets kafka-consumer-groups kafka-delete-records" >&2
  echo "       kafka-producer-perf-test kafka-consumer-perf-test kafka-storage" >&2
  exit 2
}
[[ $# -ge 1 ]] || usage
tool=$1
shift
case "$tool" in
  kafka-topics) main=org.apache.kafka.tools.TopicCommand ;;
  kafka-console-producer) main=org.apache.kafka.tools.ConsoleProducer ;;
  kafka-console-consumer) main=org.apache.kafka.tools.consumer.ConsoleConsumer ;;
  kafka-configs) main=org.apache.kafka.tools.ConfigCommand ;;
  kafka-get-offsets) main=org.apache.kafka.tools.GetOffsetShell ;;
  kafka-consumer-groups) main=org.apache.kafka.tools.consumer.group.ConsumerGroupCommand ;;
  kafka-delete-records) main=org.apache.kafka.tools.DeleteRecordsCommand ;;
  kafka-producer-perf-test) main=org.apache.kafka.tools.ProducerPerformance ;;
  kafka-consumer-perf-test) main=org.apache.kafka.tools.ConsumerPerformance ;;
  kafka-storage) main=kafka.tools.StorageTool ;;
  *) usage ;;
esac
compgen -G "$KAFKA_LIBS/*.jar" >/dev/null || die "no Kafka jars in $KAFKA_LIBS; run install.sh kafka"
exec java -Xmx512m -Djava.awt.headless=true \
  -Dlog4j2.configurationFile="$COMPAT_DIR/kafka-reference/tools-log4j2.properties" \
  -cp "$KAFKA_LIBS/*" "$main" "$@"
