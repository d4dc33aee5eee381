#!/usr/bin/env bash
# What a second slot costs and what a client sees across slots, on one idle shard
# (hack/bench/common.sh's set-up, no load):
#   1. spec.slots 1, idle for --idle seconds: the RSS of each slot's kcp and its own kine
#      (KinePostgres: one kine per slot; KineSqlite: the shard's one kine, counted apart);
#   2. spec.slots 2 (patched), once both slots are ready and idle as long: the same;
#   3. with two slots, --writes times: a ConfigMap created through slot a's own port (the shard
#      admin's token, valid on every slot), then, on even writes, polled for through slot b's own
#      port (a GET every 10 ms), and on odd ones awaited on a watch opened on slot b before the
#      first write, with no GET beside it (a read through kine wakes its poll of the database):
#      how long after slot a answered 201 slot b's GET and slot b's watch see it (the cross-kine lag).
# Usage: hack/bench/slots-cost.sh [--store postgres|sqlite] [--idle SECONDS] [--writes N]
#   defaults: postgres, 30 s, 20 writes. Run alone, under the real-kcp lock.
# Env: KCPSHARD, ROLL_LOAD, KEEP as for roll.sh (hack/bench/common.sh).
set -euo pipefail
command_line="$*"
bench=slots-cost.sh
store=postgres
idle=30
writes=20
while [ $# -gt 0 ]; do
  case "$1" in
    --store) store=$2; shift 2 ;;
    --idle) idle=$2; shift 2 ;;
    --writes) writes=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "slots-cost.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$store" in sqlite|postgres) ;; *) echo "slots-cost.sh: --store must be postgres or sqlite" >&2; exit 2 ;; esac
source "$(dirname "$0")/common.sh"

