"""The CUPTI callback ids of device_clock/apis.py are CUPTI's, as its headers number them,
and each names a call the probes attach to."""
from __future__ import annotations

import re

import pytest

from otel_gpu.cuda_calls import BY_NAME, Category
from otel_gpu.device_clock import apis, library


def _header_ids(name: str, prefix: str) -> dict:
    include = library.headers()
    if include is None or not (include / name).is_file():
        pytest.skip(f"no CUPTI headers ({name})")
    text = (include / name).read_text()
    return {int(n): s for s, n in re.findall(rf"{prefix}(\w+?)(?:_v\d+)?\s*=\s*(\d+)", text)}


def test_runtime_ids_are_cuptis():
    ids = _header_ids("cupti_runtime_cbid.h", "CUPTI_RUNTIME_TRACE_CBID_")
    assert {cbid: ids[cbid] for cbid in apis.RUNTIME_APIS} == apis.RUNTIME_APIS


def test_driver_ids_are_cuptis():
    ids = _header_ids("cupti_driver_cbid.h", "CUPTI_DRIVER_TRACE_CBID_")
    assert {cbid: ids[cbid] for cbid in apis.DRIVER_APIS} == apis.DRIVER_APIS


def test_every_probed_launch_copy_and_graph_symbol_of_cuda_has_its_id():
    named = set(apis.RUNTIME_APIS.values()) | set(apis.DRIVER_APIS.values())
    probed = {s for c in BY_NAME.values() if c.api == "cuda" and c.category in apis.ACTIVITY_OF
              and c.library in ("cudart", "cuda") for s in c.symbols}
    assert probed == named


def test_a_record_fits_its_own_call_and_a_runtime_call_that_reached_the_driver_only():
    launch, launch_ptsz = (apis.RUNTIME_DOMAIN, 211), (apis.RUNTIME_DOMAIN, 214)
    driver_launch, driver_graph = (apis.DRIVER_DOMAIN, 307), (apis.DRIVER_DOMAIN, 514)
    cuda_launch, cu_launch = BY_NAME["cudaLaunchKernel"].id, BY_NAME["cuLaunchKernel"].id
    assert apis.may_be(launch, cuda_launch) and apis.may_be(launch_ptsz, cuda_launch)
    assert apis.may_be(launch, cu_launch) is False  # a runtime record is the runtime call's
    assert apis.may_be(driver_launch, cu_launch) and apis.may_be(driver_launch, cuda_launch)
    assert apis.may_be(driver_launch, BY_NAME["cudaMemcpy"].id) is False  # another category
    assert apis.may_be(driver_graph, BY_NAME["cudaGraphLaunch"].id)
    assert apis.may_be((apis.RUNTIME_DOMAIN, 49), cuda_launch) is None  # cudaMemset: not probed
    assert BY_NAME["cudaGraphLaunch"].category is Category.GRAPH
