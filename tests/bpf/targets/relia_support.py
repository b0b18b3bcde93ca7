"""Helpers shared by the tests/bpf/test_reliability_*.py files (not a target
program): the collector's final counters and its "state:" lines, its RSS, C targets."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

from otel_gpu.pipeline.model import ATTRIBUTIONS

TARGETS = Path(__file__).resolve().parent


def stopped_counters(collector, timeout: float = 15) -> dict:
    """The counters of the run (collector already stopped), from the final state it left
    (tests/support CollectorProcess.counts): each drop and other counter by name, plus
    requests, spans and CUDA calls by attribution (attributed.<outcome>)."""
    counts = collector.counts(timeout)
    assert counts, "no final state:\n" + "".join(collector.log.lines[-20:])
    out = {"requests": counts["requests"], "spans": counts["spans"],
           **{f"attributed.{k}": counts[k] for k in ATTRIBUTIONS}}
    out.update(counts["dropped"])
    out.update(counts["counted"])
    return out


def state(collector, timeout: float = 5) -> dict:
    """Sends SIGUSR1 and parses the next "state:" line."""
    before = len(collector.log.lines)
    collector.proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in collector.log.lines[before:]:
            if "state:" in line:
                return {k: int(v) for k, v in re.findall(r"([\w.]+)=(\d+)", line.split("state:", 1)[1])}
        time.sleep(0.05)
    raise AssertionError("no state line after SIGUSR1:\n" + "".join(collector.log.lines[-20:]))


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def build_c(name: str, out_dir: Path) -> str:
    exe = out_dir / name
    subprocess.run(["gcc", "-O1", "-o", str(exe), str(TARGETS / f"{name}.c"), "-ldl"], check=True)
    return str(exe)


def lines_with(collector, needle: str) -> list:
    return [l for l in collector.log.lines if needle in l]


def wait_until(predicate, timeout: float, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    value = predicate()
    while not value and time.monotonic() < deadline:
        time.sleep(interval)
        value = predicate()
    return value


def cudart_path() -> str:
    from otel_gpu.demo.cuda_work import find_cudart
    return os.path.realpath(find_cudart())


def make_receiver_class():
    """An OtlpReceiver variant that keeps each span's status message (span_id -> message
    in `.messages`) and counts its trace exports."""
    from tests.support.otlp_receiver import OtlpReceiver

    class DetailReceiver(OtlpReceiver):
        def __init__(self, port: int = 0) -> None:
            super().__init__(port)
            self.messages = {}
            self.exports = 0

        def Export(self, request, context):
            for rs in request.resource_spans:
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        self.messages[s.span_id.hex()] = s.status.message
            self.exports += 1
            return super().Export(request, context)

    return DetailReceiver
