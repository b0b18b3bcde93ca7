"""User space's words of the kernel's `pid_bits` (bpf/maps.h): two bits per tgid that
let every syscall tracepoint and the launch probe tell an untraced process, or a
traced one with no HTTP activity, from inlined array reads instead of hash lookups.

User space owns TRACED (its `traced` entry was written by trace()/follow()) and SLOW
(it follows a server, so its calls may stream while it has no HTTP activity of its
own). The kernel keeps its own words for what it learns itself, so no word has two
writers. The order matters: SLOW is set before the `traced` value that needs it is
written, and cleared only after the value that does not."""
from __future__ import annotations

import ctypes as ct
import logging
import threading
from pathlib import Path

log = logging.getLogger(__name__)

TRACED, SLOW = 1, 2
PID_MAX_LIMIT = 4 * 1024 * 1024  # the kernel's ceiling on 64-bit
PIDS_PER_WORD = 32


def pid_words(pid_max_file: str = "/proc/sys/kernel/pid_max") -> int:
    """Words for the pids this host can have now (pid_max is global, also in a container).
    A pid_max raised later only makes the new pids take the kernel's full path."""
    try:
        pid_max = int(Path(pid_max_file).read_text().split()[0])
    except (OSError, ValueError, IndexError) as e:
        log.warning("cannot read %s (%s): sizing the pid bitmap for %d pids", pid_max_file, e, PID_MAX_LIMIT)
        pid_max = PID_MAX_LIMIT
    pid_max = min(max(pid_max, PIDS_PER_WORD), PID_MAX_LIMIT)
    return -(-pid_max // PIDS_PER_WORD)


class PidBits:
    def __init__(self, table, words: int) -> None:
        self.table, self.words = table, words
        self._lock = threading.Lock()  # read-modify-write of a word shared by 32 pids
        self.traced: set[int] = set()  # pids whose TRACED bit is set in user space's word

    def set(self, pid: int, flags: int) -> None:
        """pid's two bits (TRACED | SLOW, or 0) in user space's word."""
        if not 0 <= pid < self.words * PIDS_PER_WORD:
            return  # beyond the array: the kernel takes the full path for it
        key, shift = ct.c_uint32(pid // PIDS_PER_WORD), 2 * (pid % PIDS_PER_WORD)
        with self._lock:
            word = self.table[key].value
            self.table[key] = ct.c_uint64(word & ~(3 << shift) | flags << shift)
            if flags & TRACED:
                self.traced.add(pid)
            else:
                self.traced.discard(pid)
