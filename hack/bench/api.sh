#!/usr/bin/env bash
# API server figures over HTTPS against a release build: starts `kcpshard serve --controller=false`
# in a scratch state dir and runs examples/api_bench.rs against the kubeconfig it writes (GET and
# LIST p50/p99 with 1,000 events and a few KcpShards, a durable PATCH, the time for 100 watchers to
# all see one update, serve's RSS at each stage). Then the RSS of an idle default `serve` (the
# controller too) on an empty state dir. Prints the machine and its load first, for the record.
# Usage: hack/bench/api.sh [api_bench flags, e.g. --objects 1000 --samples 2000 --watchers 100]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
cargo build --release -q --bin kcpshard --example api_bench
ks=$root/target/release/kcpshard
bench=$root/target/release/examples/api_bench
scratch=$(mktemp -d /tmp/kcpshard-bench-api-XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$scratch"
}
trap cleanup EXIT

# Starts `kcpshard serve` on $1 with the rest as flags; sets $serve_pid once /readyz answers.
start_serve() {
  local state=$1
  shift
  "$ks" serve --state-dir "$state" --api-listen 127.0.0.1:0 "$@" >"$scratch/$(basename "$state").log" 2>&1 &
  serve_pid=$!
  pids+=("$serve_pid")
  for _ in $(seq 1 300); do
    [ -s "$state/kubeconfig" ] && "$ks" get --kubeconfig "$state/kubeconfig" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "serve on $state did not become ready; its log:" >&2
  cat "$scratch/$(basename "$state").log" >&2
  exit 1
}

vmrss() { awk '/^VmRSS:/ {print $2, $3}' "/proc/$1/status"; }

echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
echo "machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $(free -g | awk '/^Mem:/ {print $2}') GiB, $(uname -sr)"
echo "load before: $(uptime | sed 's/.*load average/load average/')"
echo "kcpshard: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src/apiserver Cargo.lock || echo " (with uncommitted changes in src/apiserver)")"
echo

start_serve "$scratch/api" --controller=false
echo "# serve --controller=false (pid $serve_pid)"
"$bench" --kubeconfig "$scratch/api/kubeconfig" --pid "$serve_pid" "$@"
echo

start_serve "$scratch/idle"
sleep 2
echo "# serve with the controller, empty state dir, idle 2 s: VmRSS $(vmrss "$serve_pid")"
echo "load after: $(uptime | sed 's/.*load average/load average/')"
