"""`otel-gpu traces --format perfetto` opened in a real trace-event viewer offline:
speedscope (npm, installed by scripts/setup.sh) in headless Chromium. The Perfetto UI and
chrome://tracing cannot be used here: the first is served from the network, the second is
gone from Chromium 156 ("This site can't be reached", even with internal pages enabled)."""
import json
import subprocess
import sys
import time

import pytest

from tests.browser import chromium


def export(db, path, *select):
    subprocess.run([sys.executable, "-m", "otel_gpu.cli", "traces", "--db", db, "--format", "perfetto",
                    "--output", str(path), *select], check=True, capture_output=True, timeout=60)
    return json.loads(path.read_text())


def wait_for(browser, script, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = browser.execute_script(script)
        if value:
            return value
        time.sleep(0.2)
    return None


@pytest.fixture
def speedscope():
    if not chromium.SPEEDSCOPE.exists():
        print(f"skipped: no speedscope at {chromium.SPEEDSCOPE} (scripts/setup.sh installs it)")
        pytest.skip("speedscope is not installed (scripts/setup.sh installs it)")


def open_in_speedscope(browser, trace_json) -> list[dict]:
    """Loads the file; returns the console entries of the import."""
    browser.get("about:blank")  # another #hash on the same page would not reload it
    browser.get_log("browser")
    browser.get(chromium.speedscope_page(str(trace_json), str(trace_json) + ".js"))
    title = wait_for(browser, "return document.title.includes('.json - speedscope') && document.title")
    assert title == f"{trace_json.name} - speedscope"
    logs = browser.get_log("browser")
    assert any("Importing as Trace Event Format profile" in e["message"] for e in logs)
    return logs


@pytest.mark.parametrize("select", ["slowest", "all"])
def test_export_imports_in_speedscope(browser, speedscope, demo, tmp_path, select):
    db, info = demo
    trace = tmp_path / "trace.json"
    doc = export(db, trace, *(("--trace-id", info["slowest"]["trace_id"]) if select == "slowest" else ("--limit", "1000")))
    tracks = {(e["pid"], e["tid"]) for e in doc["traceEvents"] if e["ph"] == "X"}
    logs = open_in_speedscope(browser, trace)
    assert [e for e in logs if e["level"] == "SEVERE"] == []
    assert [e for e in logs if e["level"] == "WARNING" and e.get("source") == "console-api"] == []  # import warnings
    header = browser.execute_script("return document.body.innerText")
    # speedscope makes one profile per (pid, tid) with events, named from our metadata
    assert f"(1/{len(tracks)})" in header and "demo-inference (pid 4242)" in header
    if select == "slowest":  # one request fills the view (ten minutes of them would be specks)
        shot = tmp_path / "trace.png"
        browser.save_screenshot(str(shot))
        # speedscope's own page, with no profile, has ~2% coloured pixels (its logo)
        assert chromium.color_fraction(str(shot)) > 0.08


def test_speedscope_warns_about_slices_that_do_not_nest(browser, speedscope, tmp_path):
    """The no-warning check above can fail: two slices overlapping partly on one thread."""
    track = {"pid": 1, "tid": 1, "cat": "request", "args": {}}
    trace = tmp_path / "bad.json"
    trace.write_text(json.dumps({"traceEvents": [
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "t"}},
        {"ph": "X", "name": "a", "ts": 0, "dur": 10, **track}, {"ph": "X", "name": "b", "ts": 5, "dur": 10, **track}]}))
    logs = open_in_speedscope(browser, trace)
    assert any(e["level"] == "WARNING" and "Tried to end" in e["message"] for e in logs)
