"""The duration buckets bpf/http_probes.c summarises requests in (struct req_summary):
the union of the OpenTelemetry HTTP semantic conventions' advisory boundaries and the
SDK's default ones (seconds). Every histogram bucket of the request metric is then a
union of kernel buckets: recorded at its kernel bucket's mean duration, a summarised
request lands in the histogram bucket its own duration would have, and the sum is exact."""
from __future__ import annotations

SEMCONV_BOUNDS_S = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
SDK_DEFAULT_BOUNDS_S = (0.0, 5.0, 10.0, 25.0, 50.0, 75.0, 100.0, 250.0, 500.0, 750.0, 1000.0, 2500.0, 5000.0,
                        7500.0, 10000.0)
BOUNDS_S = tuple(sorted((set(SEMCONV_BOUNDS_S) | set(SDK_DEFAULT_BOUNDS_S)) - {0.0}))  # a duration is > 0
BOUNDS_NS = tuple(round(b * 1e9) for b in BOUNDS_S)


def cflags() -> list[str]:
    """Bucket i holds durations in (BOUNDS_NS[i-1], BOUNDS_NS[i]]; the last is unbounded."""
    return [f"-DSUMMARY_BOUNDS={len(BOUNDS_NS)}",
            "-DSUMMARY_BOUND_LIST=" + "".join(f"X({b}ull)" for b in BOUNDS_NS)]
