"""The bucket boundaries of http.server.request.duration (seconds): the OpenTelemetry HTTP
semantic conventions' advisory ones, which the metric is created with
(export/metrics.py), and which bpf/http_requests.c counts the requests it summarises by
(struct req_summary). Recorded at its kernel bucket's mean duration, a summarised request
lands in the histogram bucket its own duration would have, and the sum is exact."""
from __future__ import annotations

HTTP_DURATION_BOUNDS_S = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
BOUNDS_NS = tuple(round(b * 1e9) for b in HTTP_DURATION_BOUNDS_S)


def cflags() -> list[str]:
    """Bucket i holds durations in (BOUNDS_NS[i-1], BOUNDS_NS[i]]; the last is unbounded."""
    return [f"-DSUMMARY_BOUNDS={len(BOUNDS_NS)}",
            "-DSUMMARY_BOUND_LIST=" + "".join(f"X({b}ull)" for b in BOUNDS_NS)]
