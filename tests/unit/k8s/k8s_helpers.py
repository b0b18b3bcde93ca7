"""Shared bits of the k8s tests: polling, a started fake API server, a fake /proc tree."""

import time
from pathlib import Path

CONTAINERD_IDS = ["%064x" % (0xA11CE + n) for n in range(8)]


def eventually(predicate, timeout=5.0, interval=0.02):
    """Polls until predicate() is truthy; returns its value or fails with the last one."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            assert value, f"condition not met within {timeout}s"
            return value
        time.sleep(interval)


def write_proc(root: Path, pid: int, cgroup: str, start_time: int) -> None:
    """<root>/<pid>/{cgroup,stat} as the kernel writes them (a command name with spaces and
    parentheses, start time in field 22)."""
    directory = root / str(pid)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cgroup").write_text(cgroup)
    fields = ["S", "1", str(pid), str(pid), "0", "-1", "4194560"] + ["0"] * 45
    fields[19] = str(start_time)  # fields[0] is field 3, so this is field 22
    (directory / "stat").write_text(f"{pid} (python3 (worker) x) " + " ".join(fields) + "\n")


def pod_cgroup(pod_uid: str, container_id: str) -> str:
    """cgroup v2 text of a burstable pod's container under the systemd driver."""
    escaped = pod_uid.replace("-", "_")
    return (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{escaped}.slice/"
            f"cri-containerd-{container_id}.scope\n")
