"""A launch probe that cannot attach at start is said so, exported, retried, and attached
once it can: no restart, no launch lost after it attaches.

The failure is a real one: this test holds a uprobe on cudaLaunchKernel of a private
copy of the real libcudart with a non-zero reference-counter offset (6, through
libbcc's own bpf_attach_uprobe, exactly what Debian's old bcc bindings registered;
otel_gpu/probes/bcc_abi.py), so the kernel refuses the collector's registration on
the same (inode, offset) (`ref_ctr_offset mismatch`). Then the test lets go."""
from __future__ import annotations

import ctypes as ct
import shutil
import sys

from otel_gpu.demo.cuda_work import find_cudart
from tests.bpf.targets.relia_support import wait_until
from tests.bpf.test_coexistence import LAUNCHES, TARGET, _collector_launches
from tests.harness import Target

FUNCTION = "cudaLaunchKernel"
METRIC_EXPORT_S = 2  # the collector's metric export interval in this test (OTEL_METRIC_EXPORT_INTERVAL)
BPF_PROBE_ENTRY = 0


class ConflictingUprobe:
    """Another tool's uprobe on `symbol` of `path`, registered with ref_ctr_offset=6."""

    def __init__(self, path: str, symbol: str) -> None:
        from bcc import BPF

        from otel_gpu.probes.source import kernel_headers_hint
        kernel_headers_hint()  # bcc needs a header tree even for this
        self.bpf = BPF(text=b"int hold(void *ctx) { return 0; }")
        fn = self.bpf.load_func(b"hold", BPF.KPROBE)
        _, offset = BPF._check_path_symbol(path.encode(), symbol.encode(), None, -1)
        self.lib = ct.CDLL("libbcc.so.0")  # own handle: its argtypes are ours alone
        attach = self.lib.bpf_attach_uprobe
        attach.argtypes = [ct.c_int, ct.c_int, ct.c_char_p, ct.c_char_p, ct.c_uint64, ct.c_int, ct.c_uint32]
        attach.restype = ct.c_int
        self.fd = attach(fn.fd, BPF_PROBE_ENTRY, b"p_otel_gpu_retry_test", path.encode(), offset, -1, 6)
        assert self.fd >= 0, "could not register the conflicting uprobe"

    def release(self) -> None:
        if self.fd >= 0:
            self.lib.bpf_close_perf_event_fd(ct.c_int(self.fd))
            self.fd = -1
        self.bpf.cleanup()


def _probe_gauge(receiver, metric: str, after: int = 0) -> list:
    """Values of `metric` for FUNCTION, one per metric export from index `after` on."""
    out = []
    for req in list(receiver.metric_requests)[after:]:
        for rm in req.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == metric:
                        out += [p.as_int for p in m.gauge.data_points
                                if any(kv.key == "otel_gpu.probe.function" and kv.value.string_value == FUNCTION
                                       for kv in p.attributes)]
    return out


def test_a_launch_probe_refused_at_start_is_reported_then_retried_and_counts(tmp_path, receiver,
                                                                           start_collector):
    cudart = tmp_path / "libcudart.so.12"  # private: other tests' libcudart stays free
    shutil.copyfile(find_cudart(), cudart)
    conflict = ConflictingUprobe(str(cudart), FUNCTION)
    target = Target([sys.executable, "-c", TARGET], {"OTEL_GPU_CUDART": str(cudart)})
    try:
        collector = start_collector("--pid", str(target.pid),
                                    OTEL_METRIC_EXPORT_INTERVAL=str(METRIC_EXPORT_S * 1000))
        collector.wait_traced(target.pid)
        ready = next(l for l in collector.log.lines if "ready" in l)
        assert "DEGRADED" in ready and f"{FUNCTION} not attached in" in ready and str(cudart) in ready, ready
        assert any("WARNING" in l and f"{FUNCTION} not attached" in l for l in collector.log.lines), \
            "".join(collector.log.lines)
        assert wait_until(lambda: any(v >= 1 for v in _probe_gauge(receiver, "otel_gpu.probes.failed")),
                          METRIC_EXPORT_S + 20), "probes.failed never exported"
        assert 0 in _probe_gauge(receiver, "otel_gpu.probes.attached")

        conflict.release()
        exports = len(receiver.metric_requests)
        # Retries at +1, +3, +7, +15, +31 s after start (scans every 2 s): within 40 s of now.
        assert wait_until(lambda: any(f"attached cuda_launch_kernel to {FUNCTION} in" in l and str(cudart) in l
                                      and f"for pid {target.pid} at retry" in l for l in collector.log.lines), 45), \
            "".join(collector.log.lines)
        assert wait_until(lambda: _probe_gauge(receiver, "otel_gpu.probes.attached", exports)[-1:] == [1]
                          and _probe_gauge(receiver, "otel_gpu.probes.failed", exports)[-1:] == [0],
                          METRIC_EXPORT_S * 2 + 10), (_probe_gauge(receiver, "otel_gpu.probes.attached"),
                                                      _probe_gauge(receiver, "otel_gpu.probes.failed"))

        target.go_raw()
        assert target.log.wait_for("launched", 20)
        wait_until(lambda: _collector_launches(receiver, target.pid) >= LAUNCHES, 20)
        assert _collector_launches(receiver, target.pid) == LAUNCHES
    finally:
        conflict.release()
        target.stop()
