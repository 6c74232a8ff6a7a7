#!/usr/bin/env bash
# Runs an Apache Kafka command-line tool from the jars that `install.sh kafka`
# resolved, under the name of its bin/ script: kafka-cli.sh <tool> args...
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
  echo "usage: kafka-cli.sh <tool> args..." >&2
  echo "tools: kafka-topics kafka-console-producer kafka-console-consumer kafka-configs" >&2
  echo "       kafka-get-offsets kafka-consumer-groups kafka-delete-records" >&2
  echo "       kafka-producer-perf-test kafka-consumer-perf-test kafka-e2e-latency kafka-storage" >&2
  echo "       kafka-broker-api-versions kafka-metadata-quorum kafka-transactions kafka-acls" >&2
  echo "       kafka-share-groups kafka-console-share-consumer kafka-leader-election kafka-log-dirs" >&2
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
  kafka-e2e-latency) main=org.apache.kafka.tools.EndToEndLatency ;;
  kafka-storage) main=kafka.tools.StorageTool ;;
  kafka-broker-api-versions) main=org.apache.kafka.tools.BrokerApiVersionsCommand ;;
  kafka-metadata-quorum) main=org.apache.kafka.tools.MetadataQuorumCommand ;;
  kafka-transactions) main=org.apache.kafka.tools.TransactionsCommand ;;
  kafka-acls) main=org.apache.kafka.tools.AclCommand ;;
  kafka-share-groups) main=org.apache.kafka.tools.consumer.group.ShareGroupCommand ;;
  kafka-console-share-consumer) main=org.apache.kafka.tools.consumer.ConsoleShareConsumer ;;
  kafka-leader-election) main=org.apache.kafka.tools.LeaderElectionCommand ;;
  kafka-log-dirs) main=org.apache.kafka.tools.LogDirsCommand ;;
  *) usage ;;
esac
compgen -G "$KAFKA_LIBS/*.jar" >/dev/null || die "no Kafka jars in $KAFKA_LIBS; run install.sh kafka"

# KAFKA_CLI_JAVA_OPTS adds JVM options (the CLI scenarios use it for quick-starting JVMs).
read -r -a extra_opts <<<"${KAFKA_CLI_JAVA_OPTS:-}"
java_cmd=(java -Xmx512m -Djava.awt.headless=true "${extra_opts[@]}"
  -Dlog4j2.configurationFile="$COMPAT_DIR/kafka-reference/tools-log4j2.properties")

# Class data sharing: loading the tools' classes from ~90 jars dominates a tool's run time
# (about 10 s on a busy 2-core machine, under 2 s with an archive). The first run of a tool
# dumps the classes it loaded into an archive, later runs map it. The archive name carries the
# jar set's stamp, so new jars get new archives. JVM warnings go to stderr, never stdout; the
# archive dump's notes on classes it cannot share (old slf4j class files) are left out.
# KAFKA_CLI_CDS=0 turns this off.
stamp=$(cut -c1-16 "$CACHE_DIR/kafka-libs.stamp" 2>/dev/null || echo none)
archive="$CACHE_DIR/kafka-cds/$stamp-$tool.jsa"
java_cmd+=(-Xlog:disable -Xlog:all=warning:stderr -Xlog:cds*=error:stderr)
if [[ "${KAFKA_CLI_CDS:-1}" == 0 ]]; then
  exec "${java_cmd[@]}" -cp "$KAFKA_LIBS/*" "$main" "$@"
elif [[ -f "$archive" ]]; then
  exec "${java_cmd[@]}" -XX:SharedArchiveFile="$archive" -cp "$KAFKA_LIBS/*" "$main" "$@"
else
  mkdir -p "$(dirname "$archive")"
  # A private file renamed at the end, so concurrent first runs never read a partial archive.
  partial="$archive.$$"
  status=0
  "${java_cmd[@]}" -XX:ArchiveClassesAtExit="$partial" -cp "$KAFKA_LIBS/*" "$main" "$@" || status=$?
  if ((status == 0)) && [[ -s "$partial" ]]; then mv -f "$partial" "$archive"; else rm -f "$partial"; fi
  exit $status
fi
