#!/usr/bin/env bash
# Fault matrix (docs/reliability.md): SIGKILL of `kcpshard serve` at a random moment of each of N
# rolls (default 20) of a real shard (KineSqlite, Tcp front). The rolls alternate a version change
# between the two pinned kcp releases (KCP_VERSION_NEWER <-> KCP_VERSION_OLDER, so half of them are
# downgrades, allowed by spec.rollout.allowDowngrade) and a restart request (the
# kcpshard.io/restartedAt annotation). For each roll: trigger it, wait a random 0..KILL_WINDOW
# seconds, SIGKILL serve, wait a random 0..3 s, start serve again on the same state dir, and wait
# for the roll to complete. A client polls /readyz through the front every 50 ms (a new connection
# each) the whole time.
#
# Before each roll a workspace is created through the front (the kubeconfig kcpshard writes for
# users, context root).
#
# Checks at the end (the script exits 1 if one fails): every roll completed (status.lastRoll of
# that roll has completedAt, Ready=True, Progressing=False, toVersion is the wanted one), exactly
# one slot in status and one kcp, one kine and one front process for the shard after each roll,
# every workspace created before a roll is there at the end (no data lost), no process of the
# shard left after it is deleted (orphans), and the poller's failures (0 is the target; the
# per-roll column counts them).
#
# Usage: hack/faults/serve-kill-rolls.sh [ROLLS]       (needs hack/install-deps.sh; ~15-25 minutes)
# Env: KCPSHARD=path/to/kcpshard (else `cargo build --release`), KILL_WINDOW (seconds, default 20),
#      SEED (for $RANDOM, default: the time), KEEP=1 (keep the state dir and logs).
# Takes /tmp/kcpshard-realkcp.lock so that real-kcp runs on this machine do not overlap.
set -euo pipefail
if [ -z "${KCPSHARD_REALKCP_LOCKED:-}" ]; then
  KCPSHARD_REALKCP_LOCKED=1 exec flock /tmp/kcpshard-realkcp.lock "$0" "$@"
fi
rolls=${1:-20}
window=${KILL_WINDOW:-20}
seed=${SEED:-$(date +%s)}
RANDOM=$seed
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
source hack/versions.env
say() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }
if [ -z "${KCPSHARD:-}" ]; then cargo build --release -q; fi
ks=${KCPSHARD:-$root/target/release/kcpshard}
kubectl=$root/bin/kubectl
for c in kine "kcp-$KCP_VERSION_NEWER" "kcp-$KCP_VERSION_OLDER" kubectl; do
  [ -x "bin/$c" ] || { echo "bin/$c is missing: run hack/install-deps.sh" >&2; exit 1; }
done
state=$(mktemp -d /tmp/kcpshard-serve-kill-XXXXXX)
export KUBECONFIG=$state/kubeconfig
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
serve=""
poller=""

# Processes of this run: every one names the state dir in its argv.
ours() { ps -eo pid=,args= | grep -F -- "$state/$1" | grep -v -e grep -e serve-kill-rolls || true; }
count() { ours "$1" | grep -c . || true; }

cleanup() {
  set +e
  [ -n "$poller" ] && kill "$poller" 2>/dev/null
  if [ -n "$serve" ] && kill -0 "$serve" 2>/dev/null; then
    "$kubectl" delete ks bench --timeout=90s >/dev/null 2>&1
    kill "$serve" 2>/dev/null; wait "$serve" 2>/dev/null
  fi
  # Anything still naming the state dir was started by this run: end it by pid.
  for pid in $(ours "" | awk '{print $1}'); do kill -KILL "$pid" 2>/dev/null; done
  if [ -n "${KEEP:-}" ]; then echo "state dir kept: $state" >&2; else rm -rf "$state"; fi
}
trap cleanup EXIT

start_serve() {
  rm -f "$state/kubeconfig"
  "$ks" serve --state-dir "$state/state" --api-listen 127.0.0.1:0 --kine-binary "$root/bin/kine" \
    >>"$state/serve.log" 2>&1 &
  serve=$!
  for _ in $(seq 1 300); do
    [ -s "$state/state/kubeconfig" ] && "$kubectl" --kubeconfig "$state/state/kubeconfig" get ks >/dev/null 2>&1 && break
    sleep 0.1
  done
  cp "$state/state/kubeconfig" "$state/kubeconfig"
}

