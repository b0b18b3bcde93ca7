"""A CUDA process that is also an OTLP/gRPC receiver, as a GPU pod with an OTel Collector
sidecar in one process (or a service that embeds one): the collector, exporting to it,
makes connections that this traced process accepts. Once a line comes on stdin it
starts receiving and launches grid (0, 1, 1) every 100 ms (so that the collector traces
it and has spans to send); every span received is printed to stderr as
"span <name> <process.pid>".

  python otlp_sidecar.py        prints "listening on PORT" to stderr first"""
from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.bpf.targets.async_servers import launch  # noqa: E402
from tests.support.otlp_receiver import OtlpReceiver  # noqa: E402


class Printing(OtlpReceiver):
    def keep(self, request) -> None:
        for rs in request.resource_spans:
            pid = next((a.value.int_value for a in rs.resource.attributes if a.key == "process.pid"), 0)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    print(f"span {s.name} {pid}", file=sys.stderr, flush=True)


def main() -> None:
    receiver = Printing()
    print(f"listening on {receiver.port}", file=sys.stderr, flush=True)
    sys.stdin.readline()
    receiver.start()
    while True:
        launch(0)
        time.sleep(0.1)


if __name__ == "__main__":
    main()
