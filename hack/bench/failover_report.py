"""The figures of one hack/bench/failover.sh run, from its state dir, and the marks for its picture
(<state>/marks.jsonl, for hack/bench/plot.py). Run by failover.sh; again by hand on a kept state
dir (KEEP=1):  python3 hack/bench/failover_report.py STATE_DIR SLOTS LIVENESS_TIMEOUT

Per fault (times in seconds after the signal):
- failed: examples/roll_load.rs's failed requests between this fault and the next, by client and
  kind; "after out" counts those that began after the slot left the front (none should);
- out of the front: the controller's FrontSwitched event that leaves the slot out, else the first
  status (`kubectl get ks -w`) in which it no longer serves;
- killed (SIGSTOP only): the first status without the stopped process;
- leader (kcp): the first "Successfully acquired lease" in any slot's kcp log after the signal (the
  signalled process logs nothing after it, so this is another process: the other slot, or a
  replacement that took the same slot name), and which slot logged it;
- workspace Ready: a workspace created through the front after the signal reaching phase Ready;
- back to N: N ready, serving slots again, one leading, Ready=True.
"""
import csv
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import klog_times, ts  # noqa: E402

state, slots, liveness = sys.argv[1], int(sys.argv[2]), sys.argv[3]
faults = [json.loads(line) for line in open(f"{state}/faults.jsonl")]
statuses = [json.loads(line) for line in open(f"{state}/status.jsonl")]
timeline = list(csv.DictReader(open(f"{state}/timeline.csv")))
events = json.load(open(f"{state}/events.json")).get("items", [])
event_time = lambda e: ts(e.get("eventTime") or e.get("lastTimestamp") or (e.get("metadata") or {}).get("creationTimestamp"))
slot_dir = f"{state}/shards/bench/slots"
leases = sorted((x, d) for d in os.listdir(slot_dir)
                for x in klog_times(f"{slot_dir}/{d}/kcp.log", '"Successfully acquired lease"'))
print(open(f"{state}/about.txt").read().strip())
print(f"spec.slots {slots}, spec.rollout.livenessTimeout {liveness}")
marks = open(f"{state}/marks.jsonl", "w")


def mark(at, label):
    if at is not None:
        marks.write(json.dumps({"at": at, "label": label}) + "\n")


f2 = lambda v: f"{v:.2f}" if v is not None else "-"
head = ("| fault | slot | failed | of them after out of the front | failed by client and kind | out of the front"
        " | killed | leader (kcp), slot | workspace Ready | back to N | Warning events |")
print(head)
print("|" + "---|" * (head.count("|") - 1))
rows = []
for k, f in enumerate(faults):
    at = f["at"]
    until = faults[k + 1]["at"] if k + 1 < len(faults) else float("inf")
    after = [s for s in statuses if s["t"] >= at]

    def first(pred):
        return next((s["t"] for s in after if pred(s["status"].get("slots", []))), None)

    window = sorted((event_time(e), e) for e in events if event_time(e) is not None and at - 0.5 <= event_time(e) < until)
    switched = None
    for t, e in window:
        serving = re.search(r"forwards new connections to ([^;]*)", e.get("message", ""))
        if e.get("reason") == "FrontSwitched" and serving and f["slot"] not in re.split(r"[ ,]+", serving.group(1)):
            switched = t
            break
    out = switched or first(lambda ss: not any(s["name"] == f["slot"] and s.get("pid") == f["pid"] and s.get("serving") for s in ss))
    killed = first(lambda ss: not any(s.get("pid") == f["pid"] for s in ss))
    lease, leader = next(((x, d) for x, d in leases if x >= at), (None, None))
    fails = [r for r in timeline if r["outcome"] != "ok" and at <= float(r["at"]) < until]
    late = [r for r in fails if out is not None and float(r["at"]) - float(r["took_ms"]) / 1000 > out]
    kinds = {}
    for r in fails:
        key = f"{r['class']} {r['outcome']}"
        kinds[key] = kinds.get(key, 0) + 1
    warnings = {}
    for _, e in window:
        if e.get("type") == "Warning":
            warnings[e.get("reason")] = warnings.get(e.get("reason"), 0) + 1
    d = lambda x: x - at if x is not None else None
    row = {"fault": f["fault"], "failed": len(fails), "late": len(late), "out": d(out),
           "killed": d(killed) if f["fault"] == "stop" else None, "lease": d(lease), "leader": leader, "ws": d(f["wsReady"]),
           "back": d(f["back"])}
    rows.append(row)
    print(f"| {f['fault']} {f['i']} | {f['slot']} | {len(fails)} | {len(late)} | "
          + (", ".join(f"{v} {k}" for k, v in sorted(kinds.items())) or "-")
          + f" | {f2(row['out'])} | {f2(row['killed'])} | {f2(row['lease'])} {leader or ''} | {f2(row['ws'])} | {f2(row['back'])} | "
          + (", ".join(f"{v} {k}" for k, v in sorted(warnings.items())) or "-") + " |")
    mark(at, {"kill": "SIGKILL", "stop": "SIGSTOP"}[f["fault"]] + " of the leading slot")
    mark(out, "out of the front")
    mark(f["wsReady"], "workspace Ready")
    mark(f["back"], f"back to {slots} ready")
print()
for fault in ("kill", "stop"):
    rs = [r for r in rows if r["fault"] == fault]
    if not rs:
        continue

    def stat(key):
        v = sorted(r[key] for r in rs if r[key] is not None)
        return f"median {v[len(v) // 2]:.2f}, range {v[0]:.2f}-{v[-1]:.2f}" if v else "-"

    print(f"slots {slots}, {fault} x{len(rs)}: failed {sum(r['failed'] for r in rs)} "
          f"({min(r['failed'] for r in rs)}-{max(r['failed'] for r in rs)} per fault, "
          f"{sum(r['late'] for r in rs)} begun after out of the front); out of the front {stat('out')}; "
          + (f"killed {stat('killed')}; " if fault == "stop" else "")
          + f"leader (kcp) {stat('lease')}; workspace Ready {stat('ws')}; back to {slots} {stat('back')}")
load = json.load(open(f"{state}/load.json"))
print(f"load ({load['seconds']:.0f} s): {load['requests']:,} requests, {load['failed']} failed; by kind: "
      + ", ".join(f"{k} {v}" for k, v in load["failedByKind"].items() if v))
