#!/usr/bin/env bash
# The front against haproxy, side by side in one run, on loopback: the same wrk load sent straight
# to a backend ("direct"), through `kcpshard front` ("front") and through haproxy in mode tcp with
# one thread ("haproxy"). Two backends:
#   synthetic  nginx (one process) over plain HTTP: `/` answers 200 with a 3-byte body, `/bulk.bin`
#              is a 16 MiB file. Plain HTTP on purpose: the cheaper each request is for client and
#              backend, the larger the proxy's share of the work, so this is where a proxy shows.
#   kcp        one real kcp (KCP_VERSION_NEWER) on kine over sqlite, over HTTPS as clients see it:
#              `/readyz` and a list of workspaces (10 of them) as the shard admin.
# Traffic: keep-alive (wrk -t1 -c16), a new connection per request (the same with
# `-H 'Connection: close'`), and bulk (wrk -t1 -c4 on the 16 MiB file, MB/s). Targets take turns
# (A B C, then B C A, ...) for ROUNDS rounds so that load from elsewhere falls on all alike; the
# table gives medians over rounds and the ratio of each proxy to direct and of the front to haproxy.
# Usage: hack/bench/front.sh                (needs hack/install-deps.sh; about 10 minutes)
# Env: ROUNDS (5), DURATION (seconds per wrk run, 5), CONNS (16), PARTS ("synthetic kcp"),
#      KCPSHARD=path (a built binary instead of `cargo build --release`), FRONT_THREADS (1),
#      FRONT_BASELINE=path (another kcpshard binary, benched as a fourth target "front-base", to
#      compare two builds in one run). The kcp token never reaches a command line or the output.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
source hack/versions.env
rounds=${ROUNDS:-5}
duration=${DURATION:-5}
conns=${CONNS:-16}
parts=${PARTS:-synthetic kcp}
say() { echo "front-bench: $*" >&2; }
die() { echo "front-bench: ERROR: $*" >&2; exit 1; }

QUIET=1 hack/install-deps.sh
export PATH="$root/bin:$PATH:/usr/sbin:/sbin"
for tool in nginx haproxy wrk python3; do command -v "$tool" >/dev/null || die "$tool is missing"; done

scratch=$(mktemp -d /tmp/kcpshard-bench-front-XXXXXX)
chmod 0700 "$scratch"
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 1 100); do
    local alive=""
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ -z "$alive" ] && break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$scratch"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The binaries under test are copied, so that a rebuild in target/ during the run changes nothing.
if [ -z "${KCPSHARD:-}" ]; then cargo build --release -q --bin kcpshard; fi
cp "${KCPSHARD:-$root/target/release/kcpshard}" "$scratch/kcpshard"
ks=$scratch/kcpshard
if [ -n "${FRONT_BASELINE:-}" ]; then cp "$FRONT_BASELINE" "$scratch/kcpshard-base"; fi

free_ports() {
  python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}
wait_port() {
  for _ in $(seq 1 100); do
    python3 -c 'import socket,sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 0.2)' "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  die "nothing listens on 127.0.0.1:$1 ($2)"
}
read -r nginx_port front_port haproxy_port haproxy_kcp_port base_port kine_port kcp_port <<<"$(free_ports 7)"

echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
echo "machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $(free -g | awk '/^Mem:/ {print $2}') GiB, $(uname -sr)"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "kcpshard: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src/front || echo " (with uncommitted changes in src/front)"), front --threads ${FRONT_THREADS:-1}"
echo "$(nginx -v 2>&1 | sed 's/^nginx version: //'), $(haproxy -v | head -1 | cut -d' ' -f1-3), $(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2)"
echo "wrk -t1 -c$conns (bulk -c4), ${duration}s per run, $rounds rounds, medians"
echo

