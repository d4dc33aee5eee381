#!/usr/bin/env bash
# Rolls of a real shard under load through the front. For each store (KineSqlite; KinePostgres with
# a PostgreSQL that kcpshard runs itself, `managed: true`; Etcd, a one-member etcd the script runs)
# and each --slots value:
# starts `kcpshard serve` on a scratch state dir, applies a KcpShard with spec.slots, waits for
# Ready, starts examples/roll_load.rs (a /readyz poller every 20 ms, 4 keep-alive and 4
# new-connection GET clients, 3 client-go-like watches, all through the front; hack/bench/common.sh
# holds this set-up), then makes N rolls: version changes between the two pinned kcp
# releases (hack/versions.env: odd rolls, up then down) and restarts (kcpshard.io/restartedAt: even
# rolls), each waited for until status.lastRoll.completedAt. It prints every roll's phases, the
# controller gap, the controller time beyond kcp's own (docs/benchmarks.md, "Rolls under load",
# defines it), the requests and failures by kind, and whether each target is met; and draws the run
# (requests and failures per 100 ms, each roll's phases) as a PNG with hack/bench/plot.py.
#
# With --clients, kept-alive loops of the clients users run join the load (hack/bench/clients/run.sh:
# Go's net/http Transport, Python's requests and http.client, curl; /readyz and the workspace list
# at 0, 1, 5, 20 and 100 ms between requests), and the report counts their ok, retried (asked again
# after the front closed a reused connection before any byte of an answer) and failed requests.
# With --workspaces N the shard is first filled with N workspaces (hack/bench/common.sh,
# fill_workspaces; at most --fill-budget seconds of it), as hack/bench/prod-shaped.sh does. With
# --preflight on|off spec.rollout.preflight is set, and each version roll's preflight (the times in
# status.preflight: startedAt, completedAt, result) is reported beside the roll. --readiness-timeout
# sets spec.rollout.readinessTimeout (a new slot's /readyz, and a preflight's /readyz and its
# controllers' take of their Lease each get it).
# Usage: hack/bench/roll.sh [--store sqlite|postgres|etcd|both|all] [--slots N[,N...]] [--rolls N]
#                           [--pause SECONDS] [--shutdown-delay DURATION] [--kcp-arg ARG]...
#                           [--clients] [--png DIR] [--workspaces N] [--fill-budget SECONDS]
#                           [--preflight on|off] [--readiness-timeout DURATION] [--front tcp|caddy]
#   defaults: both (sqlite and postgres; all adds etcd), slots 1, 10 rolls, 5 s between a roll's end and the next, spec.kcp.shutdownDelay unset
#   (kcpshard's default, 0s). --kcp-arg adds one argument to spec.kcp.extraArgs (repeatable), e.g.
#   `--kcp-arg --feature-gates=APIServerIdentity=false` (docs/how-to/upgrade.md, "A new slot that never
#   gets ready"). `--slots 2,1` runs slots 2, then slots 1, on each store, side by side in one report.
#   --png DIR writes roll-<store>-slots<N>.png there (default: the state dir, gone unless KEEP=1).
#   --front caddy puts Debian's caddy in front instead of kcpshard's own (docs/how-to/fronts.md).
# Needs hack/install-deps.sh (kcp, kine, kubectl, PostgreSQL). Run alone: kcp is heavy, and other
# real-kcp runs on the machine change the figures (e.g. `flock /tmp/kcpshard-realkcp.lock ...`).
# Env: KCPSHARD and ROLL_LOAD: built binaries to use instead of `cargo build --release`;
#      KEEP=1 keeps each state dir (logs, serve's and kcp's, the timeline) after the run.
set -euo pipefail
command_line="$*"
bench=roll.sh
stores=both
slot_counts=1
rolls=10
pause=5
shutdown_delay=""
kcp_args=""   # spec.kcp.extraArgs, as YAML flow items
clients=""
png_dir=""
workspaces=""
fill_budget=1800
preflight=""
readiness_timeout=""
while [ $# -gt 0 ]; do
  case "$1" in
    --store) stores=$2; shift 2 ;;
    --slots) slot_counts=$2; shift 2 ;;
    --rolls) rolls=$2; shift 2 ;;
    --pause) pause=$2; shift 2 ;;
    --shutdown-delay) shutdown_delay=$2; shift 2 ;;
    --kcp-arg) kcp_args+="\"$2\", "; shift 2 ;;
    --clients) clients=1; shift ;;
    --png) png_dir=$2; shift 2 ;;
    --front)
      case "$2" in tcp|caddy) front_type=$2 ;; *) echo "roll.sh: --front takes tcp or caddy" >&2; exit 2 ;; esac
      shift 2 ;;
    --workspaces) workspaces=$2; shift 2 ;;
    --fill-budget) fill_budget=$2; shift 2 ;;
    --preflight)
      case "$2" in on) preflight=true ;; off) preflight=false ;; *) echo "roll.sh: --preflight takes on or off" >&2; exit 2 ;; esac
      shift 2 ;;
    --readiness-timeout) readiness_timeout=$2; shift 2 ;;
    -h|--help) sed -n '2,38p' "$0"; exit 0 ;;
    *) echo "roll.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$stores" in
  both) stores="sqlite postgres" ;;
  all) stores="sqlite postgres etcd" ;;
  sqlite|postgres|etcd) ;;
  *) echo "roll.sh: --store must be sqlite, postgres, etcd, both (sqlite and postgres) or all" >&2; exit 2 ;;
