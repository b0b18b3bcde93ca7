"""gpu tier: needs an NVIDIA GPU, its driver and PyTorch with CUDA. Skipped, with
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
    return None


def pytest_collection_modifyitems(config, items):
    mark_tier(items, "gpu", pytest.mark.gpu, gpu_missing_reason())


from tests.harness import mark_tier, receiver, start_collector  # noqa: E402,F401 (fixtures)