# ---------------------------------------------------------------- nginx (synthetic backend)
mkdir -p "$scratch/nginx/www"
head -c $((16 << 20)) /dev/urandom >"$scratch/nginx/www/bulk.bin"
cat >"$scratch/nginx/nginx.conf" <<EOF
daemon off;
master_process off;
worker_processes 1;
pid $scratch/nginx/nginx.pid;
error_log $scratch/nginx/error.log warn;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path $scratch/nginx/body;
  proxy_temp_path $scratch/nginx/proxy;
  fastcgi_temp_path $scratch/nginx/fastcgi;
  uwsgi_temp_path $scratch/nginx/uwsgi;
  scgi_temp_path $scratch/nginx/scgi;
  keepalive_requests 10000000;
  sendfile on;
  tcp_nopush on;
  server {
    listen 127.0.0.1:$nginx_port;
    root $scratch/nginx/www;
    location = / { default_type text/plain; return 200 "ok\n"; }
  }
}
EOF
nginx -p "$scratch/nginx" -c "$scratch/nginx/nginx.conf" -e "$scratch/nginx/error.log" &
pids+=($!)
wait_port "$nginx_port" nginx

# ---------------------------------------------------------------- kcpshard front (and a baseline)
# Points a front at a backend through its control socket, as the controller does.
switch() {
  python3 - "$1/control.sock" "$2" "$3" <<'PY'
import json, socket, sys, time
path, slot, address = sys.argv[1:]
for _ in range(100):
    try:
        s = socket.socket(socket.AF_UNIX); s.connect(path); break
    except OSError:
        time.sleep(0.1)
else:
    sys.exit(f"no front answers on {path}")
s.sendall((json.dumps({"op": "switch", "slot": slot, "address": address}) + "\n").encode())
answer = json.loads(s.makefile().readline())
sys.exit(0 if answer.get("ok") else f"switch refused: {answer}")
PY
}
start_front() {
  local binary=$1 port=$2 dir=$3
  "$binary" front --listen "127.0.0.1:$port" --dir "$dir" --drain-timeout 1s --threads "${FRONT_THREADS:-1}" \
    >"$dir.log" 2>&1 &
  pids+=($!)
  switch "$dir" synthetic "127.0.0.1:$nginx_port"
}
start_front "$ks" "$front_port" "$scratch/front"
if [ -n "${FRONT_BASELINE:-}" ]; then start_front "$scratch/kcpshard-base" "$base_port" "$scratch/front-base"; fi

# ---------------------------------------------------------------- haproxy
cat >"$scratch/haproxy.cfg" <<EOF
global
  nbthread 1
  maxconn 8000
defaults
  mode tcp
  timeout connect 5s
  timeout client 1h
  timeout server 1h
listen synthetic
  bind 127.0.0.1:$haproxy_port
  server nginx 127.0.0.1:$nginx_port
listen kcp
  bind 127.0.0.1:$haproxy_kcp_port
  server kcp 127.0.0.1:$kcp_port
EOF
haproxy -db -f "$scratch/haproxy.cfg" >"$scratch/haproxy.log" 2>&1 &
pids+=($!)
wait_port "$haproxy_port" "haproxy; its log: $(cat "$scratch/haproxy.log")"

# ---------------------------------------------------------------- wrk
# One line per run, from wrk's done() hook: requests, duration (us), bytes, p50 and p99 latency
# (us), socket errors, non-2xx answers. The token comes from the environment, not the command line.
cat >"$scratch/report.lua" <<'EOF'
local token = os.getenv("BENCH_TOKEN")
if token and token ~= "" then wrk.headers["Authorization"] = "Bearer " .. token end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT %d %d %d %d %d %d %d\n", summary.requests, summary.duration, summary.bytes,
    latency:percentile(50), latency:percentile(99), e.connect + e.read + e.write + e.timeout, e.status))
