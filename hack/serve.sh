# Starting `kcpshard serve` on the development state dir, for hack/up.sh and hack/down.sh; sourced,
# not run. Before sourcing: root (the checkout). Defines state, say and die.
# Env: KCPSHARD_STATE_DIR (default .kcpshard/), KCPSHARD_API_LISTEN (the API's address; default
# 127.0.0.1:6440, not the front's 6443).

state=${KCPSHARD_STATE_DIR:-$root/.kcpshard}
say() { echo "$(basename "$0" .sh): $*" >&2; }
die() { say "$*"; exit 1; }

# What hack/up.sh builds (the dev profile).
kcpshard=$root/target/debug/kcpshard

# The pid of the serve running on $state that up.sh or down.sh started, if it still runs.
running_serve() {
  local pid
  pid=$(cat "$state/serve.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "kcpshard serve --state-dir $state" \
    && echo "$pid"
}

# Start serve in the background and wait until its API answers (it writes $state/kubeconfig
# then). Sets serve_pid.
start_serve() {
  local kubeconfig=$state/kubeconfig args=(serve --state-dir "$state")
  [ -n "${KCPSHARD_API_LISTEN:-}" ] && args+=(--api-listen "$KCPSHARD_API_LISTEN")
  mkdir -p "$state"
  rm -f "$kubeconfig"   # written anew by serve; its appearance tells us the API is listening
  "$kcpshard" "${args[@]}" &
  serve_pid=$!
  echo "$serve_pid" >"$state/serve.pid"
  for _ in $(seq 1 600); do
    [ -s "$kubeconfig" ] && return 0
    kill -0 "$serve_pid" 2>/dev/null || die "kcpshard serve exited before writing $kubeconfig (its output is above)"
    sleep 0.1
  done
  die "kcpshard serve wrote no $kubeconfig within 60s"
}

# SIGTERM a serve (not necessarily our child) and wait until it has exited.
stop_serve() {
  local pid=$1
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 300); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$state/serve.pid"; return 0; }
    sleep 0.1
  done
  die "kcpshard serve (pid $pid) did not exit within 30s of SIGTERM"
}
