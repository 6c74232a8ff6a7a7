# Builds the Go compat programs; sourced by install.sh and the scenarios
# wrappers, never executed. go_build <program> rebuilds
# $GO_BIN_DIR/<program> only when a stamp (a hash of go.mod, go.sum, every Go
# source and the Go version) differs, so a wrapper costs a few milliseconds
# once the binary is built. Build output goes to stderr: a wrapper's stdout
# carries only RESULT lines.
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

GO_MODULE_DIR="$COMPAT_DIR/go"
GO_BIN_DIR="$CACHE_DIR/go/bin"
# go.mod and go.sum are committed and must not change during a build; modules
# come from the Go module proxy into the default GOMODCACHE.
export GOFLAGS="-mod=readonly ${GOFLAGS:-}"

go_inputs_hash() {
  {
    go version
    cd "$GO_MODULE_DIR" && find . -name '*.go' -o -name go.mod -o -name go.sum -o -name build.sh | LC_ALL=C sort | xargs cat
  } | sha256sum | cut -d' ' -f1
}

go_build() {
  local program=$1 stamp want
  command -v go >/dev/null 2>&1 || die "go is not installed (needed for compat-tests/go)"
  stamp="$GO_BIN_DIR/$program.stamp"
  want=$(go_inputs_hash)
  if [[ -x "$GO_BIN_DIR/$program" ]] && [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    return
  fi
  mkdir -p "$GO_BIN_DIR"
  log "building go/$program"
  (cd "$GO_MODULE_DIR" && go build -o "$GO_BIN_DIR/$program.tmp" "./$program") >&2
  mv "$GO_BIN_DIR/$program.tmp" "$GO_BIN_DIR/$program"
  echo "$want" >"$stamp"
  log "built $GO_BIN_DIR/$program"
}