# The shard as JSON, retried: serve may be starting.
shard_json() {
  for _ in $(seq 1 50); do
    "$kubectl" get ks bench -o json 2>/dev/null && return 0
    sleep 0.2
  done
  return 1
}

start_serve
cat <<EOF | "$kubectl" apply -f - >/dev/null
apiVersion: kcpshard.io/v1alpha1
kind: KcpShard
metadata: {name: bench}
spec:
  version: $KCP_VERSION_NEWER
  kcp: {binary: "$root/bin/kcp-{version}"}
  store: {type: KineSqlite}
  front: {type: Tcp, listen: "127.0.0.1:$port"}
  rollout: {allowDowngrade: true}
EOF
"$ks" rollout status bench --timeout 600 >/dev/null
say "shard Ready; seed $seed; $rolls rolls, serve SIGKILLed 0-${window}s after each trigger"

# The shard admin's token (persistent across slots), in the poller's environment, not its argv.
token=$(awk '/- name: shard-admin/{f=1} f&&/token:/{print $2; exit}' "$state/state/shards/bench/shared/admin.kubeconfig")
TOKEN=$token python3 - "$port" >"$state/poll.txt" <<'PY' &
import os, ssl, sys, time, http.client
port, token = int(sys.argv[1]), os.environ["TOKEN"]
ctx = ssl._create_unverified_context()
while True:
    t = time.time()
    try:
        c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=5)
        c.request("GET", "/readyz", headers={"Authorization": "Bearer " + token})
        r = c.getresponse(); r.read(); c.close()
        print(f"{t:.3f} {time.time()-t:.3f} {r.status}", flush=True)
    except Exception as e:
        print(f"{t:.3f} {time.time()-t:.3f} ERR {type(e).__name__}", flush=True)
    time.sleep(max(0, 0.05 - (time.time() - t)))
PY
poller=$!

# Helpers: the last phase a roll record has; whether the roll since $1 to version $2 is done; a
# done roll's duration and slot count.
cat >"$state/phase.py" <<'PY'
import json, sys
try:
    s = json.load(open(sys.argv[1]))
except Exception:
    print("unreadable"); sys.exit()
r = s.get("roll")
if not r:
    print("idle/complete"); sys.exit()
phases = ["startedAt", "newSlotStartedAt", "newSlotReadyAt", "frontSwitchedAt", "oldSlotStoppedListeningAt", "leaseReleasedAt", "probeSucceededAt", "oldSlotExitedAt"]
print(([p for p in phases if r.get(p)] or ["none"])[-1])
PY
cat >"$state/done.py" <<'PY'
import json, sys
from datetime import datetime
t = lambda v: datetime.fromisoformat(v.replace("Z", "+00:00"))
o = json.load(sys.stdin)
since, version = t(sys.argv[1]), sys.argv[2]
st = o.get("status", {})
r = st.get("lastRoll", {})
c = {x["type"]: x for x in st.get("conditions", [])}
ok = ("startedAt" in r and t(r["startedAt"]) >= since and r.get("completedAt") and r.get("toVersion") == version
      and c.get("Ready", {}).get("status") == "True" and c.get("Progressing", {}).get("status") == "False")
sys.exit(0 if ok else 1)
PY
cat >"$state/took.py" <<'PY'
import json, sys
from datetime import datetime
st = json.load(sys.stdin)["status"]
r = st["lastRoll"]
t = lambda k: datetime.fromisoformat(r[k].replace("Z", "+00:00")).timestamp()
print(f"{t('completedAt') - t('startedAt'):.1f} {len(st.get('slots', []))}")
PY

