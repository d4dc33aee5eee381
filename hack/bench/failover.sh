#!/usr/bin/env bash
# Faults of the leading slot under load through the front. For each --slots value: starts a shard
# as hack/bench/roll.sh does (hack/bench/common.sh: `kcpshard serve`, the KcpShard, Ready,
# examples/roll_load.rs through the front), records its status as `kubectl get ks -w` shows it,
# then, --times times for each fault: waits until N slots are ready and serving with one leading
# (status.slots[].leader: the holder of the kcp-controllers Lease, src/controller/lease.rs), sends
# the leading slot's kcp SIGKILL (kill) or SIGSTOP (stop), creates a workspace through the front,
# and waits until the shard is back at N ready slots. It prints, per fault and in sum:
#   - failed requests by kind (examples/roll_load.rs's failures between this fault and the next),
#   - out of the front: the fault to the FrontSwitched event that leaves the slot out (else the
#     first status in which it no longer serves),
#   - killed (stop only): the fault to the first status without the stopped process,
#   - leader (kcp): the fault to the first "Successfully acquired lease" in any slot's kcp log, and
#     that slot (the other one, or the replacement, which may take the faulted slot's name),
#   - workspace Ready: the fault to a workspace created through the front after it reaching Ready
#     (a leader runs kcp's controllers, and the front reaches a slot that serves),
#   - back to N: the fault to N ready, serving slots again, Ready=True,
# the Warning events of each fault (hack/bench/failover_report.py computes these), and draws the
# run as a PNG (hack/bench/plot.py).
# Usage: hack/bench/failover.sh [--store sqlite|postgres] [--slots N[,N...]] [--faults kill,stop]
#                               [--times N] [--liveness-timeout DURATION] [--png DIR]
#   defaults: sqlite, slots 2,1, faults kill,stop, 10 times each, spec.rollout.livenessTimeout 10s
#   (how long a stopped slot lives before kcpshard kills it), --png: the state dir.
# Run it alone, under the real-kcp lock (`flock /tmp/kcpshard-realkcp.lock ...`): kcp is heavy.
# Env: KCPSHARD, ROLL_LOAD, KEEP as for roll.sh (hack/bench/common.sh).
set -euo pipefail
command_line="$*"
bench=failover.sh
store=sqlite
slot_counts=2,1
faults=kill,stop
times=10
liveness_timeout=10s
png_dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --store) store=$2; shift 2 ;;
    --slots) slot_counts=$2; shift 2 ;;
    --faults) faults=$2; shift 2 ;;
    --times) times=$2; shift 2 ;;
    --liveness-timeout) liveness_timeout=$2; shift 2 ;;
    --png) png_dir=$2; shift 2 ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "failover.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$store" in sqlite|postgres) ;; *) echo "failover.sh: --store must be sqlite or postgres" >&2; exit 2 ;; esac
for n in ${slot_counts//,/ }; do
  case "$n" in 1|2|3) ;; *) echo "failover.sh: --slots takes 1, 2 or 3 (comma-separated)" >&2; exit 2 ;; esac
done
for f in ${faults//,/ }; do
  case "$f" in kill|stop) ;; *) echo "failover.sh: --faults takes kill and stop" >&2; exit 2 ;; esac
done
source "$(dirname "$0")/common.sh"

watcher=""
stopped_pids=""
stop_extra() {
  [ -n "$watcher" ] && { kill -TERM "$watcher" 2>/dev/null || true; wait "$watcher" 2>/dev/null || true; }
  watcher=""
  # A stopped kcp kcpshard did not kill: let it die with the shard.
  [ -n "$stopped_pids" ] && { kill -CONT $stopped_pids 2>/dev/null || true; }
  stopped_pids=""
}

# The status as `kubectl get ks bench -w -o json` streams it, one JSON line per change with the time
# it came: {"t": unix, "status": {...}}.
record_status() {
  python3 - "$kubectl" "$state/status.jsonl" <<'PY' &
import json, signal, subprocess, sys, time
kubectl, out = sys.argv[1], open(sys.argv[2], "a")
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
decoder = json.JSONDecoder()
while True:
    p = subprocess.Popen([kubectl, "get", "ks", "bench", "-w", "-o", "json"], stdout=subprocess.PIPE, text=True)
    buf = ""
    try:
        for line in p.stdout:
            buf += line
            try:
                obj, end = decoder.raw_decode(buf.lstrip())
            except json.JSONDecodeError:
                continue
            buf = ""
            out.write(json.dumps({"t": time.time(), "status": obj.get("status") or {}}) + "\n")
            out.flush()
    finally:
        p.kill()
    time.sleep(0.2)
PY
  watcher=$!
}

