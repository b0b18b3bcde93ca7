"""`otel-gpu traces --format perfetto`: Chrome trace-event JSON checked against the format
(keys and types per phase, metadata naming every track, nesting on each track) and against
the store (every stored call once, under its request or linked to it)."""
import json

import pytest

from otel_gpu.store.perfetto import PID_MAX
from store_helpers import run_cli
from tests.browser.demo_store import ASYNC_PID, INFERENCE_PID, build_demo_store

NUM = (int, float)
REQUIRED = {  # phase -> key -> type(s)
    "X": {"name": str, "cat": str, "ts": NUM, "dur": NUM, "pid": int, "tid": int, "args": dict},
    "M": {"name": str, "pid": int, "tid": int, "args": dict},
    "s": {"name": str, "cat": str, "id": int, "ts": NUM, "pid": int, "tid": int},
    "f": {"name": str, "cat": str, "id": int, "ts": NUM, "pid": int, "tid": int, "bp": str},
}


def check_format(doc: dict) -> dict:
    """Asserts the JSON Object Format; returns the X events by track."""
    assert isinstance(doc["traceEvents"], list) and doc["traceEvents"]
    tracks, names, procs = {}, {}, set()
    for e in doc["traceEvents"]:
        assert e["ph"] in REQUIRED, e
        for key, kind in REQUIRED[e["ph"]].items():
            assert isinstance(e[key], kind) and not isinstance(e[key], bool), (key, e)
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["ts"] >= 0
            tracks.setdefault((e["pid"], e["tid"]), []).append(e)
        elif e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "thread_sort_index"), e
            if e["name"] == "thread_name":
                assert e["args"]["name"] and (e["pid"], e["tid"]) not in names
                names[e["pid"], e["tid"]] = e["args"]["name"]
            elif e["name"] == "process_name":
                procs.add(e["pid"])
        elif e["ph"] == "f":
            assert e["bp"] == "e"
    assert set(tracks) <= set(names), "a track without a thread_name"
    assert {pid for pid, _ in tracks} <= procs, "a process without a process_name"
    for events in tracks.values():  # on one track, slices nest or are apart: never overlap partly
        stack = []
        for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"] and not (
                    e["dur"] == 0 and stack[-1]["ts"] + stack[-1]["dur"] == e["ts"]):
                stack.pop()
            if stack:
                assert e["ts"] + e["dur"] <= stack[-1]["ts"] + stack[-1]["dur"], (e, stack[-1])
            stack.append(e)
    return {"tracks": tracks, "names": names}


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    db = str(tmp_path_factory.mktemp("demo") / "otel-gpu.db")
    return db, build_demo_store(db)


def _export(db, *args):
    code, out = run_cli("traces", "--db", db, "--format", "perfetto", *args)
    assert code == 0
    return json.loads(out)


def test_every_request_and_call_of_the_store(demo):
    db, info = demo
    doc = _export(db, "--limit", "1000")
    found = check_format(doc)
    xs = [e for events in found["tracks"].values() for e in events]
    requests = [e for e in xs if e["cat"] == "request"]
    assert sorted(e["args"]["trace_id"] for e in requests) == sorted(r["trace_id"] for r in info["requests"])
    calls = [e for e in xs if e["cat"] == "cuda" and e["args"]["otel_gpu.attribution"] in ("thread", "task", "process")]
    assert len(calls) == sum(r["calls"] for r in info["requests"])
    windows = [e for e in xs if e["cat"] == "window"]
    # windows whose cost was split to these requests; the demo's outside windows overlap no request
    related = info["windows"]["shared"] + info["windows"]["ambiguous"]
    assert sorted(e["args"]["trace_id"] for e in windows) == sorted(related)
    assert doc["otherData"]["epoch_ns_at_zero"] == min(r["start_ns"] for r in info["requests"])


