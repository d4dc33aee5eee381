#!/usr/bin/env bash
# Store outage during a new slot's start-up (docs/reliability.md, "A slot that answers /readyz but
# not kcp's APIs"). Sets up a shard's store and a first kcp (slot a, which bootstraps the store and
# keeps serving, as the active slot of a roll does), then N times starts a new kcp (slot b, its root
# seeded with slot a's key material, the flags of src/slot/args.rs), takes the store away at one
# moment of that start-up for OUTAGE seconds, brings it back, and reports:
#   - whether the new kcp's /readyz turned ok (on its own port, as the shard admin), and when;
#   - whether it then serves kcp's own APIs: GET /clusters/root/apis/tenancy.kcp.io/v1alpha1/workspaces
#     (the status, kept polling for CHECK seconds after /readyz was ok), and whether root's
#     discovery lists tenancy.kcp.io;
#   - the outage's times, from the kcp's start.
#
# Usage: hack/faults/store-outage-during-start.sh KinePostgres|KineSqlite [N]
#   KinePostgres: one PostgreSQL, a kine per kcp (as kcpshard runs them); the outage stops
#                 PostgreSQL (fast shutdown) and starts it again on the same port.
#   KineSqlite:   one kine on a sqlite file; the outage SIGKILLs that kine and starts it again on
#                 the same port and file.
# Env: MOMENTS  the moments to cycle through, run i takes the (i mod count)-th (default: all):
#        start    the store is down when kcp starts (before its store connection)
#        crds     at "bootstrapping system CRDs"
#        informers at "finished bootstrapping the shard workspace" (kcp's informers are syncing)
#        phase0   at "bootstrapping root workspace phase 0" (the APIBindings of kcp's own APIs)
#        shard    at "Creating or updating Shard"
#        phase1   at "starting bootstrapping root workspace phase 1"
#        readyz   at "finished bootstrapping root workspace phase 1", the last step of the
#                 post-start hook kcp-start-informers, which is the last to finish: just before
#                 /readyz turns ok
#        none     no outage (a control)
#      OUTAGE (seconds, default 5), READY_TIMEOUT (default 120), CHECK (default 20), KEEP=1 (keep
#      the directory with every log).
# Exit status 1 when some run ended with /readyz ok but kcp's APIs not served (the broken state).
# Takes the machine's real-kcp lock (/tmp/kcpshard-realkcp.lock).
set -euo pipefail
lock=/tmp/kcpshard-realkcp.lock
if [ -z "${KCPSHARD_REALKCP_LOCKED:-}" ]; then
  KCPSHARD_REALKCP_LOCKED=1 exec flock "$lock" "$0" "$@"
fi
store=${1:?usage: $0 KinePostgres|KineSqlite [N]}
runs=${2:-20}
case $store in KinePostgres|KineSqlite) ;; *) echo "store kind $store: KinePostgres or KineSqlite" >&2; exit 2 ;; esac
read -r -a moments <<<"${MOMENTS:-start crds informers phase0 shard phase1 readyz}"
outage=${OUTAGE:-5}
ready_timeout=${READY_TIMEOUT:-120}
check=${CHECK:-20}
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$root/hack/versions.env"
bin=$root/bin
kcp=$bin/kcp-$KCP_VERSION_NEWER
for c in "kcp-$KCP_VERSION_NEWER" kine kubectl initdb postgres; do
  [ -x "$bin/$c" ] || { echo "$bin/$c is missing: run hack/install-deps.sh" >&2; exit 1; }
done
dir=$(mktemp -d /tmp/kcpshard-store-outage-XXXXXX)
chmod 755 "$dir"
say() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

pids=()   # every process this script started, ended by pid at exit
pg_pid="" kine_pid="" token=""
cleanup() {
  set +e
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  wait 2>/dev/null
  if [ -n "${KEEP:-}" ]; then echo "kept: $dir" >&2; else rm -rf "$dir"; fi
}
trap cleanup EXIT

