"""The requests the kernel summarised (bpf/http_requests.c summarise): HTTP/1 requests of
which a record was lost because the ring buffer was full. User space then drops what
it had of them (pipeline/connections.py), and counts them from here: per process, by
duration bucket (probes/summary_buckets.py), as RequestSummary records for the request metric."""
from __future__ import annotations

from ..records import RequestSummary


class SummaryReader:
    """RequestSummary records: what req_summaries counted since the last read (its
    counts only grow: the kernel's adds and this read never race)."""

    def __init__(self, table) -> None:
        self.table = table
        self._last: dict[int, tuple] = {}  # tgid -> (counts, sums) as last read

    def read(self) -> list[RequestSummary]:
        out = []
        for k, v in self.table.items():
            now = (tuple(v.count), tuple(v.sum_ns))
            prev = self._last.get(k.value)
            counts, sums = now if prev is None else ([a - b for a, b in zip(now[0], prev[0])],
                                                     [a - b for a, b in zip(now[1], prev[1])])
            if any(counts):
                out.append(RequestSummary(k.value, list(zip(counts, sums))))
                self._last[k.value] = now
        return out

    def forget(self, tgids) -> None:
        """With the process's entry (program.forget deletes it)."""
        for tgid in tgids:
            self._last.pop(tgid, None)
