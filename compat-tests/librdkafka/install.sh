#!/usr/bin/env bash
# Builds librdkafka and its own test runner (tests/test-runner) from the source
# that the rdkafka-sys crate ships, pinned by version and sha256. Idempotent:
# does nothing when the stamp (crate checksum + configure flags) still matches.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

# rdkafka-sys 4.10.0+2.12.1 carries librdkafka 2.12.1 with its tests/ folder.
RDKAFKA_SYS_VERSION=4.10.0+2.12.1
RDKAFKA_SYS_SHA256=e234cf318915c1059d4921ef7f75616b5219b10b46e9f3a511a15eb4b56a3f77
CRATE_URL="https://static.crates.io/crates/rdkafka-sys/rdkafka-sys-$RDKAFKA_SYS_VERSION.crate"

# SSL, SASL/GSSAPI and libcurl only serve tests that need a secured or OIDC
# broker, which the runner skips when the feature is not built in; leaving them
# out shortens the build. LZ4 and snappy are builtin; zlib and zstd come from
# Debian so that every codec the broker supports is exercised. RapidJSON (header
# only) lets the runner validate statistics JSON; without it four tests skip.
CONFIGURE_FLAGS=(--disable-ssl --disable-gssapi --disable-curl --disable-lz4-ext --enable-zlib --enable-zstd)
DEB_PACKAGES=(build-essential pkg-config python3 zlib1g-dev libzstd-dev rapidjson-dev)
# LIBRDKAFKA_BUILD=ssl: a second build, with OpenSSL (SSL, SASL_SSL and SCRAM need it), in
# .cache/librdkafka-ssl/, for the suite over the secure listeners (security/run.sh --peers).
BUILD_DIR="$CACHE_DIR/librdkafka"
case "${LIBRDKAFKA_BUILD:-}" in
  "") ;;
  ssl)
    CONFIGURE_FLAGS=(--enable-ssl --disable-gssapi --disable-curl --disable-lz4-ext --enable-zlib --enable-zstd)
    DEB_PACKAGES+=(libssl-dev)
    BUILD_DIR="$CACHE_DIR/librdkafka-ssl"
    ;;
  *) die "unknown LIBRDKAFKA_BUILD '$LIBRDKAFKA_BUILD' (empty or ssl)" ;;
esac

SRC_DIR="$BUILD_DIR/rdkafka-sys-$RDKAFKA_SYS_VERSION/librdkafka"
STAMP="$BUILD_DIR/build.stamp"
WANT="$RDKAFKA_SYS_SHA256 ${CONFIGURE_FLAGS[*]} ${DEB_PACKAGES[*]}"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" && -x "$SRC_DIR/tests/test-runner" ]]; then
  log "librdkafka test runner up to date ($RDKAFKA_SYS_VERSION)"
  exit 0
fi

missing=()
for pkg in "${DEB_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  # Refresh the package lists only when a package is unknown: apt-get update is the slow part.
  for pkg in "${missing[@]}"; do
    apt-cache show "$pkg" >/dev/null 2>&1 || { apt-get update -qq; break; }
  done
  apt-get install -y -qq "${missing[@]}" >/dev/null
  log "installed Debian packages: ${missing[*]}"
fi

mkdir -p "$CACHE_DIR/librdkafka" "$BUILD_DIR"
crate="$CACHE_DIR/librdkafka/rdkafka-sys-$RDKAFKA_SYS_VERSION.crate"
if ! echo "$RDKAFKA_SYS_SHA256  $crate" | sha256sum -c --status 2>/dev/null; then
  curl -sSfL --retry 3 -o "$crate.part" "$CRATE_URL"
  echo "$RDKAFKA_SYS_SHA256  $crate.part" | sha256sum -c --status || die "sha256 mismatch for $CRATE_URL"
  mv "$crate.part" "$crate"
fi

# A fresh unpack, so that a build with other flags leaves nothing behind.
rm -rf "$BUILD_DIR/rdkafka-sys-$RDKAFKA_SYS_VERSION"
tar -xzf "$crate" -C "$BUILD_DIR"

cd "$SRC_DIR"
# mklove loads every configure.* file in the source folder as a module, so the
# configure output must go to a file not named like that.
log "configuring librdkafka: ${CONFIGURE_FLAGS[*]}"
./configure "${CONFIGURE_FLAGS[@]}" >mklove-configure.log 2>&1 || { tail -30 mklove-configure.log >&2; die "configure failed"; }
log "building librdkafka (make -j2 libs)"
make -j2 libs >make.log 2>&1 || { tail -30 make.log >&2; die "make libs failed"; }
log "building the test runner (make -j2 -C tests test-runner)"
make -j2 -C tests test-runner >>make.log 2>&1 || { tail -30 make.log >&2; die "make test-runner failed"; }
echo "$WANT" >"$STAMP"
log "librdkafka test runner built: $SRC_DIR/tests/test-runner"