# Creates a workspace through the front (retrying while nothing answers) and waits for phase Ready;
# prints the Unix times it was accepted and Ready (null if not within 300 s). As kcpshard's admin
# identity (the `base` context of the shard's kubeconfig): a workspace the shard admin creates never
# leaves Initializing (src/slot/access.rs).
workspace_ready() { # name
  python3 - "$kubectl" "$state/shards/bench/admin.kubeconfig" "$1" "https://127.0.0.1:$front_port/clusters/root" <<'PY'
import json, subprocess, sys, time
kubectl, kubeconfig, name, server = sys.argv[1:5]
k = [kubectl, "--kubeconfig", kubeconfig, "--context", "base", "--server", server, "--request-timeout=3s"]
manifest = json.dumps({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace", "metadata": {"name": name}})
deadline = time.time() + 300
created = None
while time.time() < deadline:
    if created is None:
        out = subprocess.run(k + ["create", "-f", "-"], input=manifest, capture_output=True, text=True)
        # A create whose answer was lost (a timeout) may have been made: AlreadyExists is a success.
        if out.returncode == 0 or "AlreadyExists" in out.stderr:
            created = time.time()
        else:
            time.sleep(0.2)
            continue
    out = subprocess.run(k + ["get", "workspace", name, "-o", "jsonpath={.status.phase}"], capture_output=True, text=True)
    if out.returncode == 0 and out.stdout.strip() == "Ready":
        print(f"{created} {time.time()}")
        sys.exit(0)
    time.sleep(0.2)
print(f"{json.dumps(created)} null")
PY
}

run_slots() { # slots
  local slots=$1
  start_shard "$store" "$slots" "livenessTimeout: $liveness_timeout"
  record_status
  start_load
  : >"$state/faults.jsonl"
  local fault i leader name pid at ws
  for fault in ${faults//,/ }; do
    for i in $(seq 1 "$times"); do
      leader=$(wait_slots "$slots" | python3 -c 'import json, sys; s = next(s for s in json.load(sys.stdin) if s.get("leader")); print(s["name"], s["pid"])')
      sleep 3
      name=${leader% *}; pid=${leader#* }
      at=$(now)
      if [ "$fault" = kill ]; then kill -KILL "$pid"; else kill -STOP "$pid"; stopped_pids="$stopped_pids $pid"; fi
      ws=$(workspace_ready "failover-$slots-$fault-$i")
      wait_slots "$slots" >/dev/null
      echo "{\"slots\": $slots, \"fault\": \"$fault\", \"i\": $i, \"slot\": \"$name\", \"pid\": $pid, \"at\": $at, \"wsCreated\": ${ws% *}, \"wsReady\": ${ws#* }, \"back\": $(now)}" \
        >>"$state/faults.jsonl"
      echo "slots $slots, $fault $i of $times: slot $name (pid $pid) back after $(python3 -c "print(f'{$(now)-$at:.1f}')") s" >&2
    done
  done
  sleep 2
  stop_load
  "$kubectl" get events -o json >"$state/events.json" 2>/dev/null || echo '{"items": []}' >"$state/events.json"
  echo "ended: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(uptime | sed 's/.*load/load/')" >>"$state/about.txt"
  python3 hack/bench/failover_report.py "$state" "$slots" "$liveness_timeout" | tee "$bins/report-$slots.txt"
  reports+=("$bins/report-$slots.txt")
  local out=${png_dir:-$state}/failover-$store-slots$slots-${faults//,/-}.png
  mkdir -p "$(dirname "$out")"
  "$(plot_python)" hack/bench/plot.py --timeline "$state/timeline.csv" --marks "$state/marks.jsonl" \
    --title "$(fault_names) of the leading slot x$times under load ($(store_type "$store"), slots $slots)" \
    --made-by "$(made_by)" --out "$out" >&2
  stop_run
}

fault_names() { local f=${faults//kill/SIGKILL}; f=${f//stop/SIGSTOP}; echo "${f//,/ and }"; }

reports=()
for slots in ${slot_counts//,/ }; do
  run_slots "$slots"
done
if [ "${#reports[@]}" -gt 1 ]; then
  echo; echo "=== side by side (one session) ==="
  grep -h -E '^slots [0-9], ' "${reports[@]}"
fi