# RSS (MiB, from /proc/PID/status VmRSS) of every slot's kcp and of its own kine, or the shard's one
# kine.
rss() { # label slots-json
  python3 - "$state" "$1" "$2" <<'PY'
import json, os, sys
state, label, slots = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
def rss(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
def argv(pid):
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
# A slot's own kine (KinePostgres) carries application_name=kcpshard-<shard>-<slot> in its endpoint;
# the shard's one kine (KineSqlite) names the state dir's database.
kines = {}
for p in filter(str.isdigit, os.listdir("/proc")):
    a = argv(p)
    if not os.path.basename(a.split(" ")[0]).startswith("kine"):
        continue
    slot = next((s["name"] for s in slots if f"application_name=kcpshard-bench-{s['name']}" in a), None)
    if slot is None and state in a:
        slot = "shard"
    if slot is not None:
        kines[slot] = rss(p)
rows = []
for s in slots:
    kcp = rss(s["pid"])
    rows.append({"slot": s["name"], "kcp": kcp, "kine": kines.get(s["name"])})
    print(f"{label}: slot {s['name']}: kcp {kcp:.0f} MiB" + (f", its kine {kines[s['name']]:.0f} MiB" if s["name"] in kines else ""))
if "shard" in kines:
    print(f"{label}: the shard's kine {kines['shard']:.0f} MiB")
print(json.dumps({"label": label, "slots": rows, "shardKine": kines.get("shard")}))
PY
}

# The cross-slot lag: writes through slot a, reads and a watch through slot b.
lag() { # slots-json
  python3 - "$state/shards/bench/admin.kubeconfig" "$1" "$writes" <<'PY'
import base64, http.client, json, ssl, sys, tempfile, threading, time
import yaml
kubeconfig, slots, writes = yaml.safe_load(open(sys.argv[1])), json.loads(sys.argv[2]), int(sys.argv[3])
ctx_name = "shard-base"
ctx = next(c["context"] for c in kubeconfig["contexts"] if c["name"] == ctx_name)
cluster = next(c["cluster"] for c in kubeconfig["clusters"] if c["name"] == ctx["cluster"])
user = next(u["user"] for u in kubeconfig["users"] if u["name"] == ctx["user"])
token = user["token"]
ca = tempfile.NamedTemporaryFile("wb", suffix=".crt", delete=False)
ca.write(base64.b64decode(cluster["certificate-authority-data"])); ca.close()
tls = ssl.create_default_context(cafile=ca.name)
tls.check_hostname = False  # each slot's own port: the certificate names the front's address
a, b = sorted(slots, key=lambda s: s["name"])[:2]
base = "/clusters/root/api/v1/namespaces/default/configmaps"
def request(port, method, path, body=None):
    c = http.client.HTTPSConnection("127.0.0.1", port, context=tls, timeout=10)
    c.request(method, path, body=json.dumps(body) if body else None,
              headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data
status, data = request(b["port"], "GET", base)
assert status == 200, (status, data[:200])
rv = json.loads(data)["metadata"]["resourceVersion"]
seen = {}
def watch():
    c = http.client.HTTPSConnection("127.0.0.1", b["port"], context=tls, timeout=600)
    c.request("GET", f"{base}?watch=1&resourceVersion={rv}", headers={"Authorization": f"Bearer {token}"})
    r = c.getresponse()
    while True:
        line = r.readline()  # through the chunked transfer coding
        if not line:
            return
        e = json.loads(line) if line.strip() else {}
        if e.get("type") == "ADDED":
            seen.setdefault(e["object"]["metadata"]["name"], time.time())
threading.Thread(target=watch, daemon=True).start()
time.sleep(1)
stamp = int(time.time())
gets, watches = [], []
for i in range(writes):
    name = f"lag-{stamp}-{i}"
    status, data = request(a["port"], "POST", base, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}})
    acked = time.time()
    assert status == 201, (status, data[:200])
    # Odd writes: the watch alone (a read through kine wakes kine's poll of the database at once,
    # so a GET poll beside it would hide the watch's own lag); even writes: a GET poll, then the watch.
    if i % 2 == 0:
        deadline = time.time() + 10
        while name not in seen and time.time() < deadline:
            time.sleep(0.005)
        watches.append(seen[name] - acked if name in seen else None)
        print(f"write {i + 1}: slot {b['name']}'s watch alone: "
              + (f"{watches[-1]:.3f} s" if watches[-1] is not None else "nothing within 10 s"), file=sys.stderr)
    else:
        while request(b["port"], "GET", f"{base}/{name}")[0] != 200:
            time.sleep(0.01)
        gets.append(time.time() - acked)
        print(f"write {i + 1}: slot {b['name']}'s GET: {gets[-1]:.3f} s", file=sys.stderr)
    time.sleep(0.37)  # writes fall at different points of kine's 1 s poll
def summary(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return "no write seen"
    return f"min {xs[0]:.3f}, median {xs[len(xs) // 2]:.3f}, p90 {xs[int(len(xs) * 0.9)]:.3f}, max {xs[-1]:.3f} s"
print(f"cross-slot lag, {writes} ConfigMaps created through slot {a['name']} (port {a['port']}):")
print(f"  slot {b['name']}'s GET (polled every 10 ms) sees it after: {summary(gets)} ({len(gets)} writes)")
print(f"  slot {b['name']}'s watch, with no GET beside it, sees it after: {summary(watches)}"
      f" ({len(watches)} writes, {sum(w is None for w in watches)} never)")
PY
}

start_shard "$store" 1
sleep "$idle"
one=$(wait_slots 1)
rss "slots 1, idle ${idle}s" "$one" | tee "$state/rss-1.txt"
"$kubectl" patch ks bench --type merge -p '{"spec":{"slots":2}}' >/dev/null
two=$(wait_slots 2)
sleep "$idle"
two=$(wait_slots 2)
rss "slots 2, idle ${idle}s" "$two" | tee "$state/rss-2.txt"
lag "$two"
echo "ended: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(uptime | sed 's/.*load/load/')" >>"$state/about.txt"
cat "$state/about.txt"
