#!/usr/bin/env bash
# Fuzz every target under fuzz/ (cargo fuzz, libFuzzer) for a fixed time each; fails on a crash, a
# panic, or an input slower than 10 s. Usage: hack/fuzz.sh [seconds per target, default 60].
# `hack/fuzz.sh build` only builds every target (.ci/run does it at low priority beside the tests).
#
# - Installs cargo-fuzz into ~/.cargo/bin when it is missing (kept there across runs).
# - Stable Rust is enough: `--sanitizer=none` (the code under test is safe Rust, so AddressSanitizer
#   adds little and needs nightly) and `--dev` with optimised dependencies (fuzz/Cargo.toml), so
#   that a run after a change to kcpshard spends its time fuzzing, not compiling.
# - Builds in ${KCPSHARD_CACHE:-~/.cache/kcpshard}/fuzz/target, outside the checkout like the
#   components of hack/install-deps.sh: the first build on a machine compiles every dependency with
#   coverage instrumentation (about 20 min of CPU); later ones only kcpshard. The corpus grows in
#   .../fuzz/corpus/<target> across runs, seeded from the checked-in fuzz/seeds/<target>.
# - A crashing input is written to fuzz/artifacts/<target>/: reproduce it with `cd fuzz && cargo fuzz
#   run --dev --sanitizer=none --target-dir <cache>/fuzz/target <target> artifacts/<target>/<file>`,
#   then keep it in fuzz/seeds/<target>/regression-* and as a test next to the fix.
set -euo pipefail
seconds=${1:-60}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root/fuzz"
say() { echo "fuzz: $*" >&2; }

if ! cargo fuzz --version >/dev/null 2>&1; then
  say "installing cargo-fuzz (once; it stays in ~/.cargo/bin)"
  cargo install cargo-fuzz --locked --version 0.13.2
fi

# The versions kcpshard is built and tested with (cargo adds libfuzzer-sys to this copy).
cp "$root/Cargo.lock" Cargo.lock
cache=${KCPSHARD_CACHE:-$HOME/.cache/kcpshard}/fuzz
flags=(--dev --sanitizer=none --target-dir "$cache/target")
logs=$cache/logs
mkdir -p "$logs"
failed=0
for target in $(cargo fuzz list); do
  corpus=$cache/corpus/$target
  mkdir -p "$corpus" "seeds/$target"
  start=$(date +%s)
  cargo fuzz build "${flags[@]}" "$target"
  built=$(date +%s)
  if [ "$seconds" = build ]; then
    say "$target: built in $((built - start))s"
    continue
  fi
  log=$logs/$target.log
  # Every input in the corpus is replayed at the start of a run: keep it to the inputs that matter.
  if [ "$(ls "$corpus" | wc -l)" -gt 20000 ]; then
    say "$target: minimising the corpus ($(ls "$corpus" | wc -l) inputs)"
    cargo fuzz cmin "${flags[@]}" "$target" "$corpus" >"$log" 2>&1 || say "cmin failed (see $log); fuzzing anyway"
  fi
  if cargo fuzz run "${flags[@]}" "$target" "$corpus" "seeds/$target" -- \
      -max_total_time="$seconds" -timeout=10 -print_final_stats=1 >"$log" 2>&1; then
    result=ok
  else
    result=FAILED
    failed=1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
  say "$target: $result after $(($(date +%s) - built))s: ${runs:-?} executions (${rate:-?}/s), ${cov:-cov: ?}, corpus $(ls "$corpus" | wc -l) inputs; build $((built - start))s"
  if [ "$result" = FAILED ]; then
    grep -v -E '^#[0-9]+\s+(NEW|REDUCE|pulse|RELOAD)' "$log" | tail -60 >&2
    say "the crashing input is under $root/fuzz/artifacts/$target/ (full log: $log)"
  fi
done
exit "$failed"
