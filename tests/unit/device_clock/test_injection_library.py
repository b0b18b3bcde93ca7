"""libotel_gpu_cupti.so (cupti/otel_gpu_cupti.c), the CUPTI injection library of device-clock
mode, over a FAKE CUPTI (cupti/fake/fake_cupti.c: no GPU here, so the real one never reports a
record), driven by cupti/fake/driver.c: a stand-in CUDA service whose own
otel_gpu_device_records interposes the library's and prints every hand-off, as the collector's
uprobe would see it. Two threads make API calls and records that encode their thread; every
record must arrive once, exactly as made, tagged with the thread that made its API call, on the
monotonic clock, and nothing at all may happen while the collector's flag file is absent."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from otel_gpu.device_clock import library as build

CUPTI = build.SOURCES

FAKE_CLOCK_OFFSET_NS = 10**12                       # fake_cupti.c's FAKE_CUPTI_CLOCK_OFFSET_NS
THREADS, CALLS, LEAD_NS, ORPHAN = 2, 50, 200_000, 999_999  # driver.c's
KERNEL, MEMCPY, MEMSET = 1, 2, 3
RUNTIME_DOMAIN, API_IDS = 2, {KERNEL: 211, MEMCPY: 41, MEMSET: 51}  # driver.c's: the runtime calls it makes them as
PER_PHASE = THREADS * CALLS * 3
SLACK_NS = 1_000_000  # the library's clock-offset sample may err by half a preempted bracket


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if build.headers() is None:
        pytest.skip("no CUPTI headers (neither /usr/local/cuda/include nor an nvidia-cuda-cupti wheel)")
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    out = tmp_path_factory.mktemp("cupti")
    driver = out / "driver"
    subprocess.run(["gcc", "-std=c11", "-O2", "-Wall", "-Wextra", "-pthread", "-rdynamic",
                    "-o", str(driver), str(CUPTI / "fake" / "driver.c"), "-ldl"],
                   check=True, capture_output=True, timeout=60)
    return build.build(out), build.build_fake(out), driver


def run(built, tmp_path, mode, *, flag, cupti_lib=None):
    library, fake, driver = built
    flag_path = tmp_path / "device-clock"
    if flag:
        flag_path.touch()
    env = {**os.environ, "OTEL_GPU_CUPTI_LIB": str(cupti_lib or fake), "OTEL_GPU_DEVICE_CLOCK_FLAG": str(flag_path)}
    return subprocess.run([str(driver), str(library), mode], env=env, capture_output=True, text=True, timeout=20)


def lines(stdout, prefix):
    return [{k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}
            for line in stdout.splitlines() if re.match(re.escape(prefix) + "[ =]", line)]


def made(phase):
    """What driver.c's threads make in `phase`, by correlation id (see its work())."""
    out = {}
    for t in range(THREADS):
        for i in range(CALLS):
            for k, kind in enumerate((KERNEL, MEMCPY, MEMSET)):
                out[phase * 100_000 + (t + 1) * 10_000 + 3 * i + k] = {
                    "kind": kind, "thread": t, "stream": 7 + t, "dev": t, "duration": 1000 + i,
                    "bytes": (0, (t + 1) * 1_000_000 + i, (t + 1) * 2_000_000 + i)[k],
                    "copy": t + 1 if kind == MEMCPY else 0, "api": (RUNTIME_DOMAIN, API_IDS[kind])}
    return out


def arrived(records, tids):
    """The records as made, with the phase-and-thread its tid names (None for an unknown tid)."""
    by_tid = {tid: t for t, tid in tids.items()}
    return {r["corr"]: {"kind": r["kind"], "thread": by_tid.get(r["tid"], (None, None))[1], "stream": r["stream"],
                        "dev": r["dev"], "duration": r["end"] - r["start"], "bytes": r["bytes"], "copy": r["copy"],
                        "api": (r["domain"], r["cbid"])}
            for r in records}


def check_timing(records, stdout):
    (clock,) = lines(stdout, "clock")
    for r in records:
        # The fake's clock is monotonic + 1e12: unconverted, start would be ~1e12 past t1.
        assert clock["t0"] <= r["api"] <= r["start"] <= clock["t1"] + LEAD_NS + SLACK_NS, r


