"""Kernel-side BPF run time per program (kernel.bpf_stats_enabled), read from
another process's program fds: /proc/<pid>/fdinfo has run_time_ns and run_cnt;
the name comes from BPF_OBJ_GET_INFO_BY_FD on a copy of the fd (pidfd_getfd).
Names are cut at 15 characters by the kernel. Stats cost ~20-50 ns per run, so
they are enabled only around dedicated loops, never the timed ones."""
from __future__ import annotations

import contextlib
import ctypes as ct
import os

SYS_BPF, SYS_PIDFD_OPEN, SYS_PIDFD_GETFD = 321, 434, 438  # x86-64
BPF_OBJ_GET_INFO_BY_FD = 15
STATS = "/proc/sys/kernel/bpf_stats_enabled"
# otel-gpu's launch programs (bpf/cuda_probes.c cuda_launch_kernel*, cu_launch_kernel*), by
# the names the kernel keeps (15 characters)
LAUNCH_PROGRAMS = ("cuda_launch_ker", "cu_launch_kerne")
_libc = ct.CDLL(None, use_errno=True)


class _InfoAttr(ct.Structure):
    _fields_ = [("bpf_fd", ct.c_uint32), ("info_len", ct.c_uint32), ("info", ct.c_uint64)]


def _name(fd: int) -> str:
    info = ct.create_string_buffer(256)
    attr = _InfoAttr(fd, 256, ct.addressof(info))
    if _libc.syscall(SYS_BPF, BPF_OBJ_GET_INFO_BY_FD, ct.byref(attr), ct.sizeof(attr)) != 0:
        return "?"
    return info.raw[64:80].split(b"\0", 1)[0].decode(errors="replace")  # bpf_prog_info.name


def snapshot(pid: int) -> dict:
    """prog_id -> (name, run_cnt, run_time_ns) for the BPF programs pid holds."""
    out = {}
    pidfd = _libc.syscall(SYS_PIDFD_OPEN, pid, 0)
    if pidfd < 0:
        return out
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:bpf-prog":
                    continue
                with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                    info = dict(l.split(":", 1) for l in f if ":" in l)
            except OSError:
                continue
            prog_id = int(info.get("prog_id", "0"))
            local = _libc.syscall(SYS_PIDFD_GETFD, pidfd, int(fd), 0)
            name = "?"
            if local >= 0:
                name = _name(local)
                os.close(local)
            out[prog_id] = (name, int(info.get("run_cnt", "0")), int(info.get("run_time_ns", "0")))
    finally:
        os.close(pidfd)
    return out


def snapshot_self() -> dict:
    """Like snapshot(), for this process's own programs."""
    return snapshot(os.getpid())


def delta(before: dict, after: dict) -> list[tuple[str, int, int]]:
    """(name, runs, ns) per program that ran in between, most time first."""
    rows = []
    for pid, (name, cnt, ns) in after.items():
        _, c0, n0 = before.get(pid, (name, 0, 0))
        if cnt > c0:
            rows.append((name, cnt - c0, ns - n0))
    return sorted(rows, key=lambda r: -r[2])


@contextlib.contextmanager
def enabled():
    with open(STATS) as f:
        old = f.read().strip()
    with open(STATS, "w") as f:
        f.write("1")
    try:
        yield
    finally:
        with open(STATS, "w") as f:
            f.write(old)


def launch_runs(ran: list, launched: int) -> dict:
    """Of delta()'s rows, otel-gpu's launch programs: each, and their runs and ns a launch
    over `launched` launches (#44: 1.00 runs a launch is one trap)."""
    launch = [(name, runs, ns) for name, runs, ns in ran if name.startswith(LAUNCH_PROGRAMS)]
    n = max(launched, 1)
    return {"programs": launch, "runs_per_launch": sum(r for _, r, _ in launch) / n,
            "ns_per_launch": sum(ns for _, _, ns in launch) / n}
