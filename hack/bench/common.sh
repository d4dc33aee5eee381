# Shared by the real-shard benchmarks (hack/bench/roll.sh, hack/bench/failover.sh); sourced, not run.
# It copies the binaries, starts `kcpshard serve` on a scratch state dir, applies the KcpShard "bench"
# (KineSqlite, KinePostgres with a PostgreSQL kcpshard runs itself, or Etcd: a one-member etcd the
# script runs), waits for Ready, starts
# examples/roll_load.rs through the front (a /readyz poller every 20 ms, 4 keep-alive and 4
# new-connection GET clients, 3 watches; a per-request timeline for hack/bench/plot.py), and stops
# everything it started again at exit.
#
# Before sourcing: `set -euo pipefail`, command_line (the script's arguments), bench (the script's
# name, for messages). Then per run: `start_shard STORE SLOTS [ROLLOUT_FIELDS] [KCP_FIELDS]`,
# `start_load`, `stop_load`, `wait_slots N`, `stop_run`; front_type=caddy puts caddy in front
# (default: kcpshard's own). Env: KCPSHARD and ROLL_LOAD: built
# binaries to use instead of `cargo build --release`; KEEP=1 keeps each state dir (logs, serve's and
# kcp's) after the run.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
source hack/versions.env
for c in bin/kubectl "bin/kcp-$KCP_VERSION_OLDER" "bin/kcp-$KCP_VERSION_NEWER" bin/kine; do
  [ -x "$c" ] || { echo "$bench: $c is missing: run hack/install-deps.sh" >&2; exit 1; }
done

# Copies of the binaries: builds by others in the shared target dir must not replace them mid-run.
bins=$(mktemp -d /tmp/kcpshard-bench-bin-XXXXXX)
if [ -z "${KCPSHARD:-}" ] || [ -z "${ROLL_LOAD:-}" ]; then
  cargo build --release -q --bin kcpshard --example roll_load
fi
target=${CARGO_TARGET_DIR:-target}
cp "${KCPSHARD:-$target/release/kcpshard}" "$bins/kcpshard"
cp "${ROLL_LOAD:-$target/release/examples/roll_load}" "$bins/roll_load"
ks=$bins/kcpshard
commit=$(git rev-parse --short HEAD 2>/dev/null || echo "unknown commit")
[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] && commit="$commit with uncommitted changes"
kubectl=$root/bin/kubectl

# The small print under a plot: the command, the kcpshard it ran, when.
made_by() { echo "hack/bench/$bench $command_line; kcpshard $commit; $(date -u '+%F %H:%M UTC')"; }
# The store's name in the spec, for titles.
store_type() { case "$1" in postgres) echo KinePostgres ;; sqlite) echo KineSqlite ;; etcd) echo Etcd ;; *) echo "$1" ;; esac; }

