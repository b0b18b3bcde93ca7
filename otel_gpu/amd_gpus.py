"""The AMD GPUs the amdgpu driver exposes, and which of them a process's HIP ordinals
may name (gpu_devices.py turns that into an Identity).

The KFD topology under the sysfs root, class/kfd/kfd/topology/nodes/<n>/: `gpu_id`
(0 on a CPU node), `properties` ("key value" lines: `drm_render_minor`, `unique_id`,
`gfx_target_version`) and `name`. The uuid is ROCm's, "GPU-" and unique_id in 16
lowercase hex digits; none where the kernel gives no unique_id, or 0. The model is the
board's `product_name` (class/drm/renderD<minor>/device/, from the FRU EEPROM of server
boards: MI300X), else the node's name (the ASIC, "aldebaran"), else, for the
"ip discovery" every newer ASIC is named, its gfx target ("gfx942").
HIP numbers the GPU nodes the process's ROCm can open, in node order: those whose
/dev/dri/renderD<minor> the process's own root shows (a container is given its GPUs'
render nodes; a device cgroup denying a node its /dev still shows is not seen here).
ROCR_VISIBLE_DEVICES, when set, picks and orders them (indices or "GPU-" uuid prefixes;
it ends at an invalid, ambiguous or repeated entry); then HIP_VISIBLE_DEVICES, or when
that is empty CUDA_VISIBLE_DEVICES, by index (it ends at an invalid entry and skips a
repeat). A uuid is given where that is certain: the process's environment and /dev and
every GPU node readable, and one gfx target among the GPUs ROCR_VISIBLE_DEVICES leaves
(ROCm leaves out a GPU whose ISA it does not support, moving the ordinals after it).
Nothing is said from a "GPU-" entry of HIP_VISIBLE_DEVICES on: HIP reads it as a uuid
since ROCm 6.2 and as the list's end before."""
# Verified in the sources (kernel and ROCm 6.2, October 2024): amdkfd/kfd_topology.c
# (the properties keys, "%s %llu"; unique_id on GPU nodes only; name = the lower-cased
# amdgpu_asic_name, "IP DISCOVERY" for IP-discovery ASICs; a node unreadable (EPERM) to a
# reader whose device cgroup denies its GPU), amdgpu_fru_eeprom.c (product_name on the
# PCI device, server boards only); ROCt's libhsakmt topology.c (nodes in number order, a
# GPU node skipped when its gpu_id is unreadable or /dev/dri/renderD<minor> fails with
# ENOENT or EPERM); ROCr's amd_topology.cpp, amd_filter_device.cpp (ROCR_VISIBLE_DEVICES:
# strtol base 0 indices, uuid prefixes against "GPU-%016llX", unique; ends at an invalid,
# unmatched, ambiguous or repeated entry; GPUs of an ISA it does not know dropped after)
# and amd_gpu_agent.cpp (uuid "GPU-%016llx"); CLR's rocdevice.cpp (HIP_VISIBLE_DEVICES,
# else CUDA_VISIBLE_DEVICES: indices equal to their decimal form, repeats skipped, ends at
# an invalid entry; uuids since ROCm 6.2; a device of an unsupported ISA left out).
from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import Optional

log = logging.getLogger(__name__)

SYSFS_ROOT = "/sys"
KFD_NODES = os.path.join("class", "kfd", "kfd", "topology", "nodes")  # under the sysfs root
HIP_ENV_KEYS = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
IP_DISCOVERY = "ip discovery"  # the KFD name of every IP-discovery ASIC: no model


@dataclass(frozen=True)
class AmdGpu:
    """A GPU node of the KFD topology. render_minor None: the node could not be read
    (so which GPUs a process sees is not known)."""
    node: int                        # its KFD topology node number
    render_minor: Optional[int] = None
    model: Optional[str] = None
    uuid: Optional[str] = None       # "GPU-" + 16 lowercase hex digits, as ROCm shows it
    gfx: Optional[int] = None        # gfx_target_version: 90402 for gfx942


def _text(path: str) -> Optional[str]:
    """A sysfs file's first line, stripped; None when absent, unreadable or empty."""
    try:
        with open(path, errors="replace") as f:
            return f.readline().strip() or None
    except OSError:
        return None


def _properties(path: str) -> Optional[dict[str, int]]:
    """A KFD properties file: "key value" lines, the values unsigned integers."""
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    out = {}
    for line in lines:
        key, _, value = line.strip().partition(" ")
        if value.strip().isdigit():
            out[key] = int(value)
    return out


def gfx_name(version: int) -> str:
    """gfx_target_version (major*10000 + minor*100 + stepping) as ROCm names the ISA:
    minor and stepping in hex (90010: gfx90a)."""
    return f"gfx{version // 10000 % 100}{version // 100 % 100:x}{version % 100:x}"


