#!/usr/bin/env bash
# The Kafka CLI tools family needs only the Kafka 4.4.0 jars: install.sh kafka is
# stamp-based, so calling this before every run costs about a second.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
exec "$COMPAT_DIR/install.sh" kafka