# --- the store -------------------------------------------------------------------------------------
pg_port=$(free_port)
pg_start() {
  # PostgreSQL refuses root; setpriv execs it, so that $! is the postmaster.
  (cd "$dir/pg" && exec setpriv --reuid=postgres --regid=postgres --init-groups "$bin/postgres" \
    -D "$dir/pg/data" -p "$pg_port" -k "$dir/pg/sock" -c listen_addresses=127.0.0.1 -c fsync=off \
    -c synchronous_commit=off -c full_page_writes=off -c max_connections=200) >>"$dir/pg/postgres.log" 2>&1 &
  pg_pid=$!
  pids+=("$pg_pid")
  for _ in $(seq 1 200); do
    "$bin/psql" -h 127.0.0.1 -p "$pg_port" -U postgres -Atc 'select 1' >/dev/null 2>&1 && return
    sleep 0.05
  done
  echo "PostgreSQL did not start: $(tail -5 "$dir/pg/postgres.log")" >&2; exit 1
}
pg_stop() { kill -INT "$pg_pid"; wait "$pg_pid" 2>/dev/null || true; }

# kine_start NAME ENDPOINT PORT: starts a kine, sets kine_started to its pid once it accepts.
kine_start() {
  local name=$1 endpoint=$2 port=$3
  "$bin/kine" "--endpoint=$endpoint" "--listen-address=127.0.0.1:$port" --metrics-bind-address=0 \
    --compact-interval=0 >>"$dir/kine-$name.log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  for _ in $(seq 1 400); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then kine_started=$pid; return; fi
    sleep 0.025
  done
  echo "kine $name did not accept: $(tail -5 "$dir/kine-$name.log")" >&2; exit 1
}

sqlite_port=$(free_port)
if [ "$store" = KinePostgres ]; then
  mkdir -p "$dir/pg/sock" && chown -R postgres: "$dir/pg"
  (cd "$dir/pg" && setpriv --reuid=postgres --regid=postgres --init-groups "$bin/initdb" -D "$dir/pg/data" \
    -U postgres --auth=trust -E UTF8 --no-sync) >"$dir/pg/initdb.log" 2>&1
  pg_start
  # One kine per slot, each naming itself (application_name) as kcpshard's do.
  endpoint() { echo "postgres://postgres@127.0.0.1:$pg_port/kcp?sslmode=disable&application_name=outage-$1"; }
  store_down() { pg_stop; }
  store_up() { pg_start; }
else
  endpoint() { echo "sqlite://$dir/state.db?_journal=WAL&cache=shared&_busy_timeout=30000"; }
  kine_start shared "$(endpoint shared)" "$sqlite_port"
  kine_pid=$kine_started
  store_down() { kill -KILL "$kine_pid"; wait "$kine_pid" 2>/dev/null || true; }
  store_up() { kine_start shared "$(endpoint shared)" "$sqlite_port"; kine_pid=$kine_started; }
fi
# slot_store NAME: sets slot_etcd, the etcd URL for slot NAME: its own kine (KinePostgres, whose
# pid goes to slot_kine_pid) or the shared one.
slot_store() {
  slot_kine_pid=""
  if [ "$store" = KinePostgres ]; then
    local port
    port=$(free_port)
    kine_start "$1" "$(endpoint "$1")" "$port"
    slot_kine_pid=$kine_started
    slot_etcd="http://127.0.0.1:$port"
  else
    slot_etcd="http://127.0.0.1:$sqlite_port"
  fi
}

# --- kcp -------------------------------------------------------------------------------------------
front="https://127.0.0.1:$(free_port)"   # what every slot advertises; nothing listens there
# kcp_start ROOT PORT ETCD: the argv of src/slot/args.rs; sets kcp_pid.
kcp_start() {
  "$kcp" start "--root-directory=$1" --bind-address=127.0.0.1 "--secure-port=$2" "--etcd-servers=$3" \
    --enable-leader-election=true "--shard-base-url=$front" "--shard-external-url=$front" \
    --shutdown-delay-duration=1s >"$1/kcp.log" 2>&1 &
  kcp_pid=$!
  pids+=("$kcp_pid")
}
# As the shard admin on a slot's own port: curl with the token and CA of its kubeconfig.
# get ROOT PORT PATH: prints "<status> <first line of the body>".
get() {
  local kc=$1/admin.kubeconfig
  [ -s "$kc" ] || { echo "000 no kubeconfig yet"; return; }
  # The shard admin's token is the shard's (every slot's root is seeded with it).
  [ -n "$token" ] || token=$("$bin/kubectl" --kubeconfig "$kc" config view --raw \
    -o jsonpath='{.users[?(@.name=="shard-admin")].user.token}')
  local ca=$1/apiserver.crt
  curl -s -m 5 --cacert "$ca" -H "Authorization: Bearer $token" -o "$1/.body" -w '%{http_code}' \
    "https://127.0.0.1:$2$3" >"$1/.code" 2>/dev/null || true
  echo "$(cat "$1/.code") $(head -c 300 "$1/.body" 2>/dev/null | head -1)"
}
kcp_stop() {
  kill -TERM "$1" 2>/dev/null || true
  for _ in $(seq 1 150); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}
