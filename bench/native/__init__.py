"""The bench's native loops (C and Go, in this folder): built with gcc (go for the Go one)
and driven, one run of launch_loop at a time."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
from pathlib import Path

from otel_gpu.demo.cuda_work import find_cudart

from ..isolate import OwnCgroup

HERE = Path(__file__).resolve().parent
BUILD = HERE / "build"  # ignored by the repository .gitignore (build/)


def build(name: str = "launch_loop") -> Path:
    """bench/native/<name>.c compiled once per change."""
    src = HERE / f"{name}.c"
    out = BUILD / name
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        BUILD.mkdir(parents=True, exist_ok=True)
        subprocess.run(["gcc", "-O2", "-Wall", "-pthread", "-o", str(out), str(src), "-ldl"], check=True)
    return out


WARMUP_LAUNCHES = 10_000  # launch_loop.c's untimed launch_n(10000) before `ready`


def private_copy(src: str | Path, dst: Path) -> str:
    """src copied to dst (same bytes and mode, an inode of its own) unless dst is already
    that copy; replaced by rename, so a process running the old copy keeps its file."""
    src, dst = Path(src), Path(dst)
    st = src.stat()
    if not dst.exists() or (dst.stat().st_size, dst.stat().st_mtime) != (st.st_size, st.st_mtime):
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(dst.name + ".tmp")
        shutil.copy2(src, tmp)
        os.replace(tmp, dst)
    return str(dst)


def use_private_cudart() -> str:
    """A private copy of libcudart (its own inode) for every process of the run:
    uprobes attach per file, so a copy keeps probes that other tools put on the
    wheel's file out of our timings (a trace-everything collector running at the
    same time would still find the copy: main() waits for those to finish)."""
    if "OTEL_GPU_CUDART" in os.environ:
        return os.environ["OTEL_GPU_CUDART"]
    src = find_cudart()
    os.environ["OTEL_GPU_CUDART"] = private_copy(src, BUILD / Path(src).name)
    return os.environ["OTEL_GPU_CUDART"]


class LaunchLoop:
    """One launch_loop process: started, held at `ready` until go(). With http, go() sends
    one `GET <path>` that stays open for the whole loop; with `requests` (K requests a rep,
    `reps` reps) it sends them one after another on one connection, each once the one
    before is answered. `cudart` and `binary` default to the run's libcudart copy and
    bench/native/build/launch_loop."""

    def __init__(self, *options: str, http: bool = False, path: str = "/loop", cudart: str | None = None,
                 binary: str | Path | None = None, requests: int = 0, reps: int = 1) -> None:
        argv = [str(binary or build()), cudart or find_cudart(), *options] + (["--http"] if http else [])
        if requests:
            argv += ["--requests", str(requests), "--reps", str(reps)]
        self.sequence = requests * reps
        self.path = path
        self.cgroup = OwnCgroup()  # the bench process is not a related server of it (isolate.py)
        self.proc = subprocess.Popen(self.cgroup.wrap(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        self.port = None
        line = self.proc.stdout.readline()
        if line.startswith("port "):
            self.port = int(line.split()[1])
            line = self.proc.stdout.readline()
        if not line.startswith("ready "):
            raise RuntimeError(f"launch_loop did not start: {line!r}")
        self.pid = int(line.split()[1])
        self.client = None

    def warm(self, n: int) -> None:
        """n untimed launches more before go(), where a tracer may watch them."""
        self.proc.stdin.write(f"warm {n}\n")
        self.proc.stdin.flush()
        if self.proc.stdout.readline().strip() != "warmed":
            raise RuntimeError("launch_loop did not warm")

    def go(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        if not self.port:
            return
        self.client = socket.create_connection(("127.0.0.1", self.port), timeout=700)
        request = f"GET {self.path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode()
        if not self.sequence:  # one request, answered after the loop
            self.client.sendall(request)
            return
        self.answered = 0
        self._sender = threading.Thread(target=self._send_each, args=(request,), daemon=True)
        self._sender.start()

    def _send_each(self, request: bytes) -> None:
        """Each request once the one before is answered (the loop reads one per read)."""
        for _ in range(self.sequence):
            self.client.sendall(request)
            if not self.client.recv(256):
                return
            self.answered += 1

    def result(self, timeout: float = 700) -> dict:
        """{'reps': [wall ns per launch], 'cpu_reps': [thread CPU ns per launch], 'launched': n,
        'seconds': s} once the loop is done."""
        out, _ = self.proc.communicate(timeout=timeout)
        self.cgroup.remove()
        res = {"reps": [], "cpu_reps": [], "launched": 0, "seconds": None}
        for line in out.splitlines():
            f = line.split()
            if f and f[0] == "rep":
                res["reps"].append(float(f[2]))
                res["cpu_reps"].append(float(f[3]))
            elif f and f[0] == "launched":
                res["launched"] = int(f[1])
                res["seconds"] = float(f[2]) if len(f) > 2 else None
        if self.client and self.sequence:
            self._sender.join(10)
            res["answered"] = self.answered
            self.client.close()
        elif self.client:
            self.client.settimeout(10)
            res["response"] = self.client.recv(256).decode(errors="replace").split("\r\n", 1)[0]
            self.client.close()
        return res
