"""interrupt_until: a process that sleeps through its first SIGINT (as bpftrace 0.17
sometimes does) still answers, and one that never answers is reported as such."""
from __future__ import annotations

import subprocess
import sys

from otel_gpu.demo.runner import LineWatcher, interrupt_until, stop_process

# Prints "ready", ignores its first SIGINT, prints "answered" at the second.
SLEEPER = """
import signal, sys, time
seen = []
def on_int(*_):
    seen.append(1)
    if len(seen) == 2:
        print("answered", flush=True)
signal.signal(signal.SIGINT, on_int)
print("ready", flush=True)
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    time.sleep(0.05)
"""


def _sleeper() -> tuple[subprocess.Popen, LineWatcher]:
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER], stdout=subprocess.PIPE, text=True)
    out = LineWatcher(proc.stdout, echo=None)
    assert out.wait_for("ready", 10)
    return proc, out


def test_a_second_sigint_is_sent_when_the_first_goes_unanswered():
    proc, out = _sleeper()
    try:
        assert interrupt_until(proc, lambda t: out.wait_for("answered", t), wait_s=1.0)
    finally:
        stop_process(proc, timeout=5)


def test_one_that_never_answers_is_false_after_its_tries():
    proc, out = _sleeper()
    try:
        assert not interrupt_until(proc, lambda t: out.wait_for("never printed", t), tries=1, wait_s=0.5)
    finally:
        stop_process(proc, timeout=5)
