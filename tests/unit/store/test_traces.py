"""`otel-gpu traces`: list, filters, slowest N, and one trace as a tree."""
import pytest

from otel_gpu.store.traces import TREE_NOTE, list_requests
from store_helpers import KERNEL, MS, T0, request, run_cli, window

S = 10**9
BIG = 0xABC123 << 104  # trace ids with distinct leading digits, as random ones have


@pytest.fixture
def filled(store):
    # (trace id, start s, duration ms, route, service)
    for i, (dur, route, svc) in enumerate([(5, "/infer", "demo"), (50, "/embed", "demo"), (20, "/infer", "demo"),
                                           (80, "/infer", "other"), (1, "/health", "demo")]):
        store.export(request(BIG + i, T0 + i * S, dur * MS, route=route, service=svc, launches=i))
    return store


def _ids(rows):
    return [int(r["trace_id"], 16) - BIG for r in rows]


def test_newest_first_and_limit(filled, reader):
    assert _ids(list_requests(reader())) == [4, 3, 2, 1, 0]
    assert _ids(list_requests(reader(), limit=2)) == [4, 3]


def test_filters(filled, reader):
    assert _ids(list_requests(reader(), route="/infer")) == [3, 2, 0]
    assert _ids(list_requests(reader(), route="/infer", service="demo")) == [2, 0]
    assert _ids(list_requests(reader(), since_ns=T0 + 2 * S)) == [4, 3, 2]


def test_slowest(filled, reader):
    assert _ids(list_requests(reader(), slowest=3)) == [3, 1, 2]
    assert _ids(list_requests(reader(), slowest=2, service="demo")) == [1, 2]


def test_list_cli_lines(filled, db):
    code, out = run_cli("traces", "--db", db, "--route", "/infer", "--slowest", "2")
    lines = out.splitlines()
    assert code == 0 and all(len(line) <= 80 for line in lines)
    assert lines[1].split()[:2] == ["TIME", "TRACE"]
    first = lines[2]
    assert f"{BIG + 3:032x}"[:12] in first and "other" in first and "POST /infer" in first
    assert "80.0 ms" in first and first.split()[-1] == "3" and " 200 " in first
    assert f"{BIG + 2:032x}"[:12] in lines[3] and "20.0 ms" in lines[3]


def test_tree_of_stored_trace(store, db):
    store.export(request(BIG + 9, T0, 3 * MS, launches=2, rollup=40,
                       copies=((4096, "h2d"), (512, "d2h"))))
    code, out = run_cli("traces", "--db", db, "--trace-id", f"{BIG + 9:032x}")
    lines = out.splitlines()
    assert code == 0 and TREE_NOTE in out
    root = lines.index(f"[demo] trace {BIG + 9:032x}")
    assert lines[root + 1].startswith("POST /infer/{id}  3.000 ms") and "status_code=200" in lines[root + 1]
    kids = lines[root + 2:]
    assert len(kids) == 5 and kids[-1].startswith("└─ ")
    assert sum(KERNEL in k and "grid=4x1x1" in k and "block=256x1x1" in k for k in kids) == 2
    assert any("memcpy.bytes=4096" in k and "direction=h2d" in k for k in kids)
    assert any("memcpy.bytes=512" in k and "direction=d2h" in k for k in kids)
    assert any(k.startswith("└─ cudaLaunchKernel x40") and "rollup.count=40" in k for k in kids)
    starts = [k.split()[1] for k in kids]  # children in start order, as written
    assert starts == ["cudaLaunchKernel"] * 2 + ["cudaMemcpy"] * 2 + ["cudaLaunchKernel"]


def test_tree_by_prefix_and_ambiguity(filled, db):
    code, out = run_cli("traces", "--db", db, "--trace-id", f"{BIG + 3:032x}".upper())
    assert code == 0 and "[other] trace" in out
    code, out = run_cli("traces", "--db", db, "--trace-id", f"{BIG + 3:032x}"[:31])
    assert code == 2  # the five ids differ only in the last digit
    code, _ = run_cli("traces", "--db", db, "--trace-id", "abc123")
    assert code == 2  # five traces share the prefix


def test_unknown_and_malformed_trace_id(filled, db, capsys):
    assert run_cli("traces", "--db", db, "--trace-id", "0123")[0] == 1
    assert "no trace 0123" in capsys.readouterr().err
    assert run_cli("traces", "--db", db, "--trace-id", "xyz")[0] == 2


def test_window_trace_renders(store, db):
    store.export(window(0xF00 << 116, T0, launches=2))
    code, out = run_cli("traces", "--db", db, "--trace-id", "f00")
    assert code == 0 and "GPU work outside requests" in out and out.count("outside_kernel(int)") == 2


def test_empty_list(store, db):
    assert run_cli("traces", "--db", db) == (0, "no requests in the store for this filter\n")


def _controls(text: str) -> list:
    return [c for c in text if c != "\n" and (ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f)]


def test_raw_escape_sequences_in_an_older_store_are_neutralised(store, db):
    """A store written before entry-time sanitising may hold terminal escapes: the list and
    the tree show them replaced (U+FFFD), never raw."""
    store.export(request(BIG, T0, 5 * MS, service="svc\x1b]0;pwned\x07", route="/a\x1b[2J\x9b31m",
                         kernel="k\x1b[31m\x7f"))
    store.force_flush()
    code, listed = run_cli("traces", "--db", db)
    assert code == 0 and not _controls(listed), repr(listed)
    assert "svc\ufffd]0;pwned\ufffd" in listed and "/a\ufffd[2J\ufffd31m" in listed
    code, tree = run_cli("traces", "--db", db, "--trace-id", f"{BIG:032x}"[:12])
    assert code == 0 and not _controls(tree), repr(tree)
    assert "[svc\ufffd]0;pwned\ufffd]" in tree and "kernel.name=k\ufffd[31m\ufffd" in tree
