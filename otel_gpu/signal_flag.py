"""A flag that signal handlers set. Python runs a handler in the main thread between two
bytecodes, possibly inside another handler or inside a call that holds a lock:
threading.Event.set takes the event's lock, so a second signal arriving while the first
handler held it (SIGINT twice, `timeout` passing one on) hung the collector for good,
and a SIGUSR1 during the loop's clear() the same. This flag is one attribute, no lock."""
from __future__ import annotations


class SignalFlag:
    """The part of threading.Event the collector's loop uses: set, is_set, clear."""

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set

    def clear(self) -> None:
        self._set = False
