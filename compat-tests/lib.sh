# Shared settings for the compat-test scripts; sourced, never executed.
# Every path is derived from this file's location so the scripts work from any
# working directory and in any clone.

COMPAT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE_DIR="$COMPAT_DIR/.cache"
KAFKA_LIBS="$CACHE_DIR/kafka-libs"
VENV_DIR="$CACHE_DIR/venv"
JAVA_LIBS="$COMPAT_DIR/java/target/lib"
JAVA_CLASSES="$COMPAT_DIR/java/target/classes"

# The default Maven repository (~/.m2) survives between CI runs on the same
# machine while .cache/ is new in every fresh clone, so downloads are paid once
# per machine. COMPAT_M2_REPO points elsewhere (used to time a cold cache).
M2_REPO="${COMPAT_M2_REPO:-$HOME/.m2/repository}"
MVN=(mvn -B -q -Dstyle.color=never -Dmaven.repo.local="$M2_REPO")

# The record count of one round trip per codec.
: "${N:=100000}"

CODECS=(none gzip snappy lz4 zstd)

log() { printf '[compat %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# The client families of the scenario list: name -> scenarios program
# (relative to compat-tests/) and the install.sh parts it needs (a
# space-separated list: kcat sets its topics up through the python venv).
declare -A FAMILY_CMD=(
  [java]=java/scenarios
  [cli]=cli/scenarios
  [python]=python/scenarios
  [kcat]=kcat/scenarios
  [kafkajs]=js/scenarios
  [franz-go]=go/franz/scenarios
  [sarama]=go/sarama/scenarios
)
declare -A FAMILY_INSTALL=(
  [java]=java [cli]=cli [python]=python [kcat]="kcat python" [kafkajs]=js [franz-go]=go [sarama]=go
)
FAMILIES=(java cli python kcat kafkajs franz-go sarama)
PEER_SUITES=(kgo librdkafka)
# The security suites (compat-tests/security/): name -> script. Each starts its
# own broker, ours or Apache Kafka, and prints PASS/FAIL lines per check.
declare -A SECURITY_SCRIPT=([listeners]=run.sh [acls]=acls.sh [acl-matrix]=acls.sh [quotas]=quotas.sh [librdkafka-auth]=librdkafka-auth.sh)
SECURITY_SUITES=(listeners acls acl-matrix quotas librdkafka-auth)

# Every install part run-ci.sh needs, one per line.
ci_parts() {
  printf '%s\n' kcat python java kafka ${FAMILY_INSTALL[@]} "${PEER_SUITES[@]}" | sort -u
}

# Runs a command in the background and waits for it, so that an interrupt
# stops it at once (bash defers traps while a foreground command runs). The
# caller's EXIT trap can kill "$child" while it runs.
step() {
  "$@" &
  child=$!
  wait "$child"
  local rc=$?
  child=
  return $rc
}
