#!/usr/bin/env bash
# Roll timings on real kcp and kine: starts `kcpshard serve` in a scratch state dir, applies a
# KcpShard (KineSqlite, front on a free loopback port), then performs N restart rolls
# (kcpshard.io/restartedAt) while a client polls /readyz through the front every 50 ms, and prints
# each roll's phases from status.lastRoll plus the poller's failures.
# Usage: hack/bench/rolls.sh [ROLLS]   (default 5; needs hack/install-deps.sh)
# Env: KCPSHARD=path/to/kcpshard to use a built binary instead of `cargo build --release`.
set -euo pipefail
rolls=${1:-5}
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
source hack/versions.env
if [ -z "${KCPSHARD:-}" ]; then cargo build --release -q; fi
ks=${KCPSHARD:-$root/target/release/kcpshard}
kubectl=$root/bin/kubectl
state=$(mktemp -d /tmp/kcpshard-bench-XXXXXX)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cleanup() {
  "$kubectl" --kubeconfig "$state/kubeconfig" delete ks bench --timeout=60s >/dev/null 2>&1 || true
  kill "${serve:-}" "${poller:-}" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$state"
}
trap cleanup EXIT
"$ks" serve --state-dir "$state" --api-listen 127.0.0.1:0 >"$state/serve.log" 2>&1 &
serve=$!
for _ in $(seq 1 100); do [ -s "$state/kubeconfig" ] && break; sleep 0.1; done
export KUBECONFIG=$state/kubeconfig
cat <<EOF | "$kubectl" apply -f - >/dev/null
apiVersion: kcpshard.io/v1alpha1
kind: KcpShard
metadata: {name: bench}
spec:
  version: $KCP_VERSION_NEWER
  kcp: {binary: "$root/bin/kcp-{version}"}
  store: {type: KineSqlite}
  front: {type: Tcp, listen: 127.0.0.1:$port}
EOF
start=$(date +%s.%N)
"$ks" rollout status bench --timeout 600 >/dev/null
echo "first start to Ready: $(python3 -c "print(f'{$(date +%s.%N)-$start:.1f}')") s"

# The shard admin's token: persistent across slots (kcp's .admin-token-store).
token=$(awk '/- name: shard-admin/{f=1} f&&/token:/{print $2; exit}' "$state/shards/bench/shared/admin.kubeconfig")
python3 - "$port" "$token" >"$state/poll.txt" <<'PY' &
import ssl, sys, time, http.client
port, token = int(sys.argv[1]), sys.argv[2]
ctx = ssl._create_unverified_context()
while True:
    t = time.time()
    try:
        c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=2)
        c.request("GET", "/readyz", headers={"Authorization": "Bearer " + token})
        r = c.getresponse(); body = r.read(); c.close()
        print(f"{t:.3f} {r.status}", flush=True)
    except Exception as e:
        print(f"{t:.3f} ERR {type(e).__name__}", flush=True)
    time.sleep(max(0, 0.05 - (time.time() - t)))
PY
poller=$!

printf '%-4s %8s %8s %8s %8s %8s %8s %8s %8s\n' roll started ready switch oldStop lease probe oldExit done
for i in $(seq 1 "$rolls"); do
  "$kubectl" annotate ks bench kcpshard.io/restartedAt="bench-$i-$(date +%s%N)" --overwrite >/dev/null
  sleep 1
  "$ks" rollout status bench --timeout 600 >/dev/null
  "$kubectl" get ks bench -o json | python3 -c '
import json, sys
from datetime import datetime
r = json.load(sys.stdin)["status"]["lastRoll"]
t = lambda k: datetime.fromisoformat(r[k].replace("Z", "+00:00")).timestamp()
s = t("startedAt")
keys = ["newSlotStartedAt", "newSlotReadyAt", "frontSwitchedAt", "oldSlotStoppedListeningAt", "leaseReleasedAt", "probeSucceededAt", "oldSlotExitedAt", "completedAt"]
print(f"{sys.argv[1]:<4} " + " ".join(f"{t(k)-s:8.2f}" for k in keys))
' "$i"
done
kill "$poller"; wait "$poller" 2>/dev/null || true
total=$(wc -l <"$state/poll.txt"); bad=$(grep -vc ' 200$' "$state/poll.txt" || true)
echo "columns: seconds after the roll began (status.lastRoll)"
echo "/readyz through the front every 50 ms during the rolls: $total polls, $bad failed"
grep -v ' 200$' "$state/poll.txt" | head -5 || true
