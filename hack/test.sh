#!/usr/bin/env bash
# The test command: install every real component (hack/install-deps.sh), then run every test
# with bin/ first on PATH. Extra arguments go to `cargo test`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# Compile the tests while install-deps runs: on a fresh machine much of its time is downloads
# (Debian packages, Go modules, a Debian root file system) that leave the CPU idle. A failed build
# here is reported by the `cargo test` below, which then finds everything else built.
build_log=$(mktemp -t kcpshard-test-build.XXXXXX)
cargo test --workspace --no-run "$@" >"$build_log" 2>&1 &
build=$!
trap 'kill "$build" 2>/dev/null || true; rm -f "$build_log"' EXIT
hack/install-deps.sh
wait "$build" || true
trap - EXIT
rm -f "$build_log"
export PATH="$root/bin:$PATH"
export KCPSHARD_BIN_DIR="$root/bin"
exec cargo test --workspace --no-fail-fast "$@"
