"""probes/uprobe_links.choose: which way uprobes are planted for each setting, and the
one log line that says so. The kernel's answer (uprobe_multi.supported) is faked here;
tests/bpf/test_probe_lifecycle.py and test_probe_closer.py plant both for real."""
from __future__ import annotations

import errno
import logging
import os

import pytest

from otel_gpu.probes import uprobe_links, uprobe_multi


@pytest.fixture
def kernel(monkeypatch):
    answer = {"ok": True, "why": ""}
    monkeypatch.setattr(uprobe_multi, "supported", lambda: (answer["ok"], answer["why"]))
    return answer


def test_auto_takes_links_where_the_kernel_makes_them(kernel, caplog):
    caplog.set_level(logging.INFO, "otel_gpu.probes.uprobe_links")
    assert isinstance(uprobe_links.choose(object(), "auto"), uprobe_links.MultiLinks)
    assert [r.getMessage() for r in caplog.records] == ["uprobes: uprobe_multi links"]


def test_auto_falls_back_to_perf_events_and_says_why(kernel, caplog):
    caplog.set_level(logging.INFO, "otel_gpu.probes.uprobe_links")
    kernel.update(ok=False, why="program load refused: Invalid argument")
    assert isinstance(uprobe_links.choose(object(), "auto"), uprobe_links.PerfUprobes)
    assert [r.getMessage() for r in caplog.records] == [
        "uprobes: perf-event uprobes (no uprobe_multi links here: program load refused: Invalid argument)"]


def test_multi_without_kernel_support_is_an_error(kernel):
    kernel.update(ok=False, why="link refused: Operation not permitted")
    with pytest.raises(RuntimeError, match="link refused"):
        uprobe_links.choose(object(), "multi")


def test_perf_never_asks_the_kernel(monkeypatch):
    monkeypatch.setattr(uprobe_multi, "supported", lambda: pytest.fail("asked"))
    assert isinstance(uprobe_links.choose(object(), "perf"), uprobe_links.PerfUprobes)


def _fake_loads(monkeypatch, errors: list) -> list:
    """uprobe_multi's bpf(2) answering with each errno of `errors` in turn, then fd 42."""
    calls = []

    def bpf(cmd, attr):
        calls.append(cmd)
        if errors:
            err = errors.pop(0)
            raise OSError(err, os.strerror(err))
        return 42
    monkeypatch.setattr(uprobe_multi, "_bpf", bpf)
    return calls


def test_a_load_the_verifier_gave_up_on_for_a_signal_is_tried_again(monkeypatch):
    calls = _fake_loads(monkeypatch, [errno.EAGAIN] * (uprobe_multi.LOAD_ATTEMPTS - 1))
    assert uprobe_multi.load_program(b"f", b"\0" * 16, b"GPL") == 42
    assert len(calls) == uprobe_multi.LOAD_ATTEMPTS


def test_a_refusal_is_not_tried_again_but_loaded_once_more_for_its_log(monkeypatch):
    calls = _fake_loads(monkeypatch, [errno.EINVAL, errno.EINVAL])
    with pytest.raises(OSError) as e:
        uprobe_multi.load_program(b"f", b"\0" * 16, b"GPL")
    assert e.value.errno == errno.EINVAL and len(calls) == 2
