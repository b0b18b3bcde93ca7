"""Who a traced process is: one OTel Resource per process, read from /proc while the
process lives (service.name from its own OTEL_SERVICE_NAME, else its script or
executable name; host; process; Kubernetes pod when a resolver is configured)."""
from __future__ import annotations

import logging
import os
import socket
from typing import Optional

from opentelemetry.sdk.resources import Resource

from .. import semconv as sc
from ..config import resource_attributes
from ..ratelimit import RateLimitedLog, Stats
from .model import ProcessGone, ProcessSeen

log = logging.getLogger(__name__)

_INTERPRETERS = ("python", "node", "ruby", "perl", "java", "php")
_OPTIONS_WITH_VALUE = frozenset({"-X", "-W", "-Q", "--check-hash-based-pycs", "-r", "--require"})
_INLINE_CODE = frozenset({"-c", "-e", "--eval"})  # code on the command line: no script name


def read_proc(proc_root: str, pid: int, name: str) -> bytes:
    with open(os.path.join(proc_root, str(pid), name), "rb") as f:
        return f.read()


def start_time(proc_root: str, pid: int) -> Optional[int]:
    """Field 22 of /proc/<pid>/stat (after the parenthesised comm, which may hold spaces)."""
    try:
        stat = read_proc(proc_root, pid, "stat")
    except OSError:
        return None
    return int(stat.rsplit(b")", 1)[1].split()[19])


def service_name_from(argv: list[str], exe: str) -> str:
    """`python3 app.py` -> app; `python -m pkg.server` -> pkg.server; else exe name."""
    base = os.path.basename(exe.removesuffix(" (deleted)") if exe else (argv[0] if argv else "")) or "unknown"
    if base.startswith(_INTERPRETERS) and len(argv) > 1:
        args = iter(argv[1:])
        for a in args:
            if a in _INLINE_CODE:
                return base
            if a == "-m":
                return next(args, base)
            if a in _OPTIONS_WITH_VALUE:
                next(args, None)
            elif not a.startswith("-"):
                return os.path.splitext(os.path.basename(a))[0] or base
    return base


class ProcessCatalog:
    """Stage: caches a Resource per live process (pid + start time, so a reused PID
    is read again); passes every record on unchanged."""

    def __init__(self, proc_root: str = "/proc", k8s=None, base_attributes: Optional[dict] = None,
                 stats: Optional[Stats] = None) -> None:
        self.proc_root = proc_root
        self.k8s = k8s
        self.base = {sc.HOST_NAME: socket.gethostname(), **(base_attributes or {})}
        self.stats = stats or Stats()
        self._log = RateLimitedLog(log, self.stats, interval_s=60.0)
        self._resources: dict[int, Resource] = {}
        self._pods_version: dict[int, int] = {}  # k8s pod-cache version each resource saw
        self._started: dict[int, Optional[int]] = {}  # pid -> start time the resource was read at

    def process(self, records: list) -> list:
        for r in records:
            if isinstance(r, ProcessSeen):
                self._resources[r.tgid] = self._build(r.tgid)
            elif isinstance(r, ProcessGone) and r.tgid not in self._resources:
                # Gone before /proc was read (its calls were only counted in the kernel):
                # name it from the exit event. Kept until forget(), for its last rollups.
                self._resources[r.tgid] = Resource({**self.base, sc.PROCESS_PID: r.tgid,
                                                    sc.SERVICE_NAME: r.comm or f"unknown_service:pid{r.tgid}"})
        return records

    def forget(self, tgid: int) -> None:
        """After a process's last spans are out (the collector's flush after its exit)."""
        self._resources.pop(tgid, None)
        self._pods_version.pop(tgid, None)
        self._started.pop(tgid, None)

    def resource(self, tgid: int) -> Resource:
        res = self._resources.get(tgid)
        if res is None or self._pid_reused(tgid) or self._pod_appeared(tgid, res):
            res = self._resources[tgid] = self._build(tgid)
        return res

    def _pid_reused(self, pid: int) -> bool:
        """Processes are (pid, start time), in case the exit event of the pid's previous
        owner was lost. One small /proc read per exported request."""
        started = self._started.get(pid)
        current = start_time(self.proc_root, pid)
        return current is not None and started is not None and current != started

    def _pod_appeared(self, tgid: int, res: Resource) -> bool:
        """A resource built while the pod was unknown (API down, pod not yet listed)
        is rebuilt once the pod cache has changed: pod attributes appear then."""
        return (self.k8s is not None and sc.K8S_POD_UID not in res.attributes
                and self._pods_version.get(tgid) != self.k8s.pods_version)

    def _build(self, pid: int) -> Resource:
        self._started[pid] = start_time(self.proc_root, pid)
        attrs = dict(self.base)
        attrs[sc.PROCESS_PID] = pid
        env: dict[str, str] = {}
        argv: list[str] = []
        exe = ""
        try:
            argv = [a.decode(errors="replace") for a in read_proc(self.proc_root, pid, "cmdline").split(b"\0") if a]
            # A replaced binary reads "/path (deleted)": name the program, not the state.
            exe = os.readlink(os.path.join(self.proc_root, str(pid), "exe")).removesuffix(" (deleted)")
            for item in read_proc(self.proc_root, pid, "environ").split(b"\0"):
                k, sep, v = item.partition(b"=")
                if sep and k in (b"OTEL_SERVICE_NAME", b"OTEL_RESOURCE_ATTRIBUTES"):
                    env[k.decode()] = v.decode(errors="replace")
        except OSError as e:
            self._log.event("proc_unreadable", logging.WARNING,
                            "pid %d: cannot read /proc (%s); spans carry fewer attributes", pid, e)
        if exe:
            attrs[sc.PROCESS_EXECUTABLE_PATH] = exe
            attrs[sc.PROCESS_EXECUTABLE_NAME] = os.path.basename(exe)
        if argv:
            attrs[sc.PROCESS_COMMAND_LINE] = " ".join(argv)[:1024]
        attrs.update(resource_attributes(env.get("OTEL_RESOURCE_ATTRIBUTES", ""), strict=False))
        service = env.get("OTEL_SERVICE_NAME")
        if self.k8s is not None:
            self._pods_version[pid] = self.k8s.pods_version
            attrs.update(self.k8s.attributes_for(pid))
            service = service or self.k8s.service_name_for(pid)
        if not service:
            service = service_name_from(argv, exe) if (argv or exe) else f"unknown_service:pid{pid}"
        attrs[sc.SERVICE_NAME] = service
        return Resource(attrs)