def read_amd_gpus(sysfs_root: str = SYSFS_ROOT) -> list[AmdGpu]:
    """The GPU nodes of the KFD topology, in node order (CPU nodes left out); [] without
    the amdgpu driver's KFD."""
    base = os.path.join(sysfs_root, KFD_NODES)
    try:
        nodes = sorted(int(n) for n in os.listdir(base) if n.isdigit())
    except OSError:
        return []
    gpus = []
    for n in nodes:
        d = os.path.join(base, str(n))
        gpu_id = _text(os.path.join(d, "gpu_id"))
        if gpu_id == "0":
            continue  # a CPU node
        props = _properties(os.path.join(d, "properties")) if gpu_id is not None else None
        if props is None or not props.get("drm_render_minor"):
            # Denied to us (EPERM: our device cgroup) or not a node ROCm could use: a GPU we
            # cannot place, so which of them a process sees is not known.
            log.debug("KFD node %d unreadable: HIP ordinals get no uuid", n)
            gpus.append(AmdGpu(n))
            continue
        minor = props["drm_render_minor"]
        unique_id = props.get("unique_id") or 0
        gfx = props.get("gfx_target_version") or None
        product = _text(os.path.join(sysfs_root, "class", "drm", f"renderD{minor}", "device", "product_name"))
        name = _text(os.path.join(d, "name"))
        model = product or (name if name and name.lower() != IP_DISCOVERY else None) or (gfx and gfx_name(gfx))
        gpus.append(AmdGpu(n, minor, model or None, f"GPU-{unique_id:016x}" if unique_id else None, gfx))
    return gpus


_C_INT = re.compile(r"([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)")


def _strtol0(token: str) -> Optional[int]:
    """The token as C's strtol(token, &end, 0) reads it (decimal, 0x hex, 0 octal); None
    where it would not read the whole token."""
    m = _C_INT.fullmatch(token)
    if not m:
        return None
    digits = m.group(2)
    base = 16 if digits[:2] in ("0x", "0X") else 8 if digits.startswith("0") else 10
    return int(digits, base) * (-1 if m.group(1) == "-" else 1)


def rocr_visible(gpus: list[AmdGpu], spec: str) -> list[AmdGpu]:
    """ROCR_VISIBLE_DEVICES applied to the GPU nodes the process's ROCm sees, as ROCr
    applies it: each entry an index or a "GPU-" uuid prefix (case ignored, 5 to 20
    characters, matching one GPU); the list ends at the first entry that is neither, or
    names a GPU again. Set but empty: no GPU."""
    uuids = [g.uuid.upper() if g.uuid else None for g in gpus]
    tokens = [t.strip().upper() for t in spec.split(",")] if spec else []
    picked: list[int] = []
    for token in tokens[:len(gpus)]:  # ROCr reads no more entries than there are GPUs
        if token.startswith("G"):
            hits = [i for i, u in enumerate(uuids) if u and 5 <= len(token) <= 20 and u.startswith(token)]
            i = hits[0] if len(hits) == 1 else None
        else:
            i = _strtol0(token)
        if i is None or not 0 <= i < len(gpus) or i in picked:
            break
        picked.append(i)
    return [gpus[i] for i in picked]


def hip_visible(agents: list[AmdGpu], spec: str) -> list[AmdGpu]:
    """HIP_VISIBLE_DEVICES (or CUDA_VISIBLE_DEVICES) applied to ROCr's GPUs, as HIP
    applies it: canonical decimal indices, a repeat skipped; the list ends at an invalid
    entry. It ends here at a "GPU-" entry too: HIP reads one as a uuid since ROCm 6.2,
    as the list's end before, and which HIP the process runs is not known."""
    picked: list[int] = []
    for entry in spec.split(","):
        if "GPU-" in entry or not re.fullmatch(r"0|[1-9][0-9]*", entry) or int(entry) >= len(agents):
            break
        if int(entry) not in picked:
            picked.append(int(entry))
    return [agents[i] for i in picked]


def hip_candidates(gpus: list[AmdGpu], env: dict) -> list[list[AmdGpu]]:
    """Per HIP ordinal the process can use, the GPUs it may be (one: certain). `gpus`:
    the GPU nodes its ROCm sees, in node order."""
    agents = rocr_visible(gpus, env["ROCR_VISIBLE_DEVICES"]) if "ROCR_VISIBLE_DEVICES" in env else list(gpus)
    targets = {g.gfx for g in agents}
    if len(agents) > 1 and (len(targets) > 1 or None in targets):
        # ROCm leaves out a GPU whose ISA it does not support, moving the ordinals after
        # it: with more than one ISA, any ordinal may be any of these GPUs.
        return [list(agents) for _ in agents]
    spec = env.get("HIP_VISIBLE_DEVICES") or env.get("CUDA_VISIBLE_DEVICES") or ""
    return [[g] for g in (hip_visible(agents, spec) if spec else agents)]
