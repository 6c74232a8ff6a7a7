#!/usr/bin/env bash
# Builds franz-go's own pkg/kgo test binary, whose integration tests run.sh
# drives against a broker: compat-tests/kgo/install.sh (or install.sh kgo).
# The module source comes from the Go module proxy at a pinned version; the
# binary and the list of integration tests go to .cache/kgo/. Idempotent: does
# nothing when the stamp (version, Go version, inputs) still matches.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

# Pinned so that a new franz-go release cannot change which tests exist or
# what they expect between runs.
FRANZ_GO_VERSION=v1.22.3

KGO_DIR="$COMPAT_DIR/kgo"
KGO_CACHE="$CACHE_DIR/kgo"
mkdir -p "$KGO_CACHE"

command -v go >/dev/null 2>&1 || die "go is not installed (needed to build the franz-go tests)"

stamp="$KGO_CACHE/stamp"
want=$( (echo "$FRANZ_GO_VERSION"; go env GOVERSION; cat "$KGO_DIR/install.sh" "$KGO_DIR/list-integration-tests.go") \
  | sha256sum | cut -d' ' -f1)
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -x "$KGO_CACHE/kgo.test" && -s "$KGO_CACHE/integration-tests" ]]; then
  log "kgo tests up to date (franz-go $FRANZ_GO_VERSION)"
  exit 0
fi

# Outside any module (/ has no go.mod, and GOWORK=off ignores a workspace),
# `go mod download` fetches (or finds in the module cache) exactly this
# version and prints where its source lives. The directory is read-only,
# which is fine: go test -c writes only to the build cache and -o.
export GOWORK=off GO111MODULE=on
module_dir=$(cd / && GOFLAGS= go mod download -json "github.com/twmb/franz-go@$FRANZ_GO_VERSION" \
  | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
[[ -n "$module_dir" && -d "$module_dir/pkg/kgo" ]] || die "go mod download gave no source for franz-go $FRANZ_GO_VERSION"

log "building the kgo test binary from $module_dir (a cold Go build cache takes about 2 minutes)"
rm -f "$stamp"
# The build resolves franz-go's own dependencies through its go.sum, so the
# versions it compiles against are the ones franz-go tested with.
(cd "$module_dir" && go test -c -o "$KGO_CACHE/kgo.test.new" ./pkg/kgo)
mv "$KGO_CACHE/kgo.test.new" "$KGO_CACHE/kgo.test"

# kgo marks none of its tests as integration tests; the lister finds the ones
# that reach the broker through the test helpers (see its header comment).
(cd / && go run "$KGO_DIR/list-integration-tests.go" "$module_dir/pkg/kgo") >"$KGO_CACHE/integration-tests.new"
[[ -s "$KGO_CACHE/integration-tests.new" ]] || die "found no kgo integration tests"
mv "$KGO_CACHE/integration-tests.new" "$KGO_CACHE/integration-tests"

echo "$FRANZ_GO_VERSION" >"$KGO_CACHE/version"
echo "$want" >"$stamp"
log "kgo tests built: $(wc -l <"$KGO_CACHE/integration-tests") integration tests (franz-go $FRANZ_GO_VERSION)"