# The plotting venv (matplotlib, pinned in hack/versions.env), made on first use.
plot_python() {
  local venv=$HOME/.cache/kcpshard/venv-plot-$MATPLOTLIB_VERSION
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
    rm -rf "$venv"
    { python3 -m venv "$venv" && "$venv/bin/pip" install -q --disable-pip-version-check "matplotlib==$MATPLOTLIB_VERSION"; } >&2
  fi
  echo "$venv/bin/python"
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
now() { date +%s.%N; }

state=""
serve=""
etcd=""
caddy=""
load=""
front_port=""
keep_state=""
# Stops what one run started: the load, the shard (its finalizer stops the slots, kines, the front
# and a managed PostgreSQL), serve, an etcd store, a caddy front, then anything still naming the state dir in its argv.
stop_load() {
  [ -n "$load" ] && { kill -TERM "$load" 2>/dev/null || true; wait "$load" 2>/dev/null || true; }
  load=""
}
stop_run() {
  stop_load
  [ -n "$(type -t stop_extra)" ] && stop_extra
  if [ -n "$state" ] && [ -s "$state/kubeconfig" ] && [ -n "$serve" ] && kill -0 "$serve" 2>/dev/null; then
    "$kubectl" --kubeconfig "$state/kubeconfig" delete ks bench --timeout=120s >/dev/null 2>&1 || true
  fi
  [ -n "$serve" ] && { kill -TERM "$serve" 2>/dev/null || true; wait "$serve" 2>/dev/null || true; }
  serve=""
  [ -n "$etcd" ] && { kill -TERM "$etcd" 2>/dev/null || true; wait "$etcd" 2>/dev/null || true; }
  etcd=""
  [ -n "$caddy" ] && { kill -TERM "$caddy" 2>/dev/null || true; wait "$caddy" 2>/dev/null || true; }
  caddy=""
  if [ -n "$state" ]; then
    local pids
    pids=$(pgrep -f -- "$state" || true)
    if [ -n "$pids" ]; then
      echo "$bench: stopping processes left with $state in their argv:" >&2
      ps -o pid=,args= -p "$(echo $pids | tr ' ' ,)" | cut -c1-160 >&2 || true
      kill -CONT $pids 2>/dev/null || true
      kill -TERM $pids 2>/dev/null || true
      sleep 3
      kill -KILL $pids 2>/dev/null || true
    fi
    if [ -n "${KEEP:-}${keep_state:-}" ]; then echo "$bench: kept $state" >&2; else rm -rf "$state"; fi
    keep_state=""
  fi
  state=""
}
cleanup() {
  stop_run
  rm -rf "$bins"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Starts serve and a shard "bench" with STORE (sqlite|postgres|etcd) and SLOTS, waits for Ready. Extra
# YAML fields of spec.rollout and spec.kcp come as flow-map items ("a: b, c: d"). Sets state,
# front_port, KUBECONFIG; writes $state/about.txt.
start_shard() { # store slots [rollout fields] [kcp fields]
  local store=$1 slots=$2 rollout_fields=${3:-} kcp_fields=${4:-}
  state=$(mktemp -d /tmp/kcpshard-bench-XXXXXX)
  front_port=$(free_port)
  echo "=== $store, slots $slots: state $state, front 127.0.0.1:$front_port; $(uptime | sed 's/.*load/load/')" >&2
  {
    echo "command: hack/bench/$bench $command_line (store $store, slots $slots)"
    echo "kcpshard: $commit; kcp $KCP_VERSION_OLDER and $KCP_VERSION_NEWER, kine $KINE_VERSION"
    echo "machine: $(nproc) cores, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(free -g | awk '/^Mem:/ {print $2}') GiB"
    echo "began: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(uptime | sed 's/.*load/load/')"
  } >"$state/about.txt"
  # Debug lines of the controller name each step it plans (the old slot's SIGTERM time).
  RUST_LOG="info,kube_client::client::builder=off,kcpshard::controller=debug" NO_COLOR=1 \
    "$ks" serve --state-dir "$state" --api-listen 127.0.0.1:0 >"$state/serve.log" 2>&1 &
  serve=$!
  for _ in $(seq 1 300); do [ -s "$state/kubeconfig" ] && break; sleep 0.1; done
  [ -s "$state/kubeconfig" ] || { echo "$bench: serve wrote no kubeconfig; see $state/serve.log" >&2; exit 1; }
  export KUBECONFIG=$state/kubeconfig
  local store_spec
  if [ "$store" = postgres ]; then
    local pg_port; pg_port=$(free_port)
    (umask 077; python3 -c 'import secrets; print(secrets.token_hex(16))' >"$state/pgpass")
    store_spec="{type: KinePostgres, kinePostgres: {host: 127.0.0.1, port: $pg_port, database: kcp, user: kcp, passwordFrom: {file: $state/pgpass}, managed: true}}"
  elif [ "$store" = etcd ]; then
    # A one-member etcd of the pinned release, as a user runs beside kcp; stop_run stops it (its
    # argv names the state dir). A quota above etcd's 2 GiB default: kcp at 1,000 workspaces
    # writes more than that between etcd's compactions.
    local client_port peer_port; client_port=$(free_port); peer_port=$(free_port)
    "$root/bin/etcd" --name bench --data-dir "$state/etcd" \
      --listen-client-urls "http://127.0.0.1:$client_port" --advertise-client-urls "http://127.0.0.1:$client_port" \
      --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
      --initial-cluster "bench=http://127.0.0.1:$peer_port" --quota-backend-bytes 8589934592 >"$state/etcd.log" 2>&1 &
    etcd=$!
    for _ in $(seq 1 300); do
      "$root/bin/etcdctl" --endpoints "127.0.0.1:$client_port" endpoint health >/dev/null 2>&1 && break
      sleep 0.1
    done
    "$root/bin/etcdctl" --endpoints "127.0.0.1:$client_port" endpoint health >/dev/null 2>&1 ||
      { echo "$bench: etcd did not get healthy; see $state/etcd.log" >&2; exit 1; }
    store_spec="{type: Etcd, etcd: {endpoints: [\"http://127.0.0.1:$client_port\"]}}"
  else
    store_spec="{type: KineSqlite}"
  fi
  local front_spec="{type: Tcp, listen: \"127.0.0.1:$front_port\"}" caddy_admin=""
  if [ "${front_type:-tcp}" = caddy ]; then
    caddy_admin=127.0.0.1:$(free_port)
    front_spec="{type: Caddy, listen: \"127.0.0.1:$front_port\", caddy: {adminAddress: \"$caddy_admin\", upstreamId: kcp-proxy}}"
  fi
  local began; began=$(now)
  for _ in $(seq 1 30); do
    "$kubectl" apply -f - >/dev/null 2>&1 <<EOF && break
apiVersion: kcpshard.io/v1alpha1
kind: KcpShard
metadata: {name: bench}
spec:
  version: $KCP_VERSION_OLDER
  slots: $slots
  kcp: {binary: "$root/bin/kcp-{version}"${kcp_fields:+, $kcp_fields}}
  store: $store_spec
  front: $front_spec
  rollout: {allowDowngrade: true${rollout_fields:+, $rollout_fields}}
EOF
    sleep 1
  done
  if [ -n "$caddy_admin" ]; then
    start_caddy "$caddy_admin"
    # Until the controller's next look finds caddy, the shard still says it waits for it, which
    # ends `rollout status` at once.
    local deadline=$(($(date +%s) + 600))
    until "$ks" rollout status bench --timeout 600 >/dev/null 2>&1; do
      [ "$(date +%s)" -lt "$deadline" ] || { echo "$bench: not Ready through caddy in 600 s; see $state/serve.log" >&2; exit 1; }
      sleep 2
    done
  else
    "$ks" rollout status bench --timeout 600 >/dev/null
  fi
  echo "$store, slots $slots: first start to Ready: $(python3 -c "print(f'{$(now)-$began:.1f}')") s" >&2
}

# Caddy in front of the shard as docs/how-to/fronts.md sets it up: once the first slot has made the
# shard's certificate, its config from `kcpshard front caddy-config`, caddy (Debian's, on PATH) run
# with it; the controller then points caddy's upstream at the slot through the admin API.
start_caddy() { # admin_address
  local shared=$state/shards/bench/shared
  for _ in $(seq 1 3000); do [ -s "$shared/apiserver.key" ] && break; sleep 0.1; done
  [ -s "$shared/apiserver.key" ] || { echo "$bench: no slot made the shard's certificate; see $state/serve.log" >&2; exit 1; }
  mkdir -p "$state/caddy-home"
  "$ks" front caddy-config --listen "127.0.0.1:$front_port" --admin "$1" --upstream-id kcp-proxy \
    --cert "$shared/apiserver.crt" --key "$shared/apiserver.key" --storage "$state/caddy-home/storage" >"$state/caddy.json"
  HOME=$state/caddy-home XDG_CONFIG_HOME=$state/caddy-home/.config XDG_DATA_HOME=$state/caddy-home/.local/share \
    caddy run --config "$state/caddy.json" >"$state/caddy.log" 2>&1 &
  caddy=$!
}

# examples/roll_load.rs through the front; its counts go to $state/load.json, its per-request
# timeline to $state/timeline.csv once it stops.
start_load() {
  "$bins/roll_load" --kubeconfig "$state/shards/bench/admin.kubeconfig" --front "127.0.0.1:$front_port" \
    --json "$state/load.json" --timeline "$state/timeline.csv" >"$state/load.txt" 2>"$state/load.err" &
  load=$!
  sleep 5
  kill -0 "$load" 2>/dev/null || { echo "$bench: the load generator exited:" >&2; cat "$state/load.err" >&2; exit 1; }
}

# Fills the shard with up to N workspaces in root (`prod-00000`...), made through the front as
# kcpshard's admin identity in batches of 50 (one `kubectl create` each), each batch waited for
# until Ready before the next; stops adding after BUDGET seconds. Writes $state/fill.json and a
# line to $state/about.txt: how many got Ready, how long it took, the active slot's RSS and the
# store's size on disk after.
fill_workspaces() { # n budget_seconds
  python3 - "$kubectl" "$state" "$1" "$2" <<'PY' | tee -a "$state/about.txt" >&2
import json, subprocess, sys, time
kubectl, state, n, budget = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
k = [kubectl, "--kubeconfig", f"{state}/shards/bench/admin.kubeconfig", "--context", "root"]
began = time.time()
made, batches = 0, []
def ready():
    out = subprocess.run(k + ["get", "workspaces", "-o", "jsonpath={range .items[*]}{.metadata.name} {.status.phase}{'\\n'}{end}"],
                         capture_output=True, text=True).stdout
    return sum(1 for line in out.splitlines() if line.startswith("prod-") and line.endswith(" Ready"))
while made < n and time.time() - began < budget:
    size = min(50, n - made)
    docs = "".join(f"---\napiVersion: tenancy.kcp.io/v1alpha1\nkind: Workspace\nmetadata: {{name: prod-{made + i:05d}}}\n"
                   for i in range(size))
    t0 = time.time()
    r = subprocess.run(k + ["create", "-f", "-"], input=docs, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"fill: kubectl create failed: {r.stderr.strip()[:400]}")
    made += size
    created = time.time()
    while (seen := ready()) < made and time.time() - began < budget:
        time.sleep(1)
    batches.append({"made": made, "createSeconds": round(created - t0, 2), "readySeconds": round(time.time() - created, 2)})
    print(f"fill: {seen} workspaces Ready after {time.time() - began:.0f} s", file=sys.stderr)
seconds = time.time() - began
got = ready()
st = json.loads(subprocess.run([kubectl, "--kubeconfig", f"{state}/kubeconfig", "get", "ks", "bench", "-o", "json"],
                               capture_output=True, text=True).stdout)["status"]
rss = []
for s in st.get("slots", []):
    try:
        kib = next(int(l.split()[1]) for l in open(f"/proc/{s['pid']}/status") if l.startswith("VmRSS:"))
        rss.append(f"slot {s['name']} {kib / 1024:.0f} MiB")
    except (KeyError, OSError, StopIteration):
        pass
# The store's data on disk: kine's sqlite file, the managed PostgreSQL's cluster, or the etcd's dir.
import os
def size(path):
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs
               if os.path.isfile(os.path.join(d, f)))
store_dirs = [f"{state}/shards/bench/store/state.db", f"{state}/shards/bench/store/postgres/data", f"{state}/etcd"]
disk = sum(size(p) for p in store_dirs if os.path.exists(p))
json.dump({"asked": n, "made": made, "ready": got, "seconds": round(seconds, 1), "batches": batches,
           "storeBytes": disk}, open(f"{state}/fill.json", "w"))
creates = sum(b["createSeconds"] for b in batches)
print(f"prod-shaped: {got} of {n} workspaces Ready in {seconds:.0f} s ({creates:.0f} s in kubectl create, "
      f"batches of 50 waited for until Ready; budget {budget:.0f} s); kcp RSS after: {', '.join(rss) or '-'}; "
      f"store on disk: {disk / 2**20:.0f} MiB")
PY
}

# Waits (up to 600 s) until the shard has N slots, all ready and serving, one of them leading, and
# Ready=True; prints status.slots as JSON.
wait_slots() { # n
  python3 - "$kubectl" "$1" <<'PY'
import json, subprocess, sys, time
kubectl, n = sys.argv[1], int(sys.argv[2])
deadline = time.time() + 600
while time.time() < deadline:
    out = subprocess.run([kubectl, "get", "ks", "bench", "-o", "json"], capture_output=True, text=True)
    if out.returncode == 0:
        st = json.loads(out.stdout).get("status") or {}
        ready = {c["type"]: c["status"] for c in st.get("conditions", [])}.get("Ready") == "True"
        slots = st.get("slots", [])
        if (ready and len(slots) == n and all(s.get("ready") and s.get("serving") and s.get("pid") for s in slots)
                and sum(bool(s.get("leader")) for s in slots) == 1):
            print(json.dumps(slots))
            sys.exit(0)
    time.sleep(0.5)
sys.exit(f"the shard did not get to {n} ready, serving slots with one leading within 600 s")
PY
}
