#!/usr/bin/env bash
# Moves of a serving shard's data between stores under load through the front (docs/how-to/stores.md,
# "Move a shard to another store"). For each --workspaces value: starts a KineSqlite shard (one
# slot), fills it with that many workspaces (0: as it comes up; hack/bench/common.sh,
# fill_workspaces), starts examples/roll_load.rs (a /readyz poller every 20 ms, keep-alive and
# new-connection GETs, watches), then moves its data into a PostgreSQL kcpshard runs (managed), and
# back into KineSqlite (the first state.db moved aside, as the user would). For each move it prints
# the phases from the events (mirror started, copy done and the slot on the new store started, the
# switch, switched, complete), status.migration (copied keys, write pause), the requests and
# failures by kind in each move, and draws the run (requests and failures per 100 ms, each move's
# phases) as a PNG with hack/bench/plot.py.
# Usage: hack/bench/move.sh [--workspaces N[,N...]] [--fill-budget SECONDS] [--png DIR]
#   defaults: --workspaces 0, --fill-budget 1800; `--workspaces 0,400` runs both, side by side.
# Run alone (`flock /tmp/kcpshard-realkcp.lock hack/bench/move.sh`). Env as roll.sh: KCPSHARD,
# ROLL_LOAD (built binaries), KEEP=1.
set -euo pipefail
command_line="$*"
bench=move.sh
sizes=0
fill_budget=1800
png_dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --workspaces) sizes=$2; shift 2 ;;
    --fill-budget) fill_budget=$2; shift 2 ;;
    --png) png_dir=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "move.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
source "$(dirname "$0")/common.sh"

# Patches spec.store to $2 and waits (up to 1800 s) for status.migration to say Complete; prints
# one JSON line: the move's status.migration and the times of its events.
move_to() { # label store-json
  python3 - "$kubectl" "$state" "$1" "$2" <<'PY'
import json, subprocess, sys, time
sys.path.insert(0, "hack/bench")
from benchlib import ts
kubectl, state, label, store = sys.argv[1:5]
k = [kubectl, "--kubeconfig", f"{state}/kubeconfig"]
asked = time.time()
subprocess.run(k + ["patch", "ks", "bench", "--type", "merge", "-p", json.dumps({"spec": {"store": store and json.loads(store)}})],
               check=True, capture_output=True)
deadline = asked + 1800
while True:
    o = json.loads(subprocess.run(k + ["get", "ks", "bench", "-o", "json"], capture_output=True, text=True).stdout or "{}")
    m = (o.get("status") or {}).get("migration") or {}
    if (ts(m.get("startedAt")) or 0) >= asked - 1 and m.get("phase") in ("Complete", "Failed"):
        break
    if time.time() > deadline:
        sys.exit(f"{label}: the move did not end within 1800 s: {m}")
    time.sleep(0.5)
events = json.loads(subprocess.run(k + ["get", "events", "-o", "json"], capture_output=True, text=True).stdout)["items"]
at = {}
for e in events:
    when = ts(e.get("eventTime") or e.get("lastTimestamp"))
    if when and when >= asked - 1 and e.get("reason", "").startswith(("Migration", "Mirror")):
        at.setdefault(e["reason"], when)
print(json.dumps({"label": label, "askedAt": asked, "migration": m, "events": at}))
s = lambda r: f"{at[r] - asked:.1f}" if r in at else "-"
print(f"{label}: {m.get('phase')} in {(ts(m.get('completedAt')) or time.time()) - asked:.1f} s; mirror started {s('MirrorStarted')} s, "
      f"copy done and slot started {s('MigrationCaughtUp')} s, switch {s('MigrationSwitching')} s, switched "
      f"{s('MigrationSwitched')} s; {m.get('copiedKeys')} keys, write pause {m.get('writePause')}", file=sys.stderr)
PY
}