esac
for n in ${slot_counts//,/ }; do
  case "$n" in 1|2|3) ;; *) echo "roll.sh: --slots takes 1, 2 or 3 (comma-separated)" >&2; exit 2 ;; esac
done
source "$(dirname "$0")/common.sh"

client_loops=""
stop_extra() {
  [ -n "$client_loops" ] && { kill -TERM "$client_loops" 2>/dev/null || true; wait "$client_loops" 2>/dev/null || true; }
  client_loops=""
}

# One line per roll (JSON) from status.lastRoll, the serve log (the moment StopSlot began, i.e. the
# old slot's SIGTERM) and the time the change was made. Waits for the roll to complete.
wait_roll() { # changed_at roll kind
  python3 - "$state" "$1" "$2" "$3" "$kubectl" <<'PY'
import json, re, subprocess, sys, time
sys.path.insert(0, "hack/bench")
from benchlib import klog_times, ts
state, changed, roll, kind, kubectl = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
deadline = time.time() + 900
while True:
    out = subprocess.run([kubectl, "--kubeconfig", f"{state}/kubeconfig", "get", "ks", "bench", "-o", "json"],
                         capture_output=True, text=True)
    if out.returncode == 0:
        o = json.loads(out.stdout)
        r = (o.get("status") or {}).get("lastRoll") or {}
        conditions = {c["type"]: c for c in o["status"].get("conditions", [])}
        ready = conditions.get("Ready", {}).get("status") == "True"
        if ts(r.get("startedAt")) and ts(r["startedAt"]) >= changed - 0.05 and r.get("completedAt") and ready:
            break
        # A roll kcpshard stopped (the new slot never got ready, or crashed): the old slot serves on.
        progressing = conditions.get("Progressing", {})
        if progressing.get("reason") == "RollBlocked" and (ts(progressing.get("lastTransitionTime")) or 0) >= changed - 1:
            print(f"roll {roll} ({kind}) stopped by kcpshard: {progressing.get('message')}", file=sys.stderr)
            sys.exit(3)
    if time.time() > deadline:
        sys.exit(f"roll {roll} did not complete within 900 s")
    time.sleep(0.5)
t = {k: ts(r.get(k)) for k in ["startedAt", "newSlotStartedAt", "newSlotReadyAt", "frontSwitchedAt",
                               "oldSlotStoppedListeningAt", "leaseReleasedAt", "probeSucceededAt",
                               "oldSlotExitedAt", "completedAt"]}
# serve logs each step it plans (kcpshard::controller=debug), then takes it at once: TerminateSlot
# sends the old slot SIGTERM, ReleaseLease hands the Lease to a new slot.
within = lambda x, a, b: x is not None and a is not None and b is not None and a <= x <= b
found = {}
ansi = re.compile(r"\x1b\[[0-9;]*m")
with open(f"{state}/serve.log", errors="replace") as f:
    for line in f:
        line = ansi.sub("", line)
        for step, key, lo, hi in (("TerminateSlot", "sigterm", "frontSwitchedAt", "oldSlotStoppedListeningAt"),
                                  ("ReleaseLease", "leaseDeleteSent", "oldSlotStoppedListeningAt", "leaseReleasedAt")):
            if key not in found and "planned" in line and f"step={step}" in line:
                at = ts(line.split()[0])
                if within(at, t[lo], t[hi]):
                    found[key] = at
                    name = re.search(r'name: "(\w+)"', line)
                    if name:
                        found["old"] = name.group(1)
t["sigterm"] = found.get("sigterm")
t["leaseDeleteSent"] = found.get("leaseDeleteSent")
# kcp's own account of the controllers' hand-over, from the slots' logs (klog, local time): the
# old slot stops leading when it stops listening, the new one leads at an election retry.
import os
slots = f"{state}/shards/bench/slots"
old = found.get("old")
lo = t["sigterm"] or t["frontSwitchedAt"]
t["oldStoppedLeading"] = next((x for x in klog_times(f"{slots}/{old}/kcp.log", '"stopped leading"')
                               if within(x, lo, t["oldSlotExitedAt"])), None)
# The slot that leads next: with several slots, any other one.
others = [d for d in (os.listdir(slots) if os.path.isdir(slots) else []) if d != old]
t["newLeads"] = min((x for d in others for x in klog_times(f"{slots}/{d}/kcp.log", '"Successfully acquired lease"')
                     if within(x, t["oldSlotStoppedListeningAt"], t["probeSucceededAt"])), default=None)
t["changedAt"] = changed
# The preflight of this version change, if one ran (spec.rollout.preflight; status.preflight).
p = (o.get("status") or {}).get("preflight") or {}
if ts(p.get("startedAt")) and ts(p["startedAt"]) >= changed - 0.05:
    t["preflightStartedAt"], t["preflightCompletedAt"] = ts(p["startedAt"]), ts(p.get("completedAt"))
print(json.dumps({"roll": int(roll), "kind": kind, "from": r.get("fromVersion"), "to": r.get("toVersion"),
                  "snapshot": bool(r.get("snapshot")), "preflight": p.get("result") if "preflightStartedAt" in t else None,
                  "t": t}))
span = lambda a, b: f"{t[b] - t[a]:.2f}" if t.get(a) is not None and t.get(b) is not None else "-"
print(f"roll {roll} ({kind} {r.get('fromVersion')} -> {r.get('toVersion')}): done in "
      f"{span('startedAt', 'completedAt')} s, gap {span('oldSlotExitedAt', 'probeSucceededAt')} s, "
      f"leaderless {span('oldSlotStoppedListeningAt', 'probeSucceededAt')} s",
      file=sys.stderr)
PY
}