end
EOF
results=$scratch/results.tsv
# bench PART KIND SCHEME PATH TARGETS...: ROUNDS rounds; each target is NAME=PORT.
bench() {
  local part=$1 kind=$2 scheme=$3 path=$4
  shift 4
  local targets=("$@") n=$# round i name port args out
  for round in $(seq 1 "$rounds"); do
    for i in $(seq 0 $((n - 1))); do
      IFS== read -r name port <<<"${targets[$(((i + round - 1) % n))]}"
      args=(-t1 -c"$conns" -d"${duration}s" --timeout 10s -s "$scratch/report.lua")
      case $kind in
        new-connection) args+=(-H 'Connection: close') ;;
        bulk) args=(-t1 -c4 -d"${duration}s" --timeout 10s -s "$scratch/report.lua") ;;
      esac
      out=$(wrk "${args[@]}" "$scheme://127.0.0.1:$port$path" 2>&1) || die "wrk failed: $out"
      grep '^RESULT' <<<"$out" | sed "s/^RESULT/$part\t$kind\t$name\t$round/; s/ /\t/g" >>"$results"
    done
  done
  say "$part $kind done (load $(cut -d' ' -f1 /proc/loadavg))"
}
warm() {
  local scheme=$1 path=$2 target
  shift 2
  for target in "$@"; do wrk -t1 -c4 -d1s -s "$scratch/report.lua" "$scheme://127.0.0.1:${target#*=}$path" >/dev/null 2>&1; done
}

targets=(direct="$nginx_port" front="$front_port" haproxy="$haproxy_port")
if [ -n "${FRONT_BASELINE:-}" ]; then targets+=(front-base="$base_port"); fi

if [[ " $parts " == *" synthetic "* ]]; then
  say "synthetic backend: nginx on $nginx_port, front on $front_port, haproxy on $haproxy_port"
  warm http / "${targets[@]}"
  bench synthetic keep-alive http / "${targets[@]}"
  bench synthetic new-connection http / "${targets[@]}"
  bench synthetic bulk http /bulk.bin "${targets[@]}"
fi

# ---------------------------------------------------------------- real kcp
if [[ " $parts " == *" kcp "* ]]; then
  kcp=$root/bin/kcp-$KCP_VERSION_NEWER
  [ -x "$kcp" ] || die "no $kcp (hack/install-deps.sh builds it)"
  mkdir -p "$scratch/kine" "$scratch/kcp"
  (cd "$scratch/kine" && exec "$root/bin/kine" \
    --endpoint="sqlite://$scratch/kine/state.db?_journal=WAL&cache=shared&_busy_timeout=30000" \
    --listen-address="127.0.0.1:$kine_port" --metrics-bind-address=0 --compact-interval=0) \
    >"$scratch/kine.log" 2>&1 &
  pids+=($!)
  wait_port "$kine_port" kine
  say "starting kcp $KCP_VERSION_NEWER on $kcp_port (kine over sqlite on $kine_port)"
  (cd "$scratch/kcp" && exec "$kcp" start --root-directory="$scratch/kcp" --bind-address=127.0.0.1 \
    --secure-port="$kcp_port" --etcd-servers="http://127.0.0.1:$kine_port") >"$scratch/kcp.log" 2>&1 &
  kcp_pid=$!
  pids+=("$kcp_pid")
  kubeconfig=$scratch/kcp/admin.kubeconfig
  ready=""
  for _ in $(seq 1 600); do
    kill -0 "$kcp_pid" 2>/dev/null || { tail -20 "$scratch/kcp.log" >&2; die "kcp exited during start-up"; }
    if [ -s "$kubeconfig" ] && [ "$(kubectl --kubeconfig "$kubeconfig" --context shard-base get --raw /readyz 2>/dev/null)" = ok ]; then
      ready=1
      break
    fi
    sleep 0.5
  done
  [ -n "$ready" ] || { tail -20 "$scratch/kcp.log" >&2; die "kcp not ready in 300 s"; }
  # Workspaces are created as kcp-admin (context base): the shard admin is system:masters, for
  # which the workspace admission records no owner.
  for i in $(seq -w 1 10); do
    printf -- '---\napiVersion: tenancy.kcp.io/v1alpha1\nkind: Workspace\nmetadata: {name: bench-%s}\n' "$i"
  done \
    | kubectl --kubeconfig "$kubeconfig" --context base --server "https://127.0.0.1:$kcp_port/clusters/root" \
      create -f - >/dev/null
  # The shard admin's token (persistent, system:masters), read into the environment only.
  BENCH_TOKEN=$(awk '/- name: shard-admin/{f=1} f&&/token:/{print $2; exit}' "$kubeconfig")
  [ -n "$BENCH_TOKEN" ] || die "no shard-admin token in $kubeconfig"
  export BENCH_TOKEN
  switch "$scratch/front" kcp "127.0.0.1:$kcp_port"
  if [ -n "${FRONT_BASELINE:-}" ]; then switch "$scratch/front-base" kcp "127.0.0.1:$kcp_port"; fi
  targets=(direct="$kcp_port" front="$front_port" haproxy="$haproxy_kcp_port")
  if [ -n "${FRONT_BASELINE:-}" ]; then targets+=(front-base="$base_port"); fi
  list=/clusters/root/apis/tenancy.kcp.io/v1alpha1/workspaces
  body=$(wrk -t1 -c1 -d1s -s "$scratch/report.lua" "https://127.0.0.1:$kcp_port$list" | awk '/^RESULT/ {print int($4 / $2)}')
  say "kcp ready; a list of 10 workspaces answers about $body bytes with headers"
  # Let kcp's start-up work settle: the workspaces initialized, then a few quiet seconds.
  kubectl --kubeconfig "$kubeconfig" --context base --server "https://127.0.0.1:$kcp_port/clusters/root" \
    wait --for=jsonpath='{.status.phase}'=Ready workspaces --all --timeout=120s >/dev/null \
    || say "the workspaces are not all Ready after 120 s; benching anyway"
  sleep 10
  warm https /readyz "${targets[@]}"
  warm https "$list" "${targets[@]}"
  bench kcp readyz-keep-alive https /readyz "${targets[@]}"
  bench kcp readyz-new-connection https /readyz "${targets[@]}"
  bench kcp list-keep-alive https "$list" "${targets[@]}"
  bench kcp list-new-connection https "$list" "${targets[@]}"
