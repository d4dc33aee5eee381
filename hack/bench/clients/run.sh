#!/usr/bin/env bash
# Kept-alive request loops through the front with the clients users run: Go's net/http Transport
# (go-loop.go: what client-go uses), Python's requests and http.client (py-loop.py, in a venv under
# ~/.cache/kcpshard), and curl (one process per path and cadence, reusing its connection), each
# asking every path at every cadence (pause between a request's answer and the next request:
# 0 = back to back). Runs until SIGTERM or --seconds, then writes DIR/clients.json: per client,
# path and cadence, ok / retried (the client, or this loop for Python, asked again after its
# connection closed before any byte of the answer) / failed, and the failures.
# Usage: hack/bench/clients/run.sh --front HOST:PORT --kubeconfig FILE --out DIR [--seconds N]
#        [--paths /readyz,/clusters/...] [--cadences 0,1,5,20,100] [--context shard-base]
# The token is read from the kubeconfig into the environment and a 0600 curl config file: it is on
# no command line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
seconds=3600
context=shard-base   # the shard admin's token, the same on every slot (the kcp admin's is per slot)
paths=/readyz,/clusters/root/apis/tenancy.kcp.io/v1alpha1/workspaces
cadences=0,1,5,20,100
while [ $# -gt 0 ]; do
  case "$1" in
    --front) front=$2; shift 2 ;;
    --kubeconfig) kubeconfig=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --paths) paths=$2; shift 2 ;;
    --cadences) cadences=$2; shift 2 ;;
    --context) context=$2; shift 2 ;;
    *) echo "clients: unknown argument $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"; chmod 0700 "$out"
kubectl="$root/bin/kubectl"
"$kubectl" --kubeconfig "$kubeconfig" config view --raw --minify --context "$context" \
  -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' | base64 -d >"$out/ca.crt"
KCP_TOKEN=$("$kubectl" --kubeconfig "$kubeconfig" config view --raw --minify --context "$context" -o jsonpath='{.users[0].user.token}')
export KCP_TOKEN

# Go: built from the standard library alone, cached by the source's hash.
gobin=$HOME/.cache/kcpshard/bin/go-loop-$(sha256sum "$here/go-loop.go" | cut -c1-12)
if [ ! -x "$gobin" ]; then
  build=$(mktemp -d); cp "$here/go-loop.go" "$build/main.go"
  (cd "$build" && go mod init goloop >/dev/null 2>&1 && CGO_ENABLED=0 go build -o "$gobin.tmp" . && mv "$gobin.tmp" "$gobin")
  rm -rf "$build"
fi
venv=$HOME/.cache/kcpshard/venv-clients
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import requests' 2>/dev/null; then
  python3 -m venv "$venv" && "$venv/bin/pip" install -q requests
fi

pids=()
"$gobin" -front "$front" -ca "$out/ca.crt" -paths "$paths" -cadences "$cadences" -seconds "$seconds" \
  >"$out/go.json" 2>"$out/go.err" & pids+=($!)
"$venv/bin/python" "$here/py-loop.py" --front "$front" --ca "$out/ca.crt" --paths "$paths" \
  --cadences "$cadences" --seconds "$seconds" >"$out/python.json" 2>"$out/python.err" & pids+=($!)
umask 077
# Bodies go to stdout (/dev/null), one line per transfer to stderr (%{stderr}).
printf 'header = "Authorization: Bearer %s"\ncacert = "%s"\nhttp1.1\nsilent\nwrite-out = "%%{stderr}%%{http_code} %%{num_connects} %%{exitcode}\\n"\n' \
  "$KCP_TOKEN" "$out/ca.crt" >"$out/curl.conf"
IFS=, read -ra path_list <<<"$paths"
IFS=, read -ra cadence_list <<<"$cadences"
curls=()
for path in "${path_list[@]}"; do
  for cadence in "${cadence_list[@]}"; do
    name=curl-$(echo "$path" | tr -c 'a-z0-9\n' '_')-$cadence
    rate=(); [ "$cadence" -gt 0 ] && rate=(--rate "$((1000 / cadence))/s")
    # One process, one connection kept alive over every transfer of its URL list.
    { for _ in $(seq 1 200000); do echo "url = \"https://$front$path\""; done; } >"$out/$name.urls"
    curl -K "$out/curl.conf" -K "$out/$name.urls" "${rate[@]}" >/dev/null 2>"$out/$name.txt" &
    curls+=($!); echo "$path $cadence $name" >>"$out/curls"
  done
done
sleeper=""
finish() {
  for pid in "${pids[@]}" "${curls[@]}" $sleeper; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
rows = []
for f in ("go.json", "python.json"):
    try:
        rows += json.load(open(os.path.join(out, f)))
    except Exception as e:
        rows.append({"client": f, "error": repr(e)})
for line in open(os.path.join(out, "curls")):
    path, cadence, name = line.split()
    ok = retried = failed = 0; failures = {}
    lines = open(os.path.join(out, name + ".txt")).read().splitlines()
    for i, l in enumerate(lines):
        parts = l.split()
        if len(parts) != 3:
            continue
        code, connects, exit_code = parts
        if code == "200" and exit_code == "0":
            # A transfer after the first that had to connect: curl found its connection closed.
            if i > 0 and connects != "0":
                retried += 1
            else:
                ok += 1
        else:
            failed += 1; key = f"HTTP {code} exit {exit_code}"; failures[key] = failures.get(key, 0) + 1
    rows.append(dict(client="curl", path=path, cadenceMs=int(cadence), ok=ok, retried=retried, failed=failed, failures=failures))
json.dump(rows, open(os.path.join(out, "clients.json"), "w"), indent=1)
PY
  rm -f "$out"/*.urls "$out/curl.conf"
}
trap 'finish; exit 0' TERM INT
sleep "$seconds" & sleeper=$!
wait "$sleeper" || true
finish
