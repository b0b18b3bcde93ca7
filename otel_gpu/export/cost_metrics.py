"""The cost counters (gpu.cost.seconds, gpu.cost.amount) and response chunks, per feature:
the metric stage after the cost stage (pipeline/cost.py), built by GpuMetrics.costs() on
the same instruments."""
from __future__ import annotations

from .. import semconv as sc
from ..pipeline.model import ProcessWindow, Request
from ..records import RequestCost
from .metric_labels import ServiceNames, device_labels
from .metric_values import BatchedAdds

OUTSIDE_FEATURE = "(outside)"  # the feature of a process's GPU time outside requests


def _feature(r: Request) -> str:
    return r.feature or r.route or r.head.path


class CostMetrics:
    """Stage after the cost stage: the cost counters, from the records it priced, and the
    response chunks by the same feature label (cost per token = cost / chunks)."""

    def __init__(self, gpu_seconds, cost, chunks, services: ServiceNames) -> None:
        self.gpu_seconds, self.cost, self.chunks, self.services = gpu_seconds, cost, chunks, services
        self._adds = BatchedAdds()

    def process(self, records: list) -> list:
        for r in records:
            if isinstance(r, Request):
                self._cost(r)  # none yet when it is pending: a RequestCost follows
                if r.chunks:
                    self._adds.add(self.chunks, r.chunks,
                                   ((sc.SERVICE_NAME, self.services.of(r)), (sc.GPU_FEATURE, _feature(r))))
            elif isinstance(r, RequestCost):
                self._cost(r.request)
            elif isinstance(r, ProcessWindow):
                self._window(r)
        self._adds.flush()
        return records

    def _cost(self, r: Request) -> None:
        if r.gpu_seconds:
            self._add(self.services.of(r), _feature(r), "exact", r.gpu_seconds, r.cost or 0.0, device_labels(r))

    def _window(self, w: ProcessWindow) -> None:
        """A window's GPU time no request covers: split among an ambiguous or shared window's
        candidates (by their features), else the process's outside time. With the
        requests' exact time, the counters add up to the processes' busy time."""
        if not w.gpu_seconds:
            return
        service, rate = self.services.of(w), (w.cost or 0.0) / w.gpu_seconds
        if w.split:
            for key, seconds in w.split.items():
                if seconds:
                    self._add(service, w.split_features.get(key) or "(unknown)", "split", seconds, seconds * rate)
        else:
            self._add(service, OUTSIDE_FEATURE, "outside", w.gpu_seconds, w.cost or 0.0)

    def _add(self, service: str, feature: str, share: str, seconds: float, amount: float,
             device: tuple = ()) -> None:
        labels = ((sc.SERVICE_NAME, service), (sc.GPU_FEATURE, feature), (sc.GPU_COST_SHARE, share)) + device
        self._adds.add(self.gpu_seconds, seconds, labels)
        self._adds.add(self.cost, amount, labels)
