"""Which CUPTI API a device record's launching call was, and which of our probed calls that
can be: the tie the device-clock records need (pipeline/device_times.py).

The library tags a record with the CUPTI callback domain and id of its launching call. Those
ids are CUPTI's ABI (cupti_runtime_cbid.h, cupti_driver_cbid.h: enums that only grow); the
numbers below are checked against the headers by tests/unit/device_clock/test_apis.py. Each is
named as CUPTI names it, less the runtime's _v<version> suffix, which is the exported symbol
our probes attach to (cuda_calls.py): the id says which of our calls it was."""
from __future__ import annotations

from typing import Optional

from ..cuda_calls import BY_ID, CALLS, Category
from ..records import DEVICE_KERNEL, DEVICE_MEMCPY

DRIVER_DOMAIN, RUNTIME_DOMAIN = 1, 2  # CUpti_CallbackDomain

# callback id -> the symbol, for the runtime and driver calls whose GPU work CUPTI records.
RUNTIME_APIS = {
    211: "cudaLaunchKernel", 214: "cudaLaunchKernel_ptsz",
    430: "cudaLaunchKernelExC", 431: "cudaLaunchKernelExC_ptsz",
    31: "cudaMemcpy", 215: "cudaMemcpy_ptds", 41: "cudaMemcpyAsync", 225: "cudaMemcpyAsync_ptsz",
    44: "cudaMemcpy2DAsync", 228: "cudaMemcpy2DAsync_ptsz",
    311: "cudaGraphLaunch", 312: "cudaGraphLaunch_ptsz",
}
DRIVER_APIS = {
    307: "cuLaunchKernel", 442: "cuLaunchKernel_ptsz", 652: "cuLaunchKernelEx", 653: "cuLaunchKernelEx_ptsz",
    514: "cuGraphLaunch", 515: "cuGraphLaunch_ptsz",
}

_CALL_OF_SYMBOL = {symbol: c for c in CALLS for symbol in c.symbols}


def _calls(apis: dict, domain: int) -> dict:
    return {(domain, cbid): _CALL_OF_SYMBOL[symbol] for cbid, symbol in apis.items()}


API_CALLS = {**_calls(RUNTIME_APIS, RUNTIME_DOMAIN), **_calls(DRIVER_APIS, DRIVER_DOMAIN)}


def may_be(api: tuple, call: int) -> Optional[bool]:
    """Whether a record whose launching call was CUPTI's `api` (domain, callback id) can be
    the work of our call `call`: that very call, or, for a driver API, a runtime call of the
    same category that reached the driver (the runtime's own entry is the one probed; the
    driver's inside it is not streamed twice). None: `api` is none we probe."""
    spec = API_CALLS.get(api)
    if spec is None:
        return None
    if spec.id == call:
        return True
    if api[0] != DRIVER_DOMAIN:
        return False
    mine = BY_ID.get(call)
    return mine is not None and mine.category is spec.category and mine.library != spec.library


# What kind of device activity each category launches: the calls a device record can time.
ACTIVITY_OF = {Category.LAUNCH: DEVICE_KERNEL, Category.GRAPH: DEVICE_KERNEL, Category.MEMCPY: DEVICE_MEMCPY}
