#!/usr/bin/env bash
# Fault matrix (docs/reliability.md, "A full disk under the store"), on real kcp: a KineSqlite shard
# whose whole state dir is a small tmpfs (default 150 MiB), filled by a file to within FREE_MIB
# (default 4) MiB once the shard is Ready. ConfigMaps of 64 KiB are then created through the front
# until REFUSED (default 8) in a row are refused; one ConfigMap is updated while the disk is full
# (with ?timeout=10s); the shard's conditions are printed.
#
# Then the file is removed, and every ConfigMap kcp answered 201 is read back through the front,
# and once more after kine is SIGKILLed and kcpshard has started it again. The script exits 1 if
# one that was answered 201 is missing or holds other data, or one that was refused exists.
#
# Usage: hack/faults/full-disk.sh       (root: it mounts a tmpfs; needs hack/install-deps.sh; ~2 minutes)
# Env: KCPSHARD=path/to/kcpshard (else `cargo build`), SIZE (tmpfs size, default 150m), FREE_MIB,
#      REFUSED, KEEP=1 (keep the logs).
# Takes /tmp/kcpshard-realkcp.lock so that real-kcp runs on this machine do not overlap.
set -euo pipefail
if [ -z "${KCPSHARD_REAL_KCP_LOCKED:-}" ]; then
  KCPSHARD_REAL_KCP_LOCKED=1 exec flock /tmp/kcpshard-realkcp.lock "$0" "$@"
fi
size=${SIZE:-150m}
free_mib=${FREE_MIB:-4}
refused=${REFUSED:-8}
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
source hack/versions.env
say() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }
if [ -z "${KCPSHARD:-}" ]; then cargo build -q --bin kcpshard; fi
ks=${KCPSHARD:-$root/target/debug/kcpshard}
kubectl=$root/bin/kubectl
for c in kine "kcp-$KCP_VERSION_NEWER" kubectl; do
  [ -x "bin/$c" ] || { echo "bin/$c is missing: run hack/install-deps.sh" >&2; exit 1; }
done
work=$(mktemp -d /tmp/kcpshard-full-disk-XXXXXX)
state=$work/state
mkdir -p "$state"
mount -t tmpfs -o "size=$size,mode=0700" tmpfs "$state" \
  || { echo "cannot mount a tmpfs on $state: this script needs root (CAP_SYS_ADMIN)" >&2; exit 1; }
export KUBECONFIG=$state/kubeconfig
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
serve=""

# Processes of this run: every one names the state dir in its argv.
ours() { ps -eo pid=,args= | grep -F -- "$state" | grep -v -e grep -e full-disk.sh || true; }