# The table, the totals and the targets for one store.
report() { # store slots
  python3 - "$1" "$state/rolls.jsonl" "$state/load.json" "$rolls" "$state/about.txt" "$2" <<'PY'
import json, sys
store, rolls_file, load_file, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
slots = int(sys.argv[6])
rows = [json.loads(l) for l in open(rolls_file)]
if not rows:
    print(f"\n=== {store}: no roll completed ===")
    print(open(sys.argv[5]).read().strip())
    sys.exit(0)
load = json.load(open(load_file))
cols = ["newSlotStartedAt", "newSlotReadyAt", "frontSwitchedAt", "sigterm", "oldSlotStoppedListeningAt",
        "leaseDeleteSent", "leaseReleasedAt", "probeSucceededAt", "oldSlotExitedAt", "completedAt"]
print(f"\n=== {store}: {len(rows)} of {n} rolls completed; seconds after status.lastRoll.startedAt ===")
print(open(sys.argv[5]).read().strip())
if slots > 1:
    print(f"With slots {slots} a roll replaces the slots one at a time, the leading one last; status.lastRoll keeps"
          " the latest time of each kind, so the columns from 'slot started' on are the last replacement's, and"
          " the ones before it take the time up to 'slot started'. The controller column (which would count"
          " them) is left out.")
head = ("| roll | change | spec->start | slot started | ready | switched | SIGTERM old | old stopped listening | lease handed"
        " | lease released | probe Ready | old exited | done | gap | leaderless | kcp start-up | kcp stop listening"
        " | kcp takeover | controller | of it: settle |")
print(head)
print("|" + "---|" * (head.count("|") - 1))
gaps, leaderless, ctrl = [], [], []
for r in rows:
    t = r["t"]; s = t["startedAt"]
    rel = lambda k: f"{t[k]-s:.2f}" if t.get(k) is not None else "-"
    # A field a roll did not reach (or, with several slots, one the record does not carry) is "-".
    try:
        startup = t["newSlotReadyAt"] - t["newSlotStartedAt"]
        # The controller gap (old slot exit -> probe Ready; negative when a leader ran before the
        # old slot exited), and the time with no leader: from the old slot stopping listening (kcp
        # cancels its leader election then) to probe Ready.
        gap = t["probeSucceededAt"] - t["oldSlotExitedAt"]
        no_leader = t["probeSucceededAt"] - t["oldSlotStoppedListeningAt"]
        delete_sent = t.get("leaseDeleteSent") or t["leaseReleasedAt"]
        # kcp's takeover starts when the controller sends the Lease's hand-over (the request's own time is kcp's).
        takeover = t["probeSucceededAt"] - delete_sent
        if t.get("sigterm") is not None:
            stop_listening = t["oldSlotStoppedListeningAt"] - t["sigterm"]
            settle = t["sigterm"] - t["frontSwitchedAt"]
            # kcpshard's own time on the roll's path: starting the slot (snapshot, its kine), switching,
            # the settle wait, sending the hand-over once the old slot stopped listening, and finishing
            # after the probe and the old slot's exit (its kine's stop, the roll record).
            controller = ((t["newSlotStartedAt"] - s) + (t["frontSwitchedAt"] - t["newSlotReadyAt"]) + settle
                          + (delete_sent - t["oldSlotStoppedListeningAt"])
                          + (t["completedAt"] - max(t["probeSucceededAt"], t["oldSlotExitedAt"])))
        else:
            stop_listening = settle = controller = None
    except TypeError:
        startup = gap = no_leader = takeover = stop_listening = settle = controller = None
    if slots > 1:
        controller = None
    gaps.append(gap); leaderless.append(no_leader); ctrl.append(controller)
    change = r["kind"] if r["kind"] == "restart" else f"{r['from']}->{r['to']}"
    f2 = lambda v: f"{v:.2f}" if v is not None else "-"
    print(f"| {r['roll']} | {change} | {s - t['changedAt']:.2f} | " + " | ".join(rel(k) for k in cols)
          + f" | **{f2(gap)}** | **{f2(no_leader)}** | {f2(startup)} | {f2(stop_listening)} | {f2(takeover)} | "
          + (f"**{controller:.2f}**" if controller is not None else "-") + f" | {f2(settle)} |")
for r in rows:
    t = r["t"]
    if t.get("preflightStartedAt") is not None:
        took = (f"{t['preflightCompletedAt'] - t['preflightStartedAt']:.2f} s"
                if t.get("preflightCompletedAt") is not None else "not completed")
        removed = (f"; the roll's new slot started {t['newSlotStartedAt'] - t['preflightCompletedAt']:.2f} s after"
                   " its result (its removal)"
                   if t.get("preflightCompletedAt") is not None and t.get("newSlotStartedAt") is not None else "")
        print(f"roll {r['roll']}: preflight {r['preflight']} in {took}, started "
              f"{t['preflightStartedAt'] - t['changedAt']:.2f} s after the change (in spec->start){removed}")
# Each failure (and each retried first attempt) placed in its roll and phase.
from datetime import datetime
phases = [("startedAt", "start"), ("newSlotStartedAt", "new slot starting"), ("newSlotReadyAt", "ready, switching"),
          ("frontSwitchedAt", "switched, before SIGTERM"), ("sigterm", "old slot got SIGTERM, still listening"),
          ("oldSlotStoppedListeningAt", "old stopped listening, before the Lease hand-over"),
          ("leaseDeleteSent", "Lease hand-over in flight"), ("leaseReleasedAt", "lease released, before probe Ready"),
          ("probeSucceededAt", "probe Ready, stopping the old slot"), ("completedAt", None)]
def place(at):
    x = datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()
    for r in rows:
        t = r["t"]
        if t["startedAt"] <= x <= t["completedAt"]:
            name = "roll"
            for key, label in phases:
                if t.get(key) is not None and x >= t[key] and label:
                    name = label
            return r["roll"], name
    return None, "outside any roll"
per_roll = {}
for kind in ("failures", "retried"):
    places = {}
    for f in load.get(kind, []):
        roll, phase = place(f["at"])
        per_roll.setdefault((kind, roll), 0)
        per_roll[(kind, roll)] += 1
        key = (roll, phase, f["client"], f["path"], f["kind"], f["detail"][:90])
        places[key] = places.get(key, 0) + 1
    if places:
        print(f"\n{kind} by roll and phase:")
        for (roll, phase, client, path, k, detail), count in sorted(places.items(), key=lambda i: (i[0][0] or 0, i[0][1:])):
            print(f"  roll {roll}: {phase}: {count} x {client} {path}: {k}: {detail}")
print("failed / retried per roll: " + ", ".join(
    f"{r['roll']}: {per_roll.get(('failures', r['roll']), 0)}/{per_roll.get(('retried', r['roll']), 0)}" for r in rows)
    + f"; outside rolls: {per_roll.get(('failures', None), 0)}/{per_roll.get(('retried', None), 0)}")
req, failed = load["requests"], load["failed"]
print(f"\nload ({load['seconds']:.0f} s): {req:,} requests, {failed} failed; by kind: "
      + ", ".join(f"{k} {v}" for k, v in load["failedByKind"].items())
      + f"; keep-alive GETs retried after a broken connection: {len(load.get('retried', []))}"
      + f"; poller ticks skipped: {load.get('pollsSkipped', 0)}")
for c, v in load["clients"].items():
    print(f"  {c:<15} {v['requests']:>7,} requests, {v['failed']} failed, p50 {v['p50_ms']:.1f} ms, p99 {v['p99_ms']:.1f} ms, max {v['max_ms']:.1f} ms")
w = load["watch"]
print(f"  watches: {w['lists']} lists, {w['watches']} watch requests, {w['relists410']} re-lists after 410, "
      f"streams ended by the server {w['streamsEndedByServer']}, cut {sum(w['streamsCut'].values())} {w['streamsCut']}, events {w['events']}")
print("\nthe controllers' hand-over, seconds (kcp's logs):")
print("| roll | old stopped listening -> old stopped leading | Lease hand-over sent -> new slot leads | new slot leads -> probe Ready | no leader (old stopped leading -> new leads) | new slot leads -> old exited |")
print("|---|---|---|---|---|---|")
for r in rows:
    t = r["t"]
    d = lambda a, b: f"{t[b] - t[a]:.2f}" if t.get(a) is not None and t.get(b) is not None else "-"
    print(f"| {r['roll']} | {d('oldSlotStoppedListeningAt', 'oldStoppedLeading')} | {d('leaseDeleteSent', 'newLeads')} | "
          f"{d('newLeads', 'probeSucceededAt')} | {d('oldStoppedLeading', 'newLeads')} | {d('newLeads', 'oldSlotExitedAt')} |")
ok = lambda b: "met" if b else "MISSED"
print(f"\ntargets ({store}):")
print(f"  0 failures in at least 10,000 requests: {ok(failed == 0 and req >= 10000)} ({failed} of {req:,})")
gaps = [g for g in gaps if g is not None] or [float("nan")]
leaderless = [g for g in leaderless if g is not None] or [float("nan")]
print(f"  controller gap (old slot exit -> probe Ready) at most 2.5 s in every roll: {ok(max(gaps) <= 2.5)} "
      f"(min {min(gaps):.2f}, max {max(gaps):.2f}; {sum(g > 2.5 for g in gaps)} of {len(gaps)} rolls above)")
print(f"  the same from the old slot stopping listening (no leader from then on): {ok(max(leaderless) <= 2.5)} "
      f"(min {min(leaderless):.2f}, max {max(leaderless):.2f}; {sum(g > 2.5 for g in leaderless)} of {len(leaderless)} rolls above)")
known = [c for c in ctrl if c is not None]
if known:
    print(f"  at most 1 s of controller time per roll: {ok(max(known) <= 1.0)} "
          f"(min {min(known):.2f}, max {max(known):.2f}; {sum(c > 1.0 for c in known)} of {len(known)} rolls above)")
PY
}