fi
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo

# ---------------------------------------------------------------- table
python3 - "$results" <<'PY'
import statistics, sys
from collections import defaultdict
runs = defaultdict(list)
for line in open(sys.argv[1]):
    part, kind, target, _round, reqs, dur, nbytes, p50, p99, errs, non2xx = line.split()
    reqs, dur, nbytes = int(reqs), int(dur), int(nbytes)
    runs[(part, kind, target)].append(dict(rps=reqs / dur * 1e6, mbs=nbytes / dur, p50=int(p50) / 1000,
                                           p99=int(p99) / 1000, errors=int(errs) + int(non2xx)))
med = statistics.median
keys = list(dict.fromkeys((p, k) for p, k, _ in runs))
print(f"{'part':<9} {'traffic':<21} {'target':<10} {'req/s':>7} {'min-max':>13} {'p50 ms':>7} {'p99 ms':>7} "
      f"{'MB/s':>6} {'/direct':>7} {'/haproxy':>8} {'errors':>6}")
for part, kind in keys:
    rows = {}
    for target in ["direct", "front", "haproxy", "front-base"]:
        rs = runs.get((part, kind, target))
        if rs:
            rps, mbs = med([r["rps"] for r in rs]), med([r["mbs"] for r in rs])
            rows[target] = dict(rs=rs, rps=rps, mbs=mbs, metric=mbs if kind == "bulk" else rps)
    for target, row in rows.items():
        rs = row["rs"]
        rel = lambda other: f"{row['metric'] / rows[other]['metric']:.2f}" if other in rows and other != target else ""
        span = f"{min(r['rps'] for r in rs):.0f}-{max(r['rps'] for r in rs):.0f}"
        print(f"{part:<9} {kind:<21} {target:<10} {row['rps']:7.0f} {span:>13} {med([r['p50'] for r in rs]):7.2f} "
              f"{med([r['p99'] for r in rs]):7.2f} {row['mbs']:6.0f} {rel('direct'):>7} "
              f"{rel('haproxy') if target.startswith('front') else '':>8} {sum(r['errors'] for r in rs):>6}")
print("\nreq/s, p50, p99, MB/s: medians over rounds; min-max: req/s over rounds; /direct, /haproxy: ratio of")
print("req/s (of MB/s for bulk); errors: socket errors plus non-2xx answers over all rounds.")
PY