cleanup() {
  set +e
  rm -f "$state/filler"
  if [ -n "$serve" ] && kill -0 "$serve" 2>/dev/null; then
    "$kubectl" delete ks disk --timeout=90s >/dev/null 2>&1
    kill "$serve" 2>/dev/null; wait "$serve" 2>/dev/null
  fi
  for pid in $(ours | awk '{print $1}'); do kill -KILL "$pid" 2>/dev/null; done
  if [ -n "${KEEP:-}" ]; then
    mkdir -p "$work/kept"
    cp -r "$state/serve.log" "$state/shards/disk/store/kine.log" "$work/kept/" 2>/dev/null
    echo "logs kept in $work/kept" >&2
  fi
  umount -l "$state"
  [ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT

"$ks" serve --state-dir "$state" --api-listen 127.0.0.1:0 --kine-binary "$root/bin/kine" >>"$work/serve.log" 2>&1 &
serve=$!
for _ in $(seq 1 300); do
  [ -s "$state/kubeconfig" ] && "$kubectl" get ks >/dev/null 2>&1 && break
  sleep 0.1
done
cat <<EOF | "$kubectl" apply -f - >/dev/null
apiVersion: kcpshard.io/v1alpha1
kind: KcpShard
metadata: {name: disk}
spec:
  version: $KCP_VERSION_NEWER
  kcp: {binary: "$root/bin/kcp-{version}"}
  store: {type: KineSqlite}
  front: {type: Tcp, listen: "127.0.0.1:$port"}
EOF
started=$(date +%s)
"$ks" rollout status disk --timeout 600 >/dev/null
say "shard Ready in $(( $(date +%s) - started ))s; $(df -h --output=used,size "$state" | tail -1 | xargs) of the tmpfs used"

token=$(awk '/- name: shard-admin/{f=1} f&&/token:/{print $2; exit}' "$state/shards/disk/shared/admin.kubeconfig")
conditions() {
  "$kubectl" get ks disk -o json | python3 -c '
import json, sys
for c in json.load(sys.stdin)["status"]["conditions"]:
    print("  %s=%s %s: %s" % (c["type"], c["status"], c["reason"], c["message"]))' || true
}
# The ConfigMap names under kcp's keys in kine itself (not kcp's watch cache).
kine_names() {
  # kine's --listen-address: unix://<store>/kine.sock (or 127.0.0.1:PORT for a long path).
  local kine_address
  kine_address=$(python3 -c 'import json,sys; a=[a for a in json.load(open(sys.argv[1]))["args"] if a.startswith("--listen-address=")][0].split("=",1)[1]; print(a if a.startswith("unix://") else "http://"+a)' "$state/shards/disk/store/kine.json")
  "$root/bin/etcdctl" --endpoints="$kine_address" get --prefix /registry/ --keys-only 2>/dev/null \
    | grep "/configmaps/" | grep -o 'cm-[0-9]*$' >"$work/kine-names.txt" || true
}

# Fill the tmpfs to within free_mib MiB.
avail=$(df --output=avail -B1 "$state" | tail -1)
fill=$(( avail - free_mib * 1024 * 1024 ))
python3 -c "
import sys
with open(sys.argv[1], 'wb') as f:
    left = int(sys.argv[2])
    while left > 0:
        n = min(left, 1 << 20); f.write(b'\xa5' * n); left -= n
" "$state/filler" "$fill"
say "filled: $(df -h --output=avail "$state" | tail -1 | xargs) left"

TOKEN=$token python3 - "$port" "$refused" "$work" <<'PY'
import json, os, ssl, sys, time, http.client
port, refused_in_a_row, work = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
ctx = ssl._create_unverified_context()
base = "/clusters/root/api/v1/namespaces/default/configmaps"
def call(method, path, body=None, timeout=30):
    c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=timeout)
    t = time.time()
    c.request(method, path, body=json.dumps(body) if body else None,
              headers={"Authorization": "Bearer " + os.environ["TOKEN"], "Content-Type": "application/json"})
    r = c.getresponse(); data = r.read(); c.close()
    return r.status, data, time.time() - t
blob = "x" * (64 * 1024)
acked, refused, row, i = [], [], 0, 0
while row < refused_in_a_row and i < 400:
    name = f"cm-{i}"
    try:
        status, data, took = call("POST", base, {"apiVersion": "v1", "kind": "ConfigMap",
                                                 "metadata": {"name": name}, "data": {"n": str(i), "blob": blob}})
    except Exception as e:
        status, data, took = 0, repr(e).encode(), 0
    if status == 201:
        acked.append(name); row = 0
    else:
        message = data.decode(errors="replace")
        try: message = json.loads(message).get("message", message)
        except Exception: pass
        refused.append([name, status, message[:300], round(took, 2)]); row += 1
    i += 1
print(f"creates: {len(acked)} answered 201, {len(refused)} refused", file=sys.stderr)
for name, status, message, took in refused[:3]:
    print(f"  refused {name}: {status} in {took}s: {message}", file=sys.stderr)
update = None
if acked:
    status, data, _ = call("GET", f"{base}/{acked[0]}")
    cm = json.loads(data); cm["data"]["n"] = "updated"
    try:
        status, data, took = call("PUT", f"{base}/{acked[0]}?timeout=10s", cm, timeout=40)
        message = data.decode(errors="replace")
        try: message = json.loads(message).get("message", message)
        except Exception: pass
        update = [acked[0], status, message[:300], round(took, 2)]
    except Exception as e:
        update = [acked[0], 0, repr(e), 0]
    print(f"update of {update[0]} on the full disk: {update[1]} in {update[3]}s: {update[2][:200]}", file=sys.stderr)
json.dump({"acked": acked, "refused": refused, "update": update}, open(f"{work}/writes.json", "w"))
PY
say "conditions while the disk is full:"; conditions
kine_names
python3 - "$work" <<'PY'
import json, sys
writes = json.load(open(f"{sys.argv[1]}/writes.json"))
in_kine = set(open(f"{sys.argv[1]}/kine-names.txt").read().split())
print(f"  while full, in kine: {len(in_kine)} of the {len(writes['acked'])} answered 201", file=sys.stderr)
PY
grep -c "database or disk is full" "$state/shards/disk/store/kine.log" | sed 's/^/  kine.log lines with "database or disk is full": /' >&2 || true

rm -f "$state/filler"
say "space freed: $(df -h --output=avail "$state" | tail -1 | xargs) free"
check() {
  local rc=0
  TOKEN=$token python3 - "$port" "$work" "$1" <<'PY' || rc=1
import json, os, ssl, sys, time, http.client
port, work, when = int(sys.argv[1]), sys.argv[2], sys.argv[3]
ctx = ssl._create_unverified_context()
writes = json.load(open(f"{work}/writes.json"))
base = "/clusters/root/api/v1/namespaces/default/configmaps"
def get(name):
    deadline = time.time() + 60
    while True:
        try:
            c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
            c.request("GET", f"{base}/{name}", headers={"Authorization": "Bearer " + os.environ["TOKEN"]})
            r = c.getresponse(); data = r.read(); c.close()
            if r.status in (200, 404): return r.status, data
        except Exception:
            pass
        if time.time() > deadline: return None, b""
        time.sleep(0.5)
bad = []
for name in writes["acked"]:
    status, data = get(name)
    if status != 200: bad.append(f"{name} was answered 201 and now {status}")
    elif json.loads(data)["data"]["n"] not in (name.split("-")[1], "updated"): bad.append(f"{name} holds other data")
for name, *_ in writes["refused"]:
    status, _ = get(name)
    if status != 404: bad.append(f"{name} was refused and now {status}")
print(f"{when}, through kcp: {len(writes['acked'])} answered 201 read back, {len(writes['refused'])} refused absent; "
      f"{len(bad)} wrong" + "".join(f"\n  {b}" for b in bad[:10]), file=sys.stderr)
sys.exit(1 if bad else 0)
PY
  kine_names
  python3 - "$work" "$1" <<'PY' || rc=1
import json, sys
work, when = sys.argv[1], sys.argv[2]
writes = json.load(open(f"{work}/writes.json"))
in_kine = set(open(f"{work}/kine-names.txt").read().split())
missing = [n for n in writes["acked"] if n not in in_kine]
extra = [n for n, *_ in writes["refused"] if n in in_kine]
print(f"{when}, in kine: {len(in_kine)} keys; answered 201 but missing: {len(missing)} {missing[:5]}; "
      f"refused but there: {len(extra)} {extra[:5]}", file=sys.stderr)
sys.exit(1 if missing or extra else 0)
PY
  return $rc
}
ok=0
check "once space is freed" || ok=1
kine_pid=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' "$state/shards/disk/store/kine.json")
kill -KILL "$kine_pid"
say "kine (pid $kine_pid) SIGKILLed"
check "after kine was SIGKILLed and started again" || ok=1
say "kine runs again as pid $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' "$state/shards/disk/store/kine.json")"
say "sizes: $(du -sh "$state/shards/disk/store/state.db" "$state"/shards/disk/slots/*/kcp.log 2>/dev/null | awk '{printf "%s %s; ", $2, $1}')"
say "conditions at the end:"; conditions
exit $ok
