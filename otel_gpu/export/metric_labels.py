"""Label values both metric stages share (export/metrics.py, export/cost_metrics.py): the
service a record's process names, bounded, and the device its GPU work ran on."""
from __future__ import annotations

from .. import semconv as sc
from ..pipeline.model import Request
from ..ratelimit import Stats
from ..value_cap import MAX_SERVICES

OTHER = "other"  # the label value past a bound (services, kernel names)


def device_labels(r: Request) -> tuple:
    """The device of a request's GPU work, by OBI's labels, as (key, value) pairs:
    cuda.device.index (hip.device.* for a HIP ordinal), and .uuid/.model where the driver
    says which GPU that is (gpu_devices.Identity)."""
    index, uuid, model = sc.DEVICE_LABELS[r.busy.api]
    labels = () if r.busy.device is None else ((index, r.busy.device),)
    identity = r.device_identity
    if identity is not None:
        labels += tuple((k, v) for k, v in ((uuid, identity.uuid), (model, identity.model)) if v)
    return labels


class ServiceNames:
    """service.name label values: a traced process picks its own (OTEL_SERVICE_NAME), so
    past MAX_SERVICES distinct names they fold into OTHER, as kernel names do. One set for
    both metric stages."""

    def __init__(self, stats: Stats) -> None:
        self.stats = stats
        self._names: set[str] = set()

    def of(self, record) -> str:
        res = record.resource
        name = str(res.attributes.get(sc.SERVICE_NAME, "unknown")) if res is not None else "unknown"
        if name not in self._names:
            if len(self._names) >= MAX_SERVICES:
                self.stats.add("services_folded")
                return OTHER
            self._names.add(name)
        return name