client_report() { # clients.json
  python3 - "$1" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
print("\nkept-alive clients (ok / retried / failed):")
print(f"{'client':20} {'path':10} " + " ".join(f"{str(c) + ' ms':>18}" for c in (0, 1, 5, 20, 100)))
cells = {}
for r in rows:
    if "error" in r:
        print(f"{r['client']}: no result ({r['error']})")
        continue
    path = "readyz" if r["path"] == "/readyz" else "list"
    cells[(r["client"], path, r["cadenceMs"])] = r
for client in sorted({k[0] for k in cells}):
    for path in ("readyz", "list"):
        row = [cells.get((client, path, c)) for c in (0, 1, 5, 20, 100)]
        print(f"{client:20} {path:10} " + " ".join(
            f"{r['ok']:>8}/{r['retried']:>3}/{r['failed']:>3}" if r else f"{'-':>18}" for r in row))
failed = [r for r in cells.values() if r["failed"]]
print(f"failed: {sum(r['failed'] for r in failed)}, retried: {sum(r['retried'] for r in cells.values())}")
for r in failed:
    print(f"  {r['client']} {r['path']} {r['cadenceMs']} ms: {r['failures']}")
PY
}

run_store() { # sqlite|postgres slots
  local store=$1 slots=$2
  local rollout="${preflight:+preflight: $preflight}"
  [ -n "$readiness_timeout" ] && rollout+="${rollout:+, }readinessTimeout: \"$readiness_timeout\""
  start_shard "$store" "$slots" "$rollout" \
    "${shutdown_delay:+shutdownDelay: \"$shutdown_delay\"}${shutdown_delay:+${kcp_args:+, }}${kcp_args:+extraArgs: [${kcp_args%, }]}"
  [ -n "$workspaces" ] && fill_workspaces "$workspaces" "$fill_budget"
  start_load
  if [ -n "$clients" ]; then
    hack/bench/clients/run.sh --front "127.0.0.1:$front_port" --kubeconfig "$state/shards/bench/admin.kubeconfig" \
      --out "$state/clients" >"$state/clients.log" 2>&1 &
    client_loops=$!
  fi
  : >"$state/rolls.jsonl"
  local i kind version changed
  for i in $(seq 1 "$rolls"); do
    changed=$(now)
    if [ $((i % 2)) -eq 1 ]; then
      # Odd rolls change the version: up on 1, 5, 9, ..., down on 3, 7, ...
      if [ $((i % 4)) -eq 1 ]; then version=$KCP_VERSION_NEWER; else version=$KCP_VERSION_OLDER; fi
      kind=version
      "$kubectl" patch ks bench --type merge -p "{\"spec\":{\"version\":\"$version\"}}" >/dev/null
    else
      kind=restart
      "$kubectl" annotate ks bench kcpshard.io/restartedAt="roll-$i-$(date +%s%N)" --overwrite >/dev/null
    fi
    if ! wait_roll "$changed" "$i" "$kind" >>"$state/rolls.jsonl" 2>"$state/roll-$i.err"; then
      cat "$state/roll-$i.err" >&2
      echo "roll $i of $rolls did not complete: $(cat "$state/roll-$i.err")" >>"$state/about.txt"
      failed_runs="$failed_runs $store/slots$slots"
      keep_state=1
      break
    fi
    cat "$state/roll-$i.err" >&2
    sleep "$pause"
  done
  stop_load
  if [ -n "$clients" ]; then
    kill -TERM "$client_loops"; wait "$client_loops" || true
    client_loops=""
    client_report "$state/clients/clients.json" >>"$state/clients.txt"
    cat "$state/clients.txt" >&2
  fi
  echo "ended: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(uptime | sed 's/.*load/load/')" >>"$state/about.txt"
  cat "$state/load.txt" >&2
  report "$store, slots $slots" "$slots" | tee "$state/report.txt"
  reports+=("$state/report.txt")
  plot_rolls "$store" "$slots"
  # The report outlives the state dir, for the side-by-side summary at the end.
  cp "$state/report.txt" "$bins/report-$store-$slots.txt"
  reports[-1]=$bins/report-$store-$slots.txt
  stop_run
}