# wait_log FILE PATTERN TIMEOUT: returns once kcp has logged the line (0), or after TIMEOUT s (1).
# tail -F wakes on inotify and grep exits at the first match: the store goes away within a few
# milliseconds of the line, where polling the file every 20 ms lost the race for phase 0 at load 8.
wait_log() {
  local fifo=$dir/.log-lines rc=1
  rm -f "$fifo" && mkfifo "$fifo"
  tail -n +1 -F "$1" >"$fifo" 2>/dev/null &
  local tail_pid=$!
  if timeout "$3" grep -q -m1 -F -- "$2" <"$fifo"; then rc=0; fi
  kill "$tail_pid" 2>/dev/null || true
  wait "$tail_pid" 2>/dev/null || true
  return "$rc"
}

say "store $store (PostgreSQL on $pg_port or kine on $sqlite_port), kcp $KCP_VERSION_NEWER, dir $dir"
mkdir -p "$dir/a" "$dir/shared"
a_port=$(free_port)
slot_store a
t=$(now)
kcp_start "$dir/a" "$a_port" "$slot_etcd"
a_pid=$kcp_pid
until [ "$(get "$dir/a" "$a_port" /readyz)" = "200 ok" ]; do
  kill -0 "$a_pid" 2>/dev/null || { tail -20 "$dir/a/kcp.log" >&2; exit 1; }
  [ "$(since "$t" | cut -d. -f1)" -lt 300 ] || { echo "slot a not ready in 300 s" >&2; exit 1; }
  sleep 0.2
done
say "slot a ready in $(since "$t") s (fresh store)"
for f in apiserver.crt apiserver.key sa.key .admin-token-store admin.kubeconfig; do cp "$dir/a/$f" "$dir/shared/"; done

