"""The kernel's counters (bpf/events.h `counters`, per CPU) read and taken into the
collector's stats: what the kernel lost or left out (each with a warning as it grows) and
what it tallied (how calls and heads left it). Read at every flush (kernel_io/program.py)."""
from __future__ import annotations

import ctypes as ct
import logging

from ..ratelimit import Stats
from .abi import COUNTER_NAMES

log = logging.getLogger(__name__)

# Kernel counters (bpf/events.h) of what was lost or left out -> (stat, warning with the total).
_LOSSES = {
    "ringbuf_full": ("lost_events", "ring buffer full: %d events lost so far"),
    "agg_full": ("lost_events", "per-request count table full (AGG_ENTRIES): %d CUDA calls lost so far"),
    "rollup_full": ("lost_events", "count table of calls outside requests full (65536 process, call and kernel "
                    "keys): %d calls lost so far"),
    "thread_times_full": ("threads_untimed", "thread time table full (65536 threads of traced processes): %d "
                          "threads' requests get no time split so far"),
    "conn_table_full": ("connections_untracked", "connection table full (--max-connections): %d connections "
                        "of traced processes left untracked so far"),
    "scratch_busy": ("lost_events", "per-CPU scratch slots all held by preempted probes: %d TLS or kernel-name "
                     "records dropped so far"),
    "conn_over_share": ("connections_over_share", "related HTTP servers past their share of --max-connections: "
                        "%d connections left untracked so far"),
}
# Kernel counters (bpf/events.h) -> stats: connections whose TLS ciphertext was not sent
# (tied to an SSL* or not: a stack without probes gives no span), and SSL plaintext
# dropped for want of a socket (client connections of the process, untied SSL*).
_TALLIES = {"tls_ciphertext": "tls_connections", "tls_untied": "tls_plaintext_untied",
            # how calls of processes with HTTP activity left the kernel: one by one, or counted
            "cuda_streamed": "cuda_calls_streamed", "aggregated": "cuda_calls_counted",
            # requests whose sampling the kernel decided as their head was read, or left to us
            "head_decided": "heads_sampled_in_kernel", "head_left": "heads_sampled_here",
            # driver launches a runtime launch made on its way: counted at the runtime's probe
            # (deduped), or at the driver's in the runtime's name (bpf/launch_routes.c)
            "driver_deduped": "driver_launches_deduped", "driver_as_runtime": "driver_launches_as_runtime",
            # switches of traced threads the sched program never saw, repaired (bpf/thread_times.c)
            "switch_unseen": "sched_switches_unseen"}
_COUNTED = {**_LOSSES, **{name: (stat, None) for name, stat in _TALLIES.items()}}


class KernelCounters:
    def __init__(self, table, stats: Stats) -> None:
        self.table, self.stats = table, stats
        self._seen: dict[str, int] = {}  # each counter's value when last taken in

    def total(self, name: str) -> int:
        """One counter's total over the CPUs."""
        return sum(self.table[ct.c_int(COUNTER_NAMES.index(name))])

    def read(self) -> dict[str, int]:
        """Each counter's total over the CPUs."""
        return {name: self.total(name) for name in COUNTER_NAMES}

    def account(self) -> None:
        """What each counter grew by since the last call, into its stat."""
        counters = self.read()
        for name, (stat, warning) in _COUNTED.items():
            grown = counters[name] - self._seen.get(name, 0)
            if grown > 0:
                if warning:  # a loss: logged as it grows
                    log.warning(warning, counters[name])
                self.stats.add(stat, grown)
                self._seen[name] = counters[name]
