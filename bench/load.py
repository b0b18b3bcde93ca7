"""Loopback HTTP load generator: a few keep-alive connections, each in a thread,
bounded by a request count and a deadline. Prints one JSON line.

  python -m bench.load --port P [--path /work] [--conns 4] [--seconds 10] [--max 200000] [--times]

--times adds "done_at": the wall-clock time (time.time()) at which each successful
request's response had been read, sorted (bench item 3's delay to metrics)."""
from __future__ import annotations

import argparse
import http.client
import json
import ssl
import threading
import time


def connect(port: int, tls: bool) -> http.client.HTTPConnection:
    if not tls:
        return http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    return http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=ssl._create_unverified_context())


def worker(port: int, path: str, deadline: float, budget: list, lock: threading.Lock, out: dict,
           tls: bool = False, done_at: list | None = None) -> None:
    conn = connect(port, tls)
    ok = errors = 0
    while time.monotonic() < deadline:
        with lock:
            if budget[0] <= 0:
                break
            budget[0] -= 1
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            resp.read()
            if done_at is not None and resp.status == 200:
                done_at.append(time.time())  # list.append is atomic under the GIL
            ok += resp.status == 200
            errors += resp.status != 200
        except (OSError, http.client.HTTPException):
            errors += 1
            conn.close()
            conn = connect(port, tls)
    conn.close()
    with lock:
        out["ok"] += ok
        out["errors"] += errors


def run(port: int, path: str, conns: int, seconds: float, max_requests: int, tls: bool = False,
        times: bool = False) -> dict:
    out = {"ok": 0, "errors": 0}
    lock, budget = threading.Lock(), [max_requests]
    done_at = [] if times else None
    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, args=(port, path, t0 + seconds, budget, lock, out, tls, done_at))
               for _ in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out["seconds"] = time.monotonic() - t0
    out["rps"] = out["ok"] / out["seconds"]
    if done_at is not None:
        out["done_at"] = sorted(done_at)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--path", default="/work")
    ap.add_argument("--conns", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--max", type=int, default=200_000)
    ap.add_argument("--tls", action="store_true", help="HTTPS, certificate not verified (self-signed)")
    ap.add_argument("--times", action="store_true", help="add each request's completion time (done_at)")
    a = ap.parse_args()
    print(json.dumps(run(a.port, a.path, a.conns, a.seconds, a.max, a.tls, a.times)), flush=True)


if __name__ == "__main__":
    main()
