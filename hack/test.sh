#!/usr/bin/env bash
# The test command: check formatting and lints, install every real component the tests use
# (hack/install-deps.sh --for test), then run every test with bin/ first on PATH. Extra arguments go to
# `cargo test`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# Formatting first: it takes a second and fails before anything is built.
cargo fmt --all -- --check || { echo "test: cargo fmt finds unformatted code: run cargo fmt" >&2; exit 1; }
# Compile the tests, then lint every target, while install-deps runs: on a fresh machine much of
# its time is downloads (Debian packages, Go modules, a Debian root file system) that leave the CPU
# idle. A failed build here is reported by the `cargo test` below, which then finds everything else
# built; clippy's verdict is read once install-deps is done.
build_log=$(mktemp -t kcpshard-test-build.XXXXXX)
( cargo test --workspace --no-run "$@" >"$build_log" 2>&1 || true
  cargo clippy --workspace --all-targets -- -D warnings >>"$build_log" 2>&1 ) &
build=$!
trap 'kill "$build" 2>/dev/null || true; rm -f "$build_log"' EXIT
hack/install-deps.sh --for test
linted=0
wait "$build" || linted=$?
trap - EXIT
if [ "$linted" != 0 ]; then
  grep -E -A12 '^(warning|error)' "$build_log" >&2 || cat "$build_log" >&2
  rm -f "$build_log"
  echo "test: cargo clippy --all-targets -- -D warnings fails (above)" >&2
  exit 1
fi
rm -f "$build_log"
export PATH="$root/bin:$PATH"
export KCPSHARD_BIN_DIR="$root/bin"
exec cargo test --workspace --no-fail-fast "$@"