def test_records_reach_the_probe_point_once_with_their_thread_on_the_monotonic_clock(built, tmp_path):
    done = run(built, tmp_path, "trace", flag=True)
    assert (done.returncode, done.stderr) == (0, "")
    assert lines(done.stdout, "init") == [{"init": 1}]
    # The periodic flush delivered them all, not the exit handler.
    assert "timeout" not in done.stdout and len(lines(done.stdout, "waited records")) == 1

    records, calls = lines(done.stdout, "rec"), lines(done.stdout, "call")
    assert sorted(r["corr"] for r in records) == sorted([*made(1), ORPHAN])  # each exactly once
    assert max(c["count"] for c in calls) == 16 and sum(c["count"] for c in calls) == len(records)

    tids = {(t["phase"], t["t"]): t["tid"] for t in lines(done.stdout, "thread")}
    assert len(set(tids.values())) == THREADS
    (orphan,) = [r for r in records if r["corr"] == ORPHAN]
    records.remove(orphan)
    assert arrived(records, tids) == made(1)
    check_timing(records, done.stdout)
    # A record whose API call went unseen arrives without thread and entry time, and is counted;
    # one without timestamps (driver.c's UNTIMED) does not arrive, and is counted.
    assert (orphan["kind"], orphan["tid"], orphan["api"], orphan["domain"], orphan["cbid"]) == (KERNEL, 0, 0, 0, 0)
    assert sum(c["dropped"] for c in calls) == 2


def test_nothing_happens_without_the_flag_file(built, tmp_path):
    done = run(built, tmp_path, "off", flag=False)
    assert (done.returncode, done.stderr) == (0, "")
    assert lines(done.stdout, "init") == [{"init": 1}]
    assert lines(done.stdout, "rec") == lines(done.stdout, "call") == []
    assert lines(done.stdout, "callbacks")[0]["callbacks"] == 0  # API callbacks stay off too


def test_the_flag_file_switches_tracing_on_and_off(built, tmp_path):
    """Phase 1 without the flag, phase 2 once the library saw it appear, phase 3 once it saw it
    go: only phase 2 reaches the probe point, and only phase 2's API calls reached the library."""
    done = run(built, tmp_path, "toggle", flag=False)
    assert (done.returncode, done.stderr) == (0, "")
    assert "timeout" not in done.stdout
    records = lines(done.stdout, "rec")
    tids = {(t["phase"], t["t"]): t["tid"] for t in lines(done.stdout, "thread")}
    assert sorted(r["corr"] for r in records) == sorted(made(2))
    assert arrived(records, {k: v for k, v in tids.items() if k[0] == 2}) == made(2)
    check_timing(records, done.stdout)
    assert sum(c["dropped"] for c in lines(done.stdout, "call")) == 0
    assert lines(done.stdout, "callbacks")[0]["callbacks"] == 2 * PER_PHASE  # ENTER and EXIT


def test_without_libcupti_the_service_runs_on_after_one_line(built, tmp_path):
    done = run(built, tmp_path, "trace", flag=True, cupti_lib="/nonexistent")
    assert done.returncode == 0
    assert lines(done.stdout, "init") == [{"init": 0}]
    (line,) = done.stderr.splitlines()
    assert line.startswith("otel-gpu-cupti: ") and "/nonexistent" in line


def _real_libcuptis():
    paths = sysconfig.get_paths()
    wheels = [Path(site) / "nvidia" / "cuda_cupti" / "lib" for site in {paths["purelib"], paths["platlib"]}]
    return sorted({p.resolve() for d in (Path("/usr/local/cuda/lib64"), *wheels) for p in d.glob("libcupti.so.*")
                   if re.fullmatch(r"libcupti\.so\.\d+", p.name)})


@pytest.mark.parametrize("libcupti", _real_libcuptis() or [None], ids=str)
def test_a_real_libcupti_has_every_function_the_library_uses(built, tmp_path, libcupti):
    """Without a GPU its init fails past the lookups (one line, return 0); with one it succeeds."""
    if libcupti is None:
        pytest.skip("no real libcupti.so.N here")
    done = run(built, tmp_path, "init", flag=False, cupti_lib=libcupti)
    assert done.returncode == 0
    assert "lacks" not in done.stderr and len(done.stderr.splitlines()) <= 1
