"""gpu tier: needs an NVIDIA GPU, its driver, PyTorch with CUDA and bcc (a bare GPU
machine gets bcc from `make gpu-bundle` through scripts/gpu-tier.sh). Skipped, with
the reason printed (pytest -rs), everywhere else."""
from __future__ import annotations

import glob
import shutil

import pytest


def gpu_missing_reason() -> str | None:
    if not glob.glob("/dev/nvidia[0-9]*") or shutil.which("nvidia-smi") is None:
        return "no NVIDIA GPU on this machine (no /dev/nvidiaN or nvidia-smi)"
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if not torch.cuda.is_available():
        return "PyTorch cannot use the GPU (torch.cuda.is_available() is False)"
    try:
        import bcc  # noqa: F401
    except ImportError:
        return "bcc cannot be imported: on a bare GPU machine run scripts/gpu-tier.sh (README, Tests)"
    return None


def pytest_collection_modifyitems(config, items):
    mark_tier(items, "gpu", pytest.mark.gpu, gpu_missing_reason())


from tests.harness import mark_tier, receiver, start_collector  # noqa: E402,F401 (fixtures)
