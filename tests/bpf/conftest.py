"""bpf tier: real probes in the real kernel, real libcudart (no GPU), real servers."""
from __future__ import annotations

import os
import subprocess

import pytest

from tests.harness import mark_tier, module_collector, receiver, start_collector, start_target  # noqa: F401 (fixtures)


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "bpf tier needs root"
    try:
        import bcc  # noqa: F401
    except ImportError:
        return "bcc is not importable (run scripts/setup.sh)"
    if not os.path.exists("/sys/kernel/debug/tracing/uprobe_events"):
        return "tracefs/debugfs not mounted (run scripts/setup.sh)"
    return None


def pytest_collection_modifyitems(config, items):
    mark_tier(items, "bpf", pytest.mark.bpf, _why_not())


@pytest.fixture(scope="module", autouse=True)
def _tests_make_no_cuda_calls():
    """This process must never load a CUDA library (importing a target server's module
    does): every collector after that would trace it, its OTLP receivers included, and
    the tests' spans would no longer be only their targets'."""
    yield
    with open("/proc/self/maps") as f:
        loaded = sorted({line.split()[-1] for line in f if "libcudart" in line or "libcuda.so" in line})
    assert not loaded, f"the test process loaded {loaded}: import no target's module in a test"


@pytest.fixture
def targets():
    """Target processes a test starts itself (append them): stopped at teardown."""
    started = []
    yield started
    for t in started:
        t.stop()


@pytest.fixture(scope="module")
def shared_collector():
    """One default collector (and its receiver, .receiver) for the tests of a module that
    need no fresh one: they only check their own target's spans. A module's tests that
    start collectors of their own come before the first that uses this one, so that no
    two collectors of the module run at once."""
    with module_collector() as collector:
        yield collector


@pytest.fixture(scope="module")
def probes():
    """The BPF program loaded directly, with no collector (tests/bpf/probe_harness.py),
    one per module; a module that needs more of it overrides this fixture."""
    from tests.bpf.probe_harness import Probes
    p = Probes()
    yield p
    p.close()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    """A self-signed certificate and key for 127.0.0.1 (the HTTPS targets')."""
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True,
                   timeout=60)
    return str(cert), str(key)