version=$KCP_VERSION_NEWER
failed_checks=0
: >"$state/rolls.txt"
printf '%-4s %-8s %-9s %7s %-18s %8s %8s\n' roll kind to killAt "phase at kill" "roll(s)" polls-bad
for i in $(seq 1 "$rolls"); do
  if [ $((i % 2)) -eq 1 ]; then
    kind=version
    if [ "$version" = "$KCP_VERSION_NEWER" ]; then version=$KCP_VERSION_OLDER; else version=$KCP_VERSION_NEWER; fi
    trigger() { "$kubectl" patch ks bench --type merge -p "{\"spec\":{\"version\":\"$version\"}}" >/dev/null; }
  else
    kind=restart
    trigger() { "$kubectl" annotate ks bench kcpshard.io/restartedAt="kill-$i-$(date +%s%N)" --overwrite >/dev/null; }
  fi
  # Data written before the roll, read back at the end.
  printf 'apiVersion: tenancy.kcp.io/v1alpha1\nkind: Workspace\nmetadata: {name: before-roll-%s}\n' "$i" |
    "$kubectl" --kubeconfig "$state/state/shards/bench/admin.kubeconfig" --context root create -f - >/dev/null
  since=$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ)
  t0=$(date +%s.%N)
  trigger
  delay=$(python3 -c "import random; random.seed($seed + $i); print(f'{random.uniform(0, $window):.2f}')")
  sleep "$delay"
  phase=$(python3 "$state/phase.py" "$state/state/shards/bench/controller.json")
  kill -KILL "$serve"; wait "$serve" 2>/dev/null || true
  sleep "$(python3 -c "import random; random.seed($seed * 7 + $i); print(f'{random.uniform(0, 3):.2f}')")"
  start_serve
  # Wait for this roll to complete.
  done_json=""
  for _ in $(seq 1 1200); do
    if json=$(shard_json) && python3 "$state/done.py" "$since" "$version" <<<"$json"; then
      done_json=$json; break
    fi
    sleep 0.5
  done
  t1=$(date +%s.%N)
  bad=$(awk -v a="$t0" -v b="$t1" '$1>=a && $1<=b && $3!="200"' "$state/poll.txt" | wc -l)
  if [ -z "$done_json" ]; then
    say "roll $i ($kind to $version) did NOT complete within 600 s"; failed_checks=$((failed_checks + 1))
    took=timeout
  else
    read -r took slots < <(python3 "$state/took.py" <<<"$done_json")
    [ "$slots" = 1 ] || { say "roll $i: $slots slots in status after the roll"; failed_checks=$((failed_checks + 1)); }
  fi
  printf '%-4s %-8s %-9s %6.2fs %-18s %8s %8s\n' "$i" "$kind" "$version" "$delay" "$phase" "$took" "$bad" | tee -a "$state/rolls.txt"
  # Process counts right after the roll: one kcp, one kine, one front.
  kcps=$(count "state/shards/bench/slots/"); kines=$(count "state/shards/bench/store"); fronts=$(count "state/shards/bench/front")
  if [ "$kcps" != 1 ] || [ "$kines" != 1 ] || [ "$fronts" != 1 ]; then
    sleep 5  # a stopping slot may still be exiting
    kcps=$(count "state/shards/bench/slots/"); kines=$(count "state/shards/bench/store"); fronts=$(count "state/shards/bench/front")
    if [ "$kcps" != 1 ] || [ "$kines" != 1 ] || [ "$fronts" != 1 ]; then
      say "roll $i: $kcps kcp, $kines kine, $fronts front processes (want 1 each):"; ours "state/shards/bench" >&2
      failed_checks=$((failed_checks + 1))
    fi
  fi
done

kill "$poller"; wait "$poller" 2>/dev/null || true; poller=""
missing=0
for i in $(seq 1 "$rolls"); do
  "$kubectl" --kubeconfig "$state/state/shards/bench/admin.kubeconfig" --context root get workspace "before-roll-$i" \
    >/dev/null 2>&1 || { say "DATA LOST: workspace before-roll-$i is gone"; missing=$((missing + 1)); }
done
[ "$missing" = 0 ] || failed_checks=$((failed_checks + 1))
total=$(wc -l <"$state/poll.txt"); bad=$(awk '$3!="200"' "$state/poll.txt" | wc -l)
slowest=$(sort -k2 -n "$state/poll.txt" | tail -1 | awk '{print $2}')
"$kubectl" delete ks bench --timeout=120s >/dev/null
sleep 2
left=$(ours "state/shards/bench" | grep -c . || true)
echo "rolls: $rolls, each with serve SIGKILLed and restarted (seed $seed)"
echo "/readyz through the front every 50 ms: $total polls, $bad failed, slowest answer ${slowest}s"
echo "workspaces created through the front before each roll: $rolls, missing at the end: $missing"
[ "$bad" = 0 ] || { echo "failed polls:"; awk '$3!="200"' "$state/poll.txt" | head -20; }
echo "processes of the shard left after it was deleted: $left"
[ "$left" = 0 ] || { ours "state/shards/bench"; failed_checks=$((failed_checks + 1)); }
echo "failed checks: $failed_checks"
[ "$failed_checks" = 0 ] && [ "$bad" = 0 ]
