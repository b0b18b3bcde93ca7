"""A store read by another process while the collector writes (and prunes) stays
consistent: in every read snapshot, each request row has its server span and all of
that request's children, and no server span outlives its request row."""
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from otel_gpu.store.exporter import StoreExporter
from store_helpers import MS, T0, request

ROOT = Path(__file__).resolve().parents[3]

READER = r"""
import json, sys, time
from otel_gpu.store.schema import open_reader
conn = open_reader(sys.argv[1])
print("ready", flush=True)
snapshots, counts, bad = 0, set(), []
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    conn.execute("BEGIN")
    rows = conn.execute(
        "SELECT r.trace_id, r.route,"
        " (SELECT count(*) FROM spans s WHERE s.trace_id = r.trace_id),"
        " (SELECT json_extract(s.attributes, '$.\"gpu.calls\"') FROM spans s"
        "   WHERE s.trace_id = r.trace_id AND s.span_id = r.span_id)"
        " FROM requests r").fetchall()
    orphans = conn.execute("SELECT count(*) FROM spans s WHERE s.kind = 1 AND NOT EXISTS"
                           " (SELECT 1 FROM requests r WHERE r.trace_id = s.trace_id)").fetchone()[0]
    conn.execute("COMMIT")
    snapshots += 1
    counts.add(len(rows))
    bad += [r for r in rows if r[3] is None or r[2] != r[3] + 1][:5]
    if orphans:
        bad.append(("orphan server spans", orphans))
    if any(r[1] == "/done" for r in rows):
        break
print(json.dumps({"snapshots": snapshots, "counts": len(counts), "bad": bad[:10]}), flush=True)
"""


def test_reader_process_sees_only_whole_requests(db):
    store = StoreExporter(db, max_requests=150)  # pruning runs while the reader reads
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", READER, db], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "ready"
        now = time.time_ns()
        for i in range(1, 601):
            # Varying child counts so a half-written request cannot look whole.
            store.export(request(i, now + i * MS, MS, launches=i % 7,
                               copies=[(100 * j, "h2d") for j in range(i % 4)]))
            if i % 10 == 0:
                time.sleep(0.002)  # give the reader turns in the middle of the run
        store.export(request(10_000, now + 10_000 * MS, MS, route="/done"))
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
        store.shutdown()
    result = json.loads(out)
    assert result["bad"] == []
    assert store.write_errors == 0
    # The reader really overlapped the writes: it saw the table at many sizes.
    assert result["snapshots"] >= 10 and result["counts"] >= 3, result


def test_report_while_writing(db):
    """report's read transaction: totals agree with the rows of the same snapshot."""
    from otel_gpu.store.report import build_report
    from otel_gpu.store.schema import open_reader
    store = StoreExporter(db, max_requests=100)
    store.export(request(1, T0, MS))
    stop = threading.Event()

    def write():
        i = 2
        while not stop.is_set():
            store.export(request(i, time.time_ns(), (i % 9 + 1) * MS, route=f"/r{i % 3}", cost=0.001 * (i % 5)))
            i += 1
    t = threading.Thread(target=write)
    t.start()
    conn = open_reader(db)
    try:
        for _ in range(200):
            rep = build_report(conn)
            assert rep["totals"]["requests"] == sum(r["requests"] for r in rep["rows"])
            assert abs(rep["totals"]["cost"] - sum(r["cost"] for r in rep["rows"])) < 1e-9
    finally:
        stop.set()
        t.join()
        conn.close()
        store.shutdown()
    assert store.write_errors == 0
