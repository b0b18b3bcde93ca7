"""Stopping drains the ring buffer: every batch still in it goes through the pipeline
before open requests are closed, within half the shutdown budget (the rest counted).
The BPF program is a fake that hands out batches."""
import time

from otel_gpu.collector import Collector
from otel_gpu.config import Config
from otel_gpu.records import ProcExit


class BatchesProgram:
    def __init__(self, batches, delay_s=0.0):
        self.batches, self.delay_s, self.closed = list(batches), delay_s, False
        self.calls = []  # the order of what shutdown asked

    def poll(self, timeout_ms):
        self.calls.append("poll")
        time.sleep(self.delay_s)
        return self.batches.pop(0) if self.batches else []

    def read_rollups(self, final=False):
        self.calls.append("rollups")
        return []

    def forget(self, pids):
        pass

    def stop_probes(self):
        self.calls.append("stop_probes")

    def close(self, timeout):
        self.calls.append("close")
        self.closed, self.close_timeout = True, timeout


def pushed(c):
    seen = []
    push = c._push
    c._push = lambda batch: (seen.extend(batch), push(batch))
    return seen


def test_every_batch_left_in_the_ring_goes_through_before_the_final_close(tmp_path):
    c = Collector(Config(proc_root=str(tmp_path), shutdown_timeout_s=5, store_path=None, console=False))
    exits = [[ProcExit(100 + i, i)] for i in range(5)]
    c.program = BatchesProgram(exits)
    seen = pushed(c)
    c.shutdown()
    assert [e.tgid for e in seen if isinstance(e, ProcExit)] == [100, 101, 102, 103, 104]
    assert c.program.closed and c.stats.snapshot().get("ring_undrained_shutdown", 0) == 0
    assert 0 < c.program.close_timeout < 5  # the probes' closes are waited for within --shutdown-timeout


def test_probes_stop_before_the_last_read_and_close_after_it(tmp_path):
    """A record or count made between the last read and the detach would be lost unseen."""
    c = Collector(Config(proc_root=str(tmp_path), shutdown_timeout_s=5, store_path=None, console=False))
    c.program = BatchesProgram([[ProcExit(100, 0)]])
    c.shutdown()
    calls = c.program.calls
    assert calls[0] == "stop_probes" and calls[-2:] == ["rollups", "close"] and "poll" in calls


def test_a_ring_that_does_not_empty_in_time_is_left_counted(tmp_path):
    c = Collector(Config(proc_root=str(tmp_path), shutdown_timeout_s=1, store_path=None, console=False))
    c.program = BatchesProgram([[ProcExit(100 + i, i)] for i in range(1000)], delay_s=0.01)
    started = time.monotonic()
    c.shutdown()
    assert time.monotonic() - started < 1.5
    assert c.stats.snapshot()["ring_undrained_shutdown"] == 1 and c.program.batches


def test_the_stopped_line_lists_drops_apart_from_work_done(tmp_path):
    c = Collector(Config(proc_root=str(tmp_path), shutdown_timeout_s=5, store_path=None, console=False))
    for name, n in (("lost_events", 2), ("spans_exported", 5), ("tls_connections", 1), ("requests_finished", 7)):
        c.stats.add(name, n)
    assert c.summary().endswith("; dropped: lost_events=2; counted: requests_finished=7, spans_exported=5, "
                                "tls_connections=1")
    c.stats = type(c.stats)()
    assert c.summary().endswith("; dropped: none; counted: none")
