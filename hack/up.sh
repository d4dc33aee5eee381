#!/usr/bin/env bash
# The main command: install what the development shard runs (hack/install-deps.sh --for up: the kcp
# release manifests/dev.yaml names, kine, kubectl), build kcpshard, start `kcpshard serve`, apply
# manifests/dev.yaml, follow the first start to Ready, and print the tour. serve runs in the
# foreground. Ctrl-C stops serve only: the shard's kine, kcp slot and front keep serving and are
# adopted by the next hack/up.sh. hack/down.sh stops them all.
# Env: KCPSHARD_STATE_DIR (default .kcpshard/), KCPSHARD_API_LISTEN (default 127.0.0.1:6440).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
source hack/serve.sh
source hack/versions.env
running=$(running_serve) && die "kcpshard serve already runs on $state (pid $running); hack/down.sh stops it"

# Build kcpshard while install-deps downloads and builds kcp and kine: much of a first install is
# downloads, which leave the CPU idle. The dev profile: it builds in 2.6 min alone on 2 cores
# (the release build took 7 min in a newcomer's first run), a development shard does not need the
# speed, and hack/test.sh reuses its dependencies.
build_log=$(mktemp -t kcpshard-up-build.XXXXXX)
trap 'rm -f "$build_log"' EXIT
say "building kcpshard (cargo build; a few minutes the first time)"
cargo build --bin kcpshard >"$build_log" 2>&1 &
build=$!
installed=0
hack/install-deps.sh --for up || installed=$?
built=0
wait "$build" || built=$?
[ "$built" = 0 ] || { cat "$build_log" >&2; die "cargo build failed (above)"; }
[ "$installed" = 0 ] || die "hack/install-deps.sh --for up failed (above)"
ln -sfn ../target/debug/kcpshard bin/kcpshard

start_serve
trap 'rm -f "$build_log"; kill -TERM $serve_pid 2>/dev/null; wait $serve_pid 2>/dev/null' EXIT
trap 'exit 130' INT TERM
say "applying manifests/dev.yaml, then following the first start to Ready (about a minute on 2 cores)"
applied=""
for _ in $(seq 1 30); do
  if "$kcpshard" apply -f manifests/dev.yaml --kubeconfig "$state/kubeconfig"; then applied=1; break; fi
  kill -0 "$serve_pid" 2>/dev/null || die "kcpshard serve exited (its output is above)"
  sleep 1
done
[ -n "$applied" ] || die "applying manifests/dev.yaml failed"
# Follow the first start (store, front, slot a, readiness, front switch, probe) to Ready.
"$kcpshard" rollout status dev --kubeconfig "$state/kubeconfig"

# The tour (the README's "A short tour" is this text): paths relative to the checkout when the state
# dir is in it.
rel_state=${state#"$root"/}
front=$(sed -n 's/^[[:space:]]*listen:[[:space:]]*\([^[:space:]#]*\).*/\1/p' manifests/dev.yaml | head -1)
cat >&2 <<EOT
up: dev is Ready. kcpshard serve (pid $serve_pid) runs here until Ctrl-C; the shard keeps serving
up: after it, and hack/down.sh stops everything. From another terminal:

    cd $root
    export PATH=\$PWD/bin:\$PATH KUBECONFIG=\$PWD/$rel_state/kubeconfig
    kubectl get ks                       # the shard: version, active slot, phase, Ready
    kubectl describe ks dev              # conditions, slots, the last roll's timings, events
    kubectl explain ks.spec.rollout      # every field is documented

    # kcp itself through the front ($front), as kcp-admin; the file and any copy of it work across rolls:
    kubectl --kubeconfig $rel_state/shards/dev/admin.kubeconfig --context root get workspaces
    kcpshard credentials rotate dev      # a new admin identity; the old one is retired

    # a roll: restart in place, and follow it
    kubectl annotate ks dev kcpshard.io/restartedAt="\$(date +%s)" --overwrite
    kcpshard rollout status dev

    # a roll to another kcp release: build it first (about 6 minutes on 2 cores); an older one must
    # be allowed (allowDowngrade), or the roll is refused with Degraded=True saying so
    hack/install-deps.sh kcp:$KCP_VERSION_OLDER
    kubectl patch ks dev --type merge -p '{"spec":{"version":"$KCP_VERSION_OLDER","rollout":{"allowDowngrade":true}}}'
    kcpshard rollout status dev

    hack/down.sh                         # stop serve and the shard; its data stays in $rel_state/

EOT
wait "$serve_pid"
