#!/usr/bin/env bash
# Stop what hack/up.sh started: every shard's front, kcp slots and store processes, then
# `kcpshard serve`. It deletes the KcpShard objects to do so (the controller stops a deleted shard's
# processes); their data stays in the state dir, so the next hack/up.sh starts dev again on it
# (re-apply any other shard's YAML to do the same for it). Delete the state dir to start from nothing.
# Env: KCPSHARD_STATE_DIR (default .kcpshard/), KCPSHARD_API_LISTEN (as for hack/up.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
source hack/serve.sh
[ -d "$state" ] || { say "no state dir $state: nothing to stop"; exit 0; }
[ -x "$kcpshard" ] || die "no $kcpshard to stop the shards with: run hack/up.sh (or cargo build) first"

# The shards' processes outlive serve; a serve stops them. Use the one that runs, or start one.
serve_pid=$(running_serve) || start_serve
kubeconfig=$state/kubeconfig
names=$("$kcpshard" get -o name --kubeconfig "$kubeconfig")
for name in $names; do
  name=${name##*/}
  say "deleting KcpShard $name: its front, slots and store stop; its data stays"
  "$kcpshard" delete "$name" --kubeconfig "$kubeconfig"
done
stop_serve "$serve_pid"
say "stopped. Left in $state: each shard's data (shards/<name>/store), key material and logs, and the API's files; hack/up.sh starts dev again on them, rm -rf $state forgets them"
