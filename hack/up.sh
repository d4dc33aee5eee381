#!/usr/bin/env bash
# The main command: install the components, build kcpshard, start `kcpshard serve` and apply
# manifests/dev.yaml, then follows the first start to Ready. Runs in the foreground.
# Ctrl-C stops `kcpshard serve` only: the shard's kine, kcp slots and front keep running and are
# adopted by the next `hack/up.sh`; `bin/kubectl delete kcpshard dev` (with the kubeconfig below)
# stops them.
# Env: KCPSHARD_STATE_DIR (default .kcpshard/), KCPSHARD_API_LISTEN (e.g. 127.0.0.1:6443).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
hack/install-deps.sh
export PATH="$root/bin:$PATH"
cargo build --release
state=${KCPSHARD_STATE_DIR:-$root/.kcpshard}
mkdir -p "$state"
kubeconfig=$state/kubeconfig
rm -f "$kubeconfig"   # written anew by serve; its appearance tells us the API is listening
args=(serve --state-dir "$state")
[ -n "${KCPSHARD_API_LISTEN:-}" ] && args+=(--api-listen "$KCPSHARD_API_LISTEN")
target/release/kcpshard "${args[@]}" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
trap 'exit 130' INT TERM
for _ in $(seq 1 600); do
  [ -s "$kubeconfig" ] && break
  kill -0 "$pid" 2>/dev/null || { echo "up: kcpshard serve exited before writing $kubeconfig" >&2; exit 1; }
  sleep 0.1
done
[ -s "$kubeconfig" ] || { echo "up: no $kubeconfig after 60s" >&2; exit 1; }
echo "up: applying manifests/dev.yaml, then following the first start to Ready (about a minute on 2 cores)" >&2
applied=""
for _ in $(seq 1 30); do
  if target/release/kcpshard apply -f manifests/dev.yaml --kubeconfig "$kubeconfig"; then applied=1; break; fi
  kill -0 "$pid" 2>/dev/null || { echo "up: kcpshard serve exited" >&2; exit 1; }
  sleep 1
done
[ -n "$applied" ] || { echo "up: applying manifests/dev.yaml failed" >&2; exit 1; }
# Follow the first start (store, front, slot a, readiness, front switch, probe) to Ready.
target/release/kcpshard rollout status dev --kubeconfig "$kubeconfig"
front_kubeconfig=$state/shards/dev/admin.kubeconfig
cat >&2 <<EOT
up: kcpshard is serving (pid $pid), state in $state
up: the shard:      KUBECONFIG=$kubeconfig $root/bin/kubectl get kcpshards
up: kcp, through the front at https://127.0.0.1:6443 (a kubeconfig whose server is the front):
up:                 KUBECONFIG=$front_kubeconfig $root/bin/kubectl --context root get workspaces
up:                 (contexts root and base: kcp-admin, kcpshard's admin identity, valid on every
up:                  slot and across rolls; system:admin: the shard admin;
up:                  a new identity: target/release/kcpshard credentials rotate dev --kubeconfig $kubeconfig)
up: roll it:        KUBECONFIG=$kubeconfig $root/bin/kubectl annotate ks dev kcpshard.io/restartedAt=\$(date +%s) --overwrite
EOT
wait "$pid"
