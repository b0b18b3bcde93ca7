"""The flag file that turns device-clock mode on in every service that loaded the library
(cupti/otel_gpu_cupti.c checks it once a second): raised once the collector's probes are
attached, lowered as it stops, so no service pays for CUPTI while no collector reads the
records. Its path is OTEL_GPU_DEVICE_CLOCK_FLAG for both sides (in Kubernetes, a hostPath
both mount: docs/kubernetes.md)."""
from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


def raise_flag(path: str) -> bool:
    """Creates the flag file (and its directory); False, with one log line, if it cannot."""
    try:
        Path(path).parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        os.close(fd)
        return True
    except OSError as e:
        log.warning("cannot create the device-clock flag %s (%s): services with the device-clock library "
                    "keep it off, and their GPU times stay host-side", path, e.strerror or e)
        return False


def lower_flag(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("cannot remove the device-clock flag %s (%s): services with the device-clock library "
                    "keep reporting to a collector that stopped", path, e.strerror or e)
