#!/usr/bin/env bash
# Idempotent installs for the compat tests: install.sh [java|python|kcat|kafka|all|ci|librdkafka-ssl|<family>]...
# Each part records a stamp (a hash of its inputs) and does nothing when the
# stamp still matches, so calling it before every run costs about a second.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# Pinned so that a new librdkafka release cannot change results between runs.
CONFLUENT_KAFKA_VERSION=2.16.1
# PyYAML parses docker-compose.yml for cluster/validate-compose.py.
PYYAML_VERSION=6.0.3

mkdir -p "$CACHE_DIR"

inputs_hash() { cat "$@" | sha256sum | cut -d' ' -f1; }

stamp_matches() { [[ -f "$1" && "$(cat "$1")" == "$2" ]]; }

install_kcat() {
  if command -v kcat >/dev/null 2>&1; then
    log "kcat present: $(kcat -V 2>&1 | head -1)"
    return
  fi
  export DEBIAN_FRONTEND=noninteractive
  # The package lists on a fresh machine may be empty; refresh them only when
  # the package is not known, because apt-get update is the slow part.
  if ! apt-cache show kcat >/dev/null 2>&1; then
    apt-get update -qq
  fi
  apt-get install -y -qq kcat >/dev/null
  log "kcat installed: $(kcat -V 2>&1 | head -1)"
}

install_python() {
  local stamp="$VENV_DIR/.compat-stamp" want="confluent-kafka==$CONFLUENT_KAFKA_VERSION pyyaml==$PYYAML_VERSION"
  if stamp_matches "$stamp" "$want" && "$VENV_DIR/bin/python" -c 'import confluent_kafka, yaml' 2>/dev/null; then
    log "python venv up to date ($want)"
    return
  fi
  rm -rf "$VENV_DIR"
  python3 -m venv "$VENV_DIR"
  # The wheel bundles librdkafka (with zstd, snappy, lz4), so nothing but PyPI is needed.
  # shellcheck disable=SC2086 # $want is two requirements
  "$VENV_DIR/bin/pip" install -q --only-binary=:all: $want
  "$VENV_DIR/bin/python" -c 'import confluent_kafka as c; print("confluent-kafka", c.version()[0], "librdkafka", c.libversion()[0])' >&2
  echo "$want" >"$stamp"
}

install_java() {
  local stamp="$CACHE_DIR/java.stamp" want
  want=$(inputs_hash "$COMPAT_DIR/java/pom.xml" $(find "$COMPAT_DIR/java/src" -type f | sort))
  if stamp_matches "$stamp" "$want" && [[ -d "$JAVA_CLASSES" && -d "$JAVA_LIBS" ]]; then
    log "java round trip up to date"
    return
  fi
  "${MVN[@]}" -f "$COMPAT_DIR/java/pom.xml" package
  echo "$want" >"$stamp"
  log "java round trip built: $JAVA_CLASSES + $JAVA_LIBS"
}

install_kafka() {
  local stamp="$CACHE_DIR/kafka-libs.stamp" want
  want=$(inputs_hash "$COMPAT_DIR/kafka-libs/pom.xml")
  if stamp_matches "$stamp" "$want" && compgen -G "$KAFKA_LIBS/kafka_2.13-*.jar" >/dev/null; then
    log "kafka libs up to date"
    return
  fi
  rm -rf "$KAFKA_LIBS"
  "${MVN[@]}" -f "$COMPAT_DIR/kafka-libs/pom.xml" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$KAFKA_LIBS"
  echo "$want" >"$stamp"
  log "kafka libs resolved: $(ls "$KAFKA_LIBS" | wc -l) jars in $KAFKA_LIBS"
}

parts=("$@")
[[ ${#parts[@]} -eq 0 ]] && parts=(all)
for part in "${parts[@]}"; do
  case "$part" in
    kcat) install_kcat ;;
    python) install_python ;;
    java) install_java ;;
    kafka) install_kafka ;;
    all) install_kcat; install_python; install_java; install_kafka ;;
    # Everything run-ci.sh runs: every family's parts and both peer suites.
    ci) mapfile -t ci < <(ci_parts); "$0" "${ci[@]}" ;;
    # librdkafka built with OpenSSL, for security/run.sh --peers (librdkafka/install.sh).
    librdkafka-ssl) LIBRDKAFKA_BUILD=ssl "$COMPAT_DIR/librdkafka/install.sh" ;;
    *)
      # Client families added later own their installer: <family>/install.sh.
      if [[ -x "$COMPAT_DIR/$part/install.sh" ]]; then
        "$COMPAT_DIR/$part/install.sh"
      else
        die "unknown part '$part' (expected java, python, kcat, kafka, all or a folder with install.sh)"
      fi
      ;;
  esac
done
