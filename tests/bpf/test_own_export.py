"""The collector's own export is never traced: exporting to an OTLP receiver inside a
process it traces (tests/bpf/targets/otlp_sidecar.py, a GPU pod's collector sidecar in
one process), the collector's gRPC connection is accepted there like any client's. It is
recognised as the collector's own (own_sockets.py) and followed no further: no server
span for any TraceService/Export RPC reaches the receiver, while the process's own GPU
work does, and the connection is counted (connections_own_export)."""
from __future__ import annotations

import sys
import time

from tests.harness import TARGETS, Target, check_clean
from tests.support.collector_process import CollectorProcess


def test_export_to_a_traced_receiver_makes_no_span_of_its_own():
    sidecar = Target([sys.executable, str(TARGETS / "otlp_sidecar.py")])
    collector = None
    try:
        collector = CollectorProcess([], {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sidecar.port}",
                                          "OTEL_BSP_SCHEDULE_DELAY": "200"})
        sidecar.go_raw()
        collector.wait_traced(sidecar.pid)
        assert sidecar.log.wait_for(f"span GPU work outside requests {sidecar.pid}", 30)  # its exports arrive
        time.sleep(3)  # several more exports, each of which would have been a request
        names = [line.split()[1:] for line in sidecar.log.lines if line.startswith("span ")]
        assert not [n for n in names if "Export" in " ".join(n)], names
        collector.stop()
        check_clean(collector)
        assert collector.counts()["counted"].get("connections_own_export", 0) >= 1, "".join(collector.log.lines)
    finally:
        if collector is not None:
            collector.stop()
        sidecar.stop()
