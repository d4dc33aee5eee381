#!/usr/bin/env bash
# The test command: install every real component (hack/install-deps.sh), then run every test
# with bin/ first on PATH. Extra arguments go to `cargo test`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
hack/install-deps.sh
export PATH="$root/bin:$PATH"
export KCPSHARD_BIN_DIR="$root/bin"
exec cargo test --workspace --no-fail-fast "$@"
