"""Kept-alive request loops through the front with Python's requests (a Session: urllib3's pool)
and http.client (one HTTPConnection): one thread per (library, path, cadence), for --seconds or
until SIGTERM. Neither retries by default (requests' adapter has max_retries=0; http.client never
does): a connection closed before any byte of the answer surfaces as ConnectionError or
RemoteDisconnected, which this loop retries once on a new connection and counts as "retried"
(the same close that a Go server's idle close causes); anything else is "failed". Prints JSON."""
import argparse, http.client, json, signal, ssl, sys, threading, time

import requests

p = argparse.ArgumentParser()
p.add_argument("--front"); p.add_argument("--ca"); p.add_argument("--token-env", default="KCP_TOKEN")
p.add_argument("--paths", default="/readyz"); p.add_argument("--cadences", default="0,1,5,20,100")
p.add_argument("--seconds", type=int, default=60)
a = p.parse_args()
import os
token = os.environ[a.token_env]
host, port = a.front.rsplit(":", 1)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
deadline = time.monotonic() + a.seconds
headers = {"Authorization": "Bearer " + token}
CLOSED_BEFORE_ANSWER = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


def closed_before_answer(e):
    while e is not None:
        if isinstance(e, CLOSED_BEFORE_ANSWER):
            return True
        e = e.__context__ or e.__cause__ or (e.args[0] if e.args and isinstance(e.args[0], BaseException) else None) \
            or (e.args[1] if len(e.args) > 1 and isinstance(e.args[1], BaseException) else None)
    return False


def run_requests(k, path):
    s = requests.Session()
    def once():
        r = s.get(f"https://{a.front}{path}", headers=headers, timeout=10, verify=a.ca)
        return r.status_code
    return once


def run_http_client(k, path):
    ctx = ssl.create_default_context(cafile=a.ca); ctx.set_alpn_protocols(["http/1.1"])
    conn = [None]
    def once():
        if conn[0] is None:
            conn[0] = http.client.HTTPSConnection(host, int(port), context=ctx, timeout=10)
        try:
            conn[0].request("GET", path, headers=headers)
            r = conn[0].getresponse(); r.read()
            return r.status
        except BaseException:
            conn[0].close(); conn[0] = None
            raise
    return once


def loop(k, once):
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            status = once()
            retried = False
        except Exception as e:
            if not closed_before_answer(e):
                k["failed"] += 1; k["failures"][repr(e)[-200:]] = k["failures"].get(repr(e)[-200:], 0) + 1
                continue
            try:
                status = once(); retried = True
            except Exception as e2:
                k["failed"] += 1; k["failures"][repr(e2)[-200:]] = k["failures"].get(repr(e2)[-200:], 0) + 1
                continue
        if status != 200:
            k["failed"] += 1; k["failures"][f"HTTP {status}"] = k["failures"].get(f"HTTP {status}", 0) + 1
        elif retried:
            k["retried"] += 1
        else:
            k["ok"] += 1
        if k["cadenceMs"]:
            stop.wait(k["cadenceMs"] / 1000)


threads, all_ = [], []
for client, make in (("python-requests", run_requests), ("python-http.client", run_http_client)):
    for path in a.paths.split(","):
        for c in a.cadences.split(","):
            k = dict(client=client, path=path, cadenceMs=int(c), ok=0, retried=0, failed=0, failures={})
            all_.append(k)
            t = threading.Thread(target=loop, args=(k, make(k, path)), daemon=True); t.start(); threads.append(t)
for t in threads:
    t.join()
json.dump(all_, sys.stdout); print()
