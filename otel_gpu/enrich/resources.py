"""Who a traced process is: one OTel Resource per process, read from /proc while the
process lives (service.name from its own OTEL_SERVICE_NAME, else its script or
executable name; host; process; Kubernetes pod when a resolver is configured).
The enrich stage asks; nothing else does. Every value comes from another process (its
environment, argv, comm, pod): each Resource is sanitised here, once."""
from __future__ import annotations

import logging
import os
import select
import socket
from typing import Optional

from opentelemetry.sdk.resources import Resource

from .. import proc, sanitize
from .. import semconv as sc
from ..config import resource_attributes
from ..ratelimit import RateLimitedLog, Stats

log = logging.getLogger(__name__)

_INTERPRETERS = ("python", "node", "ruby", "perl", "java", "php")
_OPTIONS_WITH_VALUE = frozenset({"-X", "-W", "-Q", "--check-hash-based-pycs", "-r", "--require"})
_INLINE_CODE = frozenset({"-c", "-e", "--eval"})  # code on the command line: no script name
# Processes watched by pidfd; past it, by a /proc read per request. A bound, so that a
# host with thousands of traced processes cannot take the fds the collector's BPF maps,
# sockets and files need (the default soft limit is 1024).
MAX_PIDFDS = 256


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


class ProcessResources:
    """A Resource per live process, cached by pid + start time (a reused PID is read again)."""

    def __init__(self, proc_root: str = "/proc", k8s=None, base_attributes: Optional[dict] = None,
                 stats: Optional[Stats] = None, export_command_line: bool = False) -> None:
        self.proc_root = proc_root
        self.k8s = k8s
        # argv often holds secrets (--api-key=...): process.command_line only when asked.
        self.export_command_line = export_command_line
        self.base = {sc.HOST_NAME: socket.gethostname(), **(base_attributes or {})}
        self.stats = stats or Stats()
        self._log = RateLimitedLog(log, self.stats, interval_s=60.0)
        self._resources: dict[int, Resource] = {}
        self._pods_version: dict[int, int] = {}  # k8s pod-cache version each resource saw
        self._started: dict[int, Optional[int]] = {}  # pid -> start time the resource was read at
        self._pidfds: dict[int, int] = {}  # pid -> pidfd of the process the resource was read from
        self._watch = select.poll()  # every pidfd: one poll a batch says which processes exited
        self._exited: set[int] = set()  # pids whose pidfd polled readable at the last look_for_exits

    def look_for_exits(self) -> None:
        """Once a batch, before its resources are asked for: which watched processes have
        exited, with one poll for all of them (a pidfd polls readable once its process
        has exited). Until the next look, a request of a live one reads nothing."""
        if self._pidfds:
            ready = {fd for fd, _ in self._watch.poll(0)}
            self._exited = {pid for pid, fd in self._pidfds.items() if fd in ready} if ready else set()

    def __len__(self) -> int:
        return len(self._resources)

    def seen(self, tgid: int) -> None:
        """A process appeared: read /proc now, while it surely lives (once)."""
        if tgid not in self._resources and os.path.exists(os.path.join(self.proc_root, str(tgid))):
            self._resources[tgid] = self._build(tgid)

    def forget(self, tgid: int) -> None:
        """After a process's last records have passed."""
        self._resources.pop(tgid, None)
        self._pods_version.pop(tgid, None)
        self._started.pop(tgid, None)
        self._close_pidfd(tgid)

    def _close_pidfd(self, pid: int) -> None:
        fd = self._pidfds.pop(pid, None)
        if fd is not None:
            self._watch.unregister(fd)
            os.close(fd)
        self._exited.discard(pid)

    def resource(self, tgid: int, exit_comm: Optional[str] = None) -> Resource:
        """`exit_comm`: the process has exited (its name from the exit event): one never
        read from /proc (its calls were only counted in the kernel) is named from it."""
        res = self._resources.get(tgid)
        if res is None and exit_comm is not None:
            res = self._resources[tgid] = _safe_resource({**self.base, sc.PROCESS_PID: tgid,
                                                          sc.SERVICE_NAME: exit_comm or f"unknown_service:pid{tgid}"})
        elif res is None or self._pid_reused(tgid) or self._pod_appeared(tgid, res):
            res = self._resources[tgid] = self._build(tgid)
        return res

    def _pid_reused(self, pid: int) -> bool:
        """Processes are (pid, start time), in case the exit event of the pid's previous
        owner was lost. Asked per exported request: while the process the resource was
        read from lived at the batch's look_for_exits, no /proc read is needed."""
        if pid in self._pidfds and pid not in self._exited:
            return False
        started = self._started.get(pid)
        current = proc.start_time(self.proc_root, pid)
        return current is not None and started is not None and current != started

    def _pod_appeared(self, tgid: int, res: Resource) -> bool:
        """A resource built while the pod was unknown (API down, pod not yet listed)
        is rebuilt once the pod cache has changed: pod attributes appear then."""
        return (self.k8s is not None and sc.K8S_POD_UID not in res.attributes
                and self._pods_version.get(tgid) != self.k8s.pods_version)

    def _build(self, pid: int) -> Resource:
        self._close_pidfd(pid)
        if len(self._pidfds) < MAX_PIDFDS:  # before the start time: both name one process
            fd = proc.pidfd(self.proc_root, pid)
            if fd is not None:
                self._pidfds[pid] = fd
                self._watch.register(fd, select.POLLIN)
        self._started[pid] = proc.start_time(self.proc_root, pid)
        attrs = dict(self.base)
        attrs[sc.PROCESS_PID] = pid
        argv = proc.cmdline(self.proc_root, pid)
        exe = proc.exe(self.proc_root, pid)
        env = proc.environ(self.proc_root, pid, ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"))
        missing = [name for name, v in (("cmdline", argv), ("exe", exe), ("environ", env)) if v is None]
        if missing:
            self._log.event("proc_unreadable", logging.WARNING,
                            "pid %d: cannot read /proc/%d/%s; spans carry fewer attributes",
                            pid, pid, ",".join(missing))
        argv, env = argv or [], env or {}
        exe = (exe or "").removesuffix(" (deleted)")  # a replaced binary: name the program, not the state
        if exe:
            attrs[sc.PROCESS_EXECUTABLE_PATH] = exe
            attrs[sc.PROCESS_EXECUTABLE_NAME] = os.path.basename(exe)
        if argv and self.export_command_line:
            attrs[sc.PROCESS_COMMAND_LINE] = " ".join(argv)
        attrs.update(resource_attributes(env.get("OTEL_RESOURCE_ATTRIBUTES", ""), strict=False))
        service = env.get("OTEL_SERVICE_NAME")
        if self.k8s is not None:
            self._pods_version[pid] = self.k8s.pods_version
            attrs.update(self.k8s.attributes_for(pid))
            service = service or self.k8s.service_name_for(pid)
        if not service:
            service = service_name_from(argv, exe) if (argv or exe) else f"unknown_service:pid{pid}"
        attrs[sc.SERVICE_NAME] = service
        return _safe_resource(attrs)


def _safe_resource(attrs: dict) -> Resource:
    return Resource(sanitize.attributes(attrs, sanitize.MAX_NETWORK_CHARS))