printf '%-4s %-9s %-9s %-15s %-9s %-8s %s\n' run moment outage readyz-ok served- discovery "first-answer-after-ready" >&2
printf '%-4s %-9s %-9s %-15s %-9s %-8s %s\n' "" "" "(s from start)" "(s from start)" "-at(s)" "tenancy" "" >&2
broken=0
declare -A tally
for i in $(seq 1 "$runs"); do
  moment=${moments[$(( (i - 1) % ${#moments[@]} ))]}
  b=$dir/b$i
  mkdir -p "$b" && chmod 700 "$b"
  for f in "$dir"/shared/* "$dir"/shared/.admin-token-store; do cp "$f" "$b/"; done
  b_port=$(free_port)
  slot_store "b$i"
  b_kine=$slot_kine_pid
  down_at="" up_at=""
  t=$(now)
  if [ "$moment" = start ]; then store_down; down_at=$(since "$t"); fi
  kcp_start "$b" "$b_port" "$slot_etcd"
  b_pid=$kcp_pid
  case $moment in
    crds) pattern="bootstrapping system CRDs" ;;
    informers) pattern="finished bootstrapping the shard workspace" ;;
    phase0) pattern="bootstrapping root workspace phase 0" ;;
    shard) pattern="Creating or updating Shard" ;;
    phase1) pattern="starting bootstrapping root workspace phase 1" ;;
    readyz) pattern="finished bootstrapping root workspace phase 1" ;;
    *) pattern="" ;;
  esac
  if [ -n "$pattern" ]; then
    if wait_log "$b/kcp.log" "$pattern" 120; then store_down; down_at=$(since "$t"); fi
  fi
  if [ -n "$down_at" ]; then
    sleep "$outage"
    store_up
    up_at=$(since "$t")
  fi
  ready_at="-"
  while [ "$(since "$t" | cut -d. -f1)" -lt "$ready_timeout" ]; do
    kill -0 "$b_pid" 2>/dev/null || { ready_at="exited"; break; }
    if [ "$(get "$b" "$b_port" /readyz)" = "200 ok" ]; then ready_at=$(since "$t"); break; fi
    sleep 0.2
  done
  served_at="-" first="" disc="-"
  if [[ $ready_at != - && $ready_at != exited ]]; then
    r=$(now)
    while :; do
      answer=$(get "$b" "$b_port" /clusters/root/apis/tenancy.kcp.io/v1alpha1/workspaces)
      [ -n "$first" ] || first=$answer
      if [ "${answer%% *}" = 200 ]; then served_at=$(since "$t"); break; fi
      [ "$(since "$r" | cut -d. -f1)" -lt "$check" ] || break
      sleep 0.5
    done
    d=$(get "$b" "$b_port" /clusters/root/apis)
    if grep -q '"tenancy.kcp.io"' "$b/.body"; then disc=yes; else disc="no(${d%% *})"; fi
  fi
  if [[ $ready_at != - && $ready_at != exited && $served_at = - ]]; then
    broken=$((broken + 1)); verdict=BROKEN
  elif [[ $ready_at = - || $ready_at = exited ]]; then verdict=not-ready
  else verdict=serving; fi
  tally[$moment/$verdict]=$(( ${tally[$moment/$verdict]:-0} + 1 ))
  printf '%-4s %-9s %-9s %-15s %-9s %-8s %s  %s\n' "$i" "$moment" "${down_at:--}-${up_at:--}" "$ready_at" \
    "$served_at" "$disc" "${first:0:60}" "$verdict"
  # What kcp logged about its bootstrap, for the record.
  grep -E 'failed to bootstrap|bootstrapped root workspace phase 0|finished bootstrapping root workspace phase 1|Updated Shard' "$b/kcp.log" \
    | sed 's/^/     /' | cut -c1-220 >"$b/bootstrap.txt" || true
  [ "$verdict" = serving ] || cat "$b/bootstrap.txt" >&2
  if [ "$verdict" = BROKEN ]; then
    # What the broken kcp serves: the APIBinding (a system CRD, read from the store: written by an
    # earlier kcp), a bound API (shards.core.kcp.io), a system CRD (logicalclusters), and a restart.
    binding=$(get "$b" "$b_port" /clusters/root/apis/apis.kcp.io/v1alpha2/apibindings/tenancy.kcp.io)
    phase=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["status"].get("phase"))' "$b/.body" 2>/dev/null || echo "?")
    shards=$(get "$b" "$b_port" /clusters/root/apis/core.kcp.io/v1alpha1/shards)
    lc=$(get "$b" "$b_port" /clusters/root/apis/core.kcp.io/v1alpha1/logicalclusters)
    echo "     broken kcp: APIBinding tenancy.kcp.io ${binding%% *} phase $phase; shards ${shards:0:40}; logicalclusters ${lc%% *}"
    kcp_stop "$b_pid"
    mv "$b/kcp.log" "$b/kcp-broken.log"
    r=$(now)
    kcp_start "$b" "$b_port" "$slot_etcd"
    b_pid=$kcp_pid
    again="-"
    while [ "$(since "$r" | cut -d. -f1)" -lt "$ready_timeout" ]; do
      if [ "$(get "$b" "$b_port" /readyz)" = "200 ok" ]; then
        again="readyz ok in $(since "$r") s, workspaces $(get "$b" "$b_port" /clusters/root/apis/tenancy.kcp.io/v1alpha1/workspaces | cut -c1-3)"
        break
      fi
      sleep 0.2
    done
    echo "     restarted: $again"
  fi
  kcp_stop "$b_pid"
  [ -n "$b_kine" ] && { kill -TERM "$b_kine" 2>/dev/null; wait "$b_kine" 2>/dev/null || true; }
  # slot a lives through every outage: wait until it serves again before the next run.
  r=$(now)
  until [ "$(get "$dir/a" "$a_port" /readyz)" = "200 ok" ]; do
    [ "$(since "$r" | cut -d. -f1)" -lt 180 ] || { echo "slot a did not serve again within 180 s" >&2; exit 1; }
    sleep 0.2
  done
done
echo "runs: $runs on $store, outage ${outage}s, kcp $KCP_VERSION_NEWER ($(date -u +%Y-%m-%dT%H:%MZ))"
for k in "${!tally[@]}"; do echo "  $k: ${tally[$k]}"; done | sort
echo "broken (readyz ok, tenancy.kcp.io workspaces not served within ${check}s): $broken"
[ "$broken" -eq 0 ]
