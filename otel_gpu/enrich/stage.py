"""Stage: writes onto each finished request and window what export needs to know
beyond the calls themselves: the process's Resource (service, process, k8s pod), the
route, and the names of the kernels its calls launched. Runs right after the
stitcher, while the processes are most likely still alive to be read. KernelHandle
records (what a kernel handle names) end here: the namer learns them."""
from __future__ import annotations

from typing import Optional

from .. import semconv as sc
from ..pipeline.model import ProcessWindow, Request
from ..records import KernelHandle, ProcessGone, ProcessSeen, RequestSummary
from .resources import ProcessResources
from .routes import RouteTemplater


class Enrich:
    def __init__(self, resources: ProcessResources, routes: RouteTemplater, kernel_names, devices=None) -> None:
        self.resources = resources
        self.devices = devices  # gpu_devices.DeviceIdentities, or None: no uuid/model
        self.routes = routes
        self.kernel_names = kernel_names  # symbols.KernelNames: (pid, func) -> name or None
        self.handles_learned = 0
        self.unnamed = 0  # kernels a request or window launched that got no name (shown as 0x...)

    def process(self, records: list) -> list:
        # Records of a process that exits in this batch come before its ProcessGone; the
        # exit event's comm names a process whose /proc was never read.
        exiting = {r.tgid: r.comm for r in records if type(r) is ProcessGone}
        self.resources.look_for_exits()
        if any(type(r) is KernelHandle for r in records):
            records = self._learn(records)
        for r in records:
            if isinstance(r, (Request, ProcessWindow)):
                self._enrich(r, exiting.get(r.tgid))
            elif isinstance(r, RequestSummary):
                r.resource = self.resources.resource(r.tgid, exiting.get(r.tgid))
            elif isinstance(r, ProcessSeen):
                if r.tgid in exiting:
                    continue
                self.resources.seen(r.tgid)
        for tgid in exiting:
            self.resources.forget(tgid)
            self.kernel_names.forget(tgid)
            if self.devices is not None:
                self.devices.forget(tgid)
        return records

    def _learn(self, records: list) -> list:
        """Learns each KernelHandle in order (a launch later in the batch is named by it)
        and keeps it out of the later stages."""
        out = []
        for r in records:
            if type(r) is KernelHandle:
                self.handles_learned += bool(self.kernel_names.learn(r))
            else:
                out.append(r)
        return out

    def _enrich(self, r, exit_comm: Optional[str]) -> None:
        r.resource = self.resources.resource(r.tgid, exit_comm)
        names, tgid = self.kernel_names, r.tgid
        r.kernel_names = {f: names(tgid, f) for f in r.sink.kernel_funcs()}
        self.unnamed += sum(1 for name in r.kernel_names.values() if name is None)
        if isinstance(r, Request):
            r.route = self.routes.route(r.head.path, str(r.resource.attributes.get(sc.SERVICE_NAME, "")))
            if self.devices is not None:
                r.device_identity = self.devices(r.tgid, r.busy.device, r.busy.api)

    def state(self) -> dict:
        return {"resources": len(self.resources), "kernel_handles_learned": self.handles_learned,
                "kernel_unnamed": self.unnamed}