# The run as a picture: requests and failures per 100 ms, each roll's phases marked.
plot_rolls() { # store slots
  local out=${png_dir:-$state}/roll-$1-slots$2.png
  mkdir -p "$(dirname "$out")"
  python3 - "$state/rolls.jsonl" >"$state/marks.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line); t = r["t"]
    print(json.dumps({"from": t["startedAt"], "to": t["completedAt"], "label": f"roll {r['roll']}"}))
    if t.get("preflightStartedAt") and t.get("preflightCompletedAt"):
        print(json.dumps({"from": t["preflightStartedAt"], "to": t["preflightCompletedAt"], "kind": "preflight",
                          "label": "preflight"}))
    for key, label in (("newSlotReadyAt", "new slot ready"), ("frontSwitchedAt", "front switched"),
                       ("oldSlotExitedAt", "old slot exited")):
        if t.get(key):
            print(json.dumps({"at": t[key], "label": label}))
PY
  "$(plot_python)" hack/bench/plot.py --timeline "$state/timeline.csv" --marks "$state/marks.jsonl" \
    --title "$(roll_title "$1" "$2")" --made-by "$(made_by)" --out "$out" >&2
}

roll_title() { # store slots
  local rolls; rolls=$(wc -l <"$state/rolls.jsonl")
  [ "$rolls" = 1 ] && rolls="A roll" || rolls="$rolls rolls"
  local through="the front"
  [ "${front_type:-tcp}" = caddy ] && through=caddy
  echo "$rolls ${workspaces:+at $workspaces workspaces }under load through $through ($(store_type "$1"), slots $2)"
}

failed_runs=""
reports=()
for store in $stores; do
  for slots in ${slot_counts//,/ }; do
    run_store "$store" "$slots"
  done
done
if [ "${#reports[@]}" -gt 1 ]; then
  echo; echo "=== side by side (one session) ==="
  for r in "${reports[@]}"; do
    grep -E '^=== |^load \(|^  0 failures|^  controller gap' "$r"
  done
fi
if [ -n "$failed_runs" ]; then
  echo "roll.sh: a roll did not complete on:$failed_runs (see the report above)" >&2
  exit 1
fi
