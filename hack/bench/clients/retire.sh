#!/usr/bin/env bash
# The front's retirement of a slot with the clients users run, without kcp: `kcpshard front` in
# front of stand-in slots (slot.go: Go's HTTPS server, which on SIGTERM answers /readyz 500 and
# 100 ms later closes its idle connections, as kcp does), the kept-alive loops of run.sh (Go's
# Transport, Python's requests and http.client, curl; /readyz and a 14 KB list at 0, 1, 5, 20 and
# 100 ms), and N rolls the way the controller makes them: start a new slot, `serve` it alone, wait
# until the front reports no retired_pending connection to the old one (at most 2 s), SIGTERM it,
# and `close` its address 1 s later. Prints run.sh's table. All on 127.0.0.1; stops what it started.
# Usage: hack/bench/clients/retire.sh [--rolls 10] [--kcpshard PATH]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
rolls=10
ks=$root/target/debug/kcpshard
while [ $# -gt 0 ]; do
  case "$1" in
    --rolls) rolls=$2; shift 2 ;;
    --kcpshard) ks=$2; shift 2 ;;
    *) echo "retire: unknown argument $1" >&2; exit 2 ;;
  esac
done
work=$(mktemp -d /tmp/kcpshard-retire-XXXXXX); chmod 0700 "$work"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap "exit 130" INT TERM
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ctl() { python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(sys.argv[2].encode()+b"\n"); print(s.makefile().readline())' "$work/front/control.sock" "$1"; }

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=127.0.0.1 \
  -addext subjectAltName=IP:127.0.0.1 -addext basicConstraints=critical,CA:TRUE \
  -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null
slotbin=$HOME/.cache/kcpshard/bin/retire-slot-$(sha256sum "$here/slot.go" | cut -c1-12)
if [ ! -x "$slotbin" ]; then
  build=$(mktemp -d); cp "$here/slot.go" "$build/main.go"
  (cd "$build" && go mod init slot >/dev/null 2>&1 && CGO_ENABLED=0 go build -o "$slotbin.tmp" . && mv "$slotbin.tmp" "$slotbin")
  rm -rf "$build"
fi
start_slot() { # prints pid port
  local port; port=$(free_port)
  "$slotbin" -listen "127.0.0.1:$port" -cert "$work/cert.pem" -key "$work/key.pem" >>"$work/slots.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 100); do python3 -c 'import socket,sys; socket.create_connection(("127.0.0.1",int(sys.argv[1])),0.2)' "$port" 2>/dev/null && break; sleep 0.05; done
  echo "$pid $port"
}

mkdir -m 0700 "$work/front"
front_port=$(free_port)
"$ks" front --listen "127.0.0.1:$front_port" --dir "$work/front" >"$work/front.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do [ -S "$work/front/control.sock" ] && break; sleep 0.05; done
read -r old_pid old_port <<<"$(start_slot)"; pids+=("$old_pid")
ctl "{\"op\":\"serve\",\"backends\":[{\"slot\":\"s0\",\"address\":\"127.0.0.1:$old_port\"}]}" >/dev/null
cat >"$work/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:$front_port", certificate-authority-data: $(base64 -w0 "$work/cert.pem")}}]
users: [{name: u, user: {token: stand-in}}]
contexts: [{name: shard-base, context: {cluster: c, user: u}}]
current-context: shard-base
KC
"$here/run.sh" --front "127.0.0.1:$front_port" --kubeconfig "$work/kubeconfig" --out "$work/clients" \
  --paths /readyz,/list >"$work/clients.log" 2>&1 &
clients=$!; pids+=("$clients")
sleep 3
for i in $(seq 1 "$rolls"); do
  read -r new_pid new_port <<<"$(start_slot)"; pids+=("$new_pid")
  ctl "{\"op\":\"serve\",\"backends\":[{\"slot\":\"s$i\",\"address\":\"127.0.0.1:$new_port\"}]}" >/dev/null
  switched=$(date +%s.%N)
  waited=$(python3 - "$work/front/control.sock" "s$((i - 1))" <<'PY'
import json, socket, sys, time
t0 = time.monotonic(); time.sleep(0.5)  # the controller's settle
while time.monotonic() - t0 < 2:
    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(b'{"op":"status"}\n')
    c = json.loads(s.makefile().readline())["status"]["connections"].get(sys.argv[2], {})
    if c.get("retired_pending", 0) == 0:
        break
    time.sleep(0.05)
print(f"{time.monotonic() - t0:.2f}")
PY
)
  kill -TERM "$old_pid"
  sleep 1
  ctl "{\"op\":\"close\",\"address\":\"127.0.0.1:$old_port\"}" >/dev/null
  echo "roll $i: SIGTERM of the old slot $waited s after the switch" >&2
  old_pid=$new_pid; old_port=$new_port
  sleep 2
done
kill -TERM "$clients"; wait "$clients" || true
python3 - "$work/clients/clients.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
cad = (0, 1, 5, 20, 100)
print(f"{'client':20} {'path':7} " + " ".join(f"{str(c) + ' ms':>17}" for c in cad) + "   (ok/retried/failed)")
cells = {(r["client"], r["path"], r["cadenceMs"]): r for r in rows if "error" not in r}
for client in sorted({k[0] for k in cells}):
    for path in ("/readyz", "/list"):
        print(f"{client:20} {path:7} " + " ".join(
            (lambda r: f"{r['ok']:>7}/{r['retried']:>3}/{r['failed']:>3}" if r else f"{'-':>17}")(cells.get((client, path, c))) for c in cad))
print(f"failed: {sum(r['failed'] for r in cells.values())}, retried: {sum(r['retried'] for r in cells.values())}")
for r in cells.values():
    if r["failed"]:
        print(f"  {r['client']} {r['path']} {r['cadenceMs']} ms: {r['failures']}")
for r in rows:
    if "error" in r:
        print("no result:", r)
PY
