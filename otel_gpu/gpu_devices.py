"""Which physical GPU a process's device ordinal names: `gpu.device.uuid` and
`gpu.device.model`, for CUDA ordinals from the NVIDIA driver, for HIP ordinals from the
amdgpu driver. Only what is certain: a uuid where the ordinal names one GPU; a model
where every GPU it may name has that model (eight H100s).

NVIDIA: the driver's procfs (/proc/driver/nvidia/gpus/<pci>/information: "Model:",
"GPU UUID:", "Bus Location:") and the process's own CUDA_VISIBLE_DEVICES and
CUDA_DEVICE_ORDER (its /proc/<pid>/environ). CUDA numbers the visible devices
fastest-first by default, in PCI bus order with CUDA_DEVICE_ORDER=PCI_BUS_ID;
CUDA_VISIBLE_DEVICES (indices into that order, or GPU UUIDs, or a mix; the list ends at
its first invalid entry) picks and reorders them. A uuid is given only with one GPU on
the host, PCI_BUS_ID order, or CUDA_VISIBLE_DEVICES by UUID: fastest-first has no
documented order among GPUs.

AMD GPUs: amd_gpus.py."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Optional

from . import proc
from .amd_gpus import HIP_ENV_KEYS, SYSFS_ROOT, AmdGpu, hip_candidates, read_amd_gpus
from .cuda_calls import API_CUDA, API_HIP

log = logging.getLogger(__name__)

DRIVER_ROOT = "/proc/driver/nvidia"
ENV_KEYS = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


@dataclass(frozen=True)
class Gpu:
    bus: str                     # "0000:3b:00.0", lower case (the directory name if the file has none)
    model: Optional[str] = None
    uuid: Optional[str] = None   # "GPU-..."


@dataclass(frozen=True)
class Identity:
    """What the collector can say about one ordinal of one process: each field None
    when it is not certain."""
    uuid: Optional[str] = None
    model: Optional[str] = None


NONE = Identity()


def read_gpus(driver_root: str = DRIVER_ROOT) -> list[Gpu]:
    """The GPUs the driver lists, in PCI bus order; [] without an NVIDIA driver."""
    base = os.path.join(driver_root, "gpus")
    try:
        names = os.listdir(base)
    except OSError:
        return []
    gpus = []
    for name in names:
        fields = {}
        try:
            with open(os.path.join(base, name, "information"), errors="replace") as f:
                for line in f:
                    key, sep, value = line.partition(":")
                    if sep:
                        fields[key.strip()] = value.strip()
        except OSError:
            continue
        gpus.append(Gpu((fields.get("Bus Location") or name).lower(), fields.get("Model") or None,
                        fields.get("GPU UUID") or None))
    return sorted(gpus, key=lambda g: g.bus)


def gpu_model(driver_root: str = DRIVER_ROOT, sysfs_root: str = SYSFS_ROOT) -> Optional[str]:
    """The first GPU's model, when there is one (--gpu-price by model): the NVIDIA
    driver's first, else the first AMD GPU's."""
    return (next((g.model for g in read_gpus(driver_root) if g.model), None)
            or next((g.model for g in read_amd_gpus(sysfs_root) if g.model), None))


def visible(gpus: list[Gpu], env: dict) -> list[list[Gpu]]:
    """Per ordinal the process can use, the GPUs it may be (one: certain)."""
    pci_order = env.get("CUDA_DEVICE_ORDER", "").strip().upper() == "PCI_BUS_ID"
    spec = env.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        if pci_order or len(gpus) == 1:
            return [[g] for g in gpus]
        return [list(gpus) for _ in gpus]
    out = []
    for entry in (e.strip() for e in spec.split(",")):
        if entry.isdigit():
            i = int(entry)
            if i >= len(gpus):
                break  # CUDA stops at the first invalid entry
            out.append([gpus[i]] if pci_order or len(gpus) == 1 else list(gpus))
        elif entry.upper().startswith("GPU-"):
            hits = [g for g in gpus if g.uuid and g.uuid.lower().startswith(entry.lower())]
            if len(hits) != 1:
                break  # unknown or ambiguous prefix: CUDA stops here too
            out.append(hits)
        else:
            break  # MIG-... or a name we do not read: say nothing past here
    return out


def identify(candidates: list) -> Identity:
    """The uuid of the one GPU it may be; the model the GPUs it may be all have."""
    if len(candidates) == 1:
        return Identity(candidates[0].uuid, candidates[0].model)
    models = {g.model for g in candidates}
    return Identity(None, models.pop() if len(models) == 1 else None)


class DeviceIdentities:
    """(pid, ordinal, api) -> Identity, per process and API from its initial environment
    (read once, forgotten when it exits). The drivers' lists are read once: GPUs do not
    come and go under a running collector."""

    def __init__(self, stats, proc_root: str = "/proc", driver_root: str = DRIVER_ROOT,
                 sysfs_root: str = SYSFS_ROOT) -> None:
        self.stats = stats
        self.proc_root = proc_root
        self.gpus = read_gpus(driver_root)
        self.amd_gpus = read_amd_gpus(sysfs_root)
        self._by_pid: dict[int, dict[str, list[Identity]]] = {}

    def __call__(self, pid: int, ordinal: Optional[int], api: str = API_CUDA) -> Identity:
        if ordinal is None or not (self.amd_gpus if api == API_HIP else self.gpus):
            return NONE
        per_api = self._by_pid.setdefault(pid, {})
        per_ordinal = per_api.get(api)
        if per_ordinal is None:
            per_ordinal = per_api[api] = self._read_hip(pid) if api == API_HIP else self._read(pid)
        return per_ordinal[ordinal] if 0 <= ordinal < len(per_ordinal) else NONE

    def _unreadable(self, pid: int, gpus: list) -> list[Identity]:
        """Any ordinal may be any GPU: the model only, when they all have one."""
        self.stats.add("device_env_unreadable")
        log.debug("pid %d: environ unreadable: its GPU ordinals get no uuid", pid)
        return [Identity(None, identify(gpus).model)] * len(gpus)

    def _read(self, pid: int) -> list[Identity]:
        env = proc.environ(self.proc_root, pid, ENV_KEYS)
        if env is None:  # gone, or not ours to read: any ordinal may be any GPU
            return self._unreadable(pid, self.gpus)
        return [identify(c) for c in visible(self.gpus, env)]

    def _read_hip(self, pid: int) -> list[Identity]:
        env = proc.environ(self.proc_root, pid, HIP_ENV_KEYS)
        if env is None:
            return self._unreadable(pid, self.amd_gpus)
        seen = self._seen_by(pid)
        if seen is None:
            self.stats.add("device_dri_unreadable")
            log.debug("pid %d: GPUs it can open not known: its HIP ordinals get no uuid", pid)
            anyone = Identity(None, identify(self.amd_gpus).model)
            return [anyone] * len(self.amd_gpus)
        return [identify(c) for c in hip_candidates(seen, env)]

    def _seen_by(self, pid: int) -> Optional[list[AmdGpu]]:
        """The GPU nodes whose render node the process's /dev shows (those its ROCm can
        open), in node order; None when that is not known."""
        if any(g.render_minor is None for g in self.amd_gpus):
            return None
        try:
            names = set(os.listdir(proc.path(self.proc_root, pid, os.path.join("root", "dev", "dri"))))
        except FileNotFoundError:  # no /dev/dri in its root: no GPU given to it, or it is gone
            if not os.path.isdir(proc.path(self.proc_root, pid, os.path.join("root", "dev"))):
                return None
            names = set()
        except OSError:
            return None
        return [g for g in self.amd_gpus if f"renderD{g.render_minor}" in names]

    def forget(self, pid: int) -> None:
        self._by_pid.pop(pid, None)

    def __len__(self) -> int:
        return len(self._by_pid)
