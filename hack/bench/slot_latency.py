#!/usr/bin/env python3
"""How fast a busy kcp answers what tells a hung one from a slow one.

Runs beside a real-shard benchmark (hack/bench/roll.sh, prod-shaped.sh) and, every 200 ms, asks every
slot of every bench state dir (/tmp/kcpshard-bench-*) two things a SIGSTOPped kcp never answers:
a TLS handshake on a new connection, and `GET /livez/ping` (a check that reads no store) on a
kept-alive one as the shard admin. Appends `time,run/slot,port,what,seconds` to OUT (seconds -1: no
answer within 5 s or an error). With --summary, prints per run the percentiles of each.

    hack/bench/slot_latency.py /tmp/latency.csv &   # then run the bench; kill it after
    hack/bench/slot_latency.py --summary /tmp/latency.csv
"""
import collections
import csv
import glob
import http.client
import json
import re
import socket
import ssl
import sys
import time

TLS = ssl.create_default_context()
TLS.check_hostname = False
TLS.verify_mode = ssl.CERT_NONE  # liveness only: nothing is sent but the handshake and a ping


def shard_admin_token(root):
    text = open(f"{root}/admin.kubeconfig").read()
    found = re.search(r"- name: shard-admin\n  user:\n    token: (\S+)", text)
    return found.group(1) if found else None


def handshake(port):
    began = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with TLS.wrap_socket(raw, do_handshake_on_connect=False) as tls:
            tls.settimeout(5)
            tls.do_handshake()
    return time.monotonic() - began


def measure(out):
    pings = {}
    while True:
        for record in glob.glob("/tmp/kcpshard-bench-*/shards/bench/slots/*/slot.json"):
            try:
                port = json.load(open(record))["port"]
                token = shard_admin_token(record.rsplit("/", 1)[0] + "/root")
            except (OSError, ValueError, KeyError):
                continue
            parts = record.split("/")
            slot = f"{parts[2]}/{parts[-2]}"
            try:
                took = handshake(port)
            except OSError:
                took = -1.0
            out.write(f"{time.time():.3f},{slot},{port},handshake,{took:.4f}\n")
            began = time.monotonic()
            try:
                conn = pings.get(port) or http.client.HTTPSConnection("127.0.0.1", port, context=TLS, timeout=5)
                pings[port] = conn
                conn.request("GET", "/livez/ping", headers={"Authorization": f"Bearer {token}"})
                answer = conn.getresponse()
                answer.read()
                took = time.monotonic() - began if answer.status == 200 else -1.0
            except (OSError, http.client.HTTPException):
                pings.pop(port, None)
                took = -1.0
            out.write(f"{time.time():.3f},{slot},{port},ping,{took:.4f}\n")
            out.flush()
        time.sleep(0.2)


def summary(path):
    seen = collections.defaultdict(list)
    failed = collections.Counter()
    for _, slot, _, what, took in csv.reader(open(path)):
        key = (slot.split("/")[0], what)
        if float(took) < 0:
            failed[key] += 1
        else:
            seen[key].append(float(took))
    for (run, what), values in sorted(seen.items()):
        values.sort()
        n = len(values)
        at = lambda q: values[min(n - 1, int(n * q))] * 1000
        print(f"{run} {what:9}: {n} answered, {failed[(run, what)]} not; p50 {at(.5):.1f} ms, p99 {at(.99):.1f} ms, "
              f"p99.9 {at(.999):.1f} ms, max {values[-1] * 1000:.1f} ms; over 0.25 s: {sum(v > .25 for v in values)}, "
              f"over 0.5 s: {sum(v > .5 for v in values)}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--summary"]:
        summary(sys.argv[2])
    else:
        measure(open(sys.argv[1], "a"))
