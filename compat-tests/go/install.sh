#!/usr/bin/env bash
# Installs the Go client family (franz-go and sarama): downloads the pinned
# modules of go.mod from the Go module proxy and builds both scenario
# programs. Idempotent: each binary is rebuilt only when its stamp differs.
# Called as `compat-tests/install.sh go` or directly.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/build.sh"

(cd "$GO_MODULE_DIR" && go mod download) >&2
for program in franz sarama secure; do
  go_build "$program"
done
log "go family ready: $GO_BIN_DIR/franz, $GO_BIN_DIR/sarama, $GO_BIN_DIR/secure"