report() { # size
  python3 - "$1" "$state/moves.jsonl" "$state/load.json" "$state/about.txt" <<'PY'
import json, sys
from datetime import datetime
size, moves_file, load_file, about = sys.argv[1:5]
rows = [json.loads(l) for l in open(moves_file)]
load = json.load(open(load_file))
print(f"\n=== {size} workspaces: {len(rows)} moves; seconds after the patch ===")
print(open(about).read().strip())
keys = ["MirrorStarted", "MigrationCaughtUp", "MigrationSwitching", "MigrationSwitched", "MigrationComplete"]
print("| move | mirror started | copied, new slot started | switch began | switched | complete | keys copied | write pause | failed requests |")
print("|---|---|---|---|---|---|---|---|---|")
def within(f, r):
    x = datetime.fromisoformat(f["at"].replace("Z", "+00:00")).timestamp()
    return r["askedAt"] <= x <= r["events"].get("MigrationComplete", r["askedAt"] + 1e9)
for r in rows:
    ev, m = r["events"], r["migration"]
    rel = lambda k: f"{ev[k] - r['askedAt']:.1f}" if k in ev else "-"
    failed = sum(1 for f in load.get("failures", []) if within(f, r))
    print(f"| {r['label']} | " + " | ".join(rel(k) for k in keys) + f" | {m.get('copiedKeys')} | {m.get('writePause')} | {failed} |")
# Each failure placed in its move and phase, counted.
phases = [("MigrationStarted", "copying"), ("MigrationCaughtUp", "new slot starting, following"),
          ("MigrationSwitching", "switching"), ("MigrationSwitched", "switched, old store stopping")]
places = {}
for r in rows:
    for f in load.get("failures", []):
        if within(f, r):
            x = datetime.fromisoformat(f["at"].replace("Z", "+00:00")).timestamp()
            phase = next((label for key, label in reversed(phases) if r["events"].get(key, 1e18) <= x), "asked")
            key = (r["label"], phase, f["client"], f["path"], f["kind"], f["detail"][:90])
            places[key] = places.get(key, 0) + 1
for (label, phase, client, path, kind, detail), count in places.items():
    print(f"  {label}: {phase}: {count} x {client} {path}: {kind}: {detail}")
print(f"load ({load['seconds']:.0f} s): {load['requests']:,} requests, {load['failed']} failed; by kind: "
      + ", ".join(f"{k} {v}" for k, v in load["failedByKind"].items()))
for c, v in load["clients"].items():
    print(f"  {c:<15} {v['requests']:>7,} requests, {v['failed']} failed, p50 {v['p50_ms']:.1f} ms, p99 {v['p99_ms']:.1f} ms, max {v['max_ms']:.1f} ms")
w = load["watch"]
print(f"  watches: {w['lists']} lists, {w['relists410']} re-lists after 410, events {w['events']}")
PY
}

plot_moves() { # size
  local out=${png_dir:-$state}/move-$1-workspaces.png
  mkdir -p "$(dirname "$out")"
  python3 - "$state/moves.jsonl" >"$state/marks.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line); ev = r["events"]
    print(json.dumps({"from": r["askedAt"], "to": ev.get("MigrationComplete", r["askedAt"]), "label": r["label"]}))
    for key, label in (("MigrationCaughtUp", "copied, new slot started"), ("MigrationSwitching", "switch began"),
                       ("MigrationSwitched", "switched")):
        if key in ev:
            print(json.dumps({"at": ev[key], "label": label}))
PY
  "$(plot_python)" hack/bench/plot.py --timeline "$state/timeline.csv" --marks "$state/marks.jsonl" \
    --title "Moves of the data under load, KineSqlite -> PostgreSQL -> KineSqlite, $1 workspaces" \
    --made-by "$(made_by)" --out "$out" >&2
}

reports=()
for size in ${sizes//,/ }; do
  start_shard sqlite 1
  [ "$size" -gt 0 ] && fill_workspaces "$size" "$fill_budget"
  start_load
  : >"$state/moves.jsonl"
  pg_port=$(free_port)
  (umask 077; python3 -c 'import secrets; print(secrets.token_hex(16))' >"$state/pgpass")
  postgres="{\"type\": \"KinePostgres\", \"kinePostgres\": {\"host\": \"127.0.0.1\", \"port\": $pg_port, \"database\": \"kcp\", \"user\": \"kcp\", \"passwordFrom\": {\"file\": \"$state/pgpass\"}, \"managed\": true}}"
  sleep 10
  move_to "KineSqlite -> PostgreSQL" "$postgres" >>"$state/moves.jsonl"
  sleep 10
  # Back: the old state.db is the data as it left; the user moves it aside once satisfied.
  for f in state.db state.db-wal state.db-shm; do
    [ -e "$state/shards/bench/store/$f" ] && mv "$state/shards/bench/store/$f" "$state/shards/bench/store/$f.old"
  done
  move_to "PostgreSQL -> KineSqlite" '{"type": "KineSqlite", "kinePostgres": null}' >>"$state/moves.jsonl"
  sleep 10
  stop_load
  echo "ended: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(uptime | sed 's/.*load/load/')" >>"$state/about.txt"
  report "$size" | tee "$state/report.txt"
  plot_moves "$size"
  cp "$state/report.txt" "$bins/report-$size.txt"
  reports+=("$bins/report-$size.txt")
  stop_run
done
if [ "${#reports[@]}" -gt 1 ]; then
  echo; echo "=== side by side (one session) ==="
  for r in "${reports[@]}"; do grep -E '^=== |^\| [KP]|^load \(' "$r"; done
fi
