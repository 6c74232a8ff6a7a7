#!/usr/bin/env bash
# Installs the kafkajs client family: `npm ci` of the pinned package-lock.json into
# compat-tests/js/node_modules. Idempotent: skipped while the stamp (a hash of the
# lock file and the node version) still matches. Called as `install.sh js`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

js_dir="$COMPAT_DIR/js"
stamp="$js_dir/node_modules/.compat-stamp"
command -v node >/dev/null || die "node not found (Node.js 18 or later is needed)"
command -v npm >/dev/null || die "npm not found"
want=$( (cat "$js_dir/package.json" "$js_dir/package-lock.json"; node --version) | sha256sum | cut -d' ' -f1)
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  log "js (kafkajs) up to date"
  exit 0
fi
# npm ci removes node_modules first and installs exactly the lock file's versions.
(cd "$js_dir" && npm ci --no-audit --no-fund --loglevel=error >&2)
echo "$want" >"$stamp"
log "js installed: kafkajs $(node -p "require('$js_dir/node_modules/kafkajs/package.json').version")"