def test_calls_nest_under_their_request_or_flow_to_it(demo):
    db, info = demo
    doc = _export(db, "--trace-id", info["slowest"]["trace_id"])
    found = check_format(doc)
    request = next(e for es in found["tracks"].values() for e in es if e["cat"] == "request")
    own = [e for e in found["tracks"][request["pid"], request["tid"]] if e["cat"] == "cuda"]
    assert len(own) == info["slowest"]["calls"] - 2  # two launches ran on the worker thread
    for c in own:
        assert request["ts"] <= c["ts"] and c["ts"] + c["dur"] <= request["ts"] + request["dur"]
        assert c["args"]["trace_id"] == info["slowest"]["trace_id"]
    assert {c["name"] for c in own} >= {"cudaLaunchKernel matmul_tile", "cudaMemcpy h2d 4194304 B"}
    worker = found["tracks"][INFERENCE_PID, INFERENCE_PID + 5]
    assert [c["args"]["otel_gpu.attribution"] for c in worker] == ["process", "process"]
    assert found["names"][INFERENCE_PID, INFERENCE_PID + 5] == f"thread {INFERENCE_PID + 5}"
    flows = {}
    for e in doc["traceEvents"]:
        if e["ph"] in "sf":
            flows.setdefault(e["id"], {})[e["ph"]] = e
    assert len(flows) == 2
    for pair in flows.values():
        s, f = pair["s"], pair["f"]
        assert (s["pid"], s["tid"]) == (request["pid"], request["tid"])
        assert request["ts"] <= s["ts"] <= request["ts"] + request["dur"]
        assert any(c["ts"] == f["ts"] for c in worker) and (f["pid"], f["tid"]) == (INFERENCE_PID, INFERENCE_PID + 5)
    ambiguous = [e for es in found["tracks"].values() for e in es if e["cat"] == "window"]
    assert [found["names"][e["pid"], e["tid"]] for e in ambiguous] == ["GPU work, ambiguous request"]
    assert all(e["tid"] > PID_MAX for e in ambiguous)


def test_overlapping_requests_on_one_thread_go_on_lanes(demo):
    db, _ = demo
    doc = _export(db, "--route", "/v1/generate", "--limit", "2")  # the newest pair, open at once
    found = check_format(doc)
    lanes = sorted(tid for (pid, tid), es in found["tracks"].items()
                   if pid == ASYNC_PID and any(e["cat"] == "request" for e in es))
    assert lanes[0] == ASYNC_PID and lanes[1] > PID_MAX and len(lanes) == 2
    assert found["names"][ASYNC_PID, lanes[1]] == f"thread {ASYNC_PID}, lane 2"
    # the task-attributed calls ran on the worker thread: its own track, none on the lanes
    assert all(e["cat"] == "request" for t in lanes for e in found["tracks"][ASYNC_PID, t])
    assert sum(e["cat"] == "cuda" for e in found["tracks"][ASYNC_PID, ASYNC_PID + 9]) == 18


def test_output_file_and_flag_errors(demo, tmp_path, capsys):
    db, info = demo
    out = tmp_path / "trace.json"
    code, stdout = run_cli("traces", "--db", db, "--format", "perfetto", "--slowest", "3", "--output", str(out))
    assert code == 0 and stdout == "" and "wrote 3 requests" in capsys.readouterr().err
    check_format(json.loads(out.read_text()))
    assert run_cli("traces", "--db", db, "--output", str(out))[0] == 2
    assert run_cli("traces", "--db", db, "--format", "perfetto", "--output", str(tmp_path / "no" / "x.json"))[0] == 1
    assert "cannot write the trace" in capsys.readouterr().err


def test_the_format_check_catches_what_viewers_reject():
    track = {"pid": 1, "tid": 1, "cat": "request", "args": {}}
    names = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "t"}},
             {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "p"}}]
    overlap = [{"ph": "X", "name": "a", "ts": 0, "dur": 10, **track}, {"ph": "X", "name": "b", "ts": 5, "dur": 10, **track}]
    with pytest.raises(AssertionError):
        check_format({"traceEvents": names + overlap})
    with pytest.raises(AssertionError):  # a track nobody named
        check_format({"traceEvents": names[1:] + overlap[:1]})
    check_format({"traceEvents": names + [overlap[0], {**overlap[1], "ts": 2, "dur": 8}]})  # nested: fine
