"""Calls that must end by a deadline whatever a backend does (an endpoint that accepts
TCP and never answers): the call runs in a daemon thread and is waited for until the
deadline, then left behind. A daemon thread does not hold the process's exit."""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)


def remaining_ms(deadline: float) -> float:
    """Milliseconds left until `deadline` (a time.monotonic() value), never negative."""
    return max(0.0, (deadline - time.monotonic()) * 1000)


def start(fn: Callable[[], object], what: str) -> threading.Event:
    """fn() in a daemon thread; the event is set when it returned (or raised, logged)."""
    done = threading.Event()

    def run() -> None:
        try:
            fn()
        except Exception as e:  # a shutdown that fails must not stop the others
            log.warning("%s failed: %s", what, e)
        finally:
            done.set()
    threading.Thread(target=run, name=f"otel-gpu {what}", daemon=True).start()
    return done


def wait_by(deadline: float, started: list[threading.Event]) -> list[bool]:
    """For each started call, True when it ended before `deadline` (time.monotonic())."""
    return [done.wait(remaining_ms(deadline) / 1000) for done in started]


def call_by(deadline: float, fn: Callable[[], object], what: str) -> bool:
    return wait_by(deadline, [start(fn, what)])[0]
