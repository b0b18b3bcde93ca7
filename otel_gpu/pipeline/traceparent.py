"""W3C traceparent parsing (version 00 and forward-compatible later versions)."""
from __future__ import annotations

import re
from typing import Optional

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


def parse_traceparent(value: Optional[str]) -> Optional[tuple[int, int]]:
    """(trace_id, parent span_id), or None when absent or invalid (a new trace starts)."""
    if not value:
        return None
    m = _TRACEPARENT.match(value.strip().lower())
    if not m or m.group(1) == "ff" or (m.group(1) == "00" and m.group(5)):
        return None
    trace_id, span_id = int(m.group(2), 16), int(m.group(3), 16)
    if trace_id == 0 or span_id == 0:
        return None
    return trace_id, span_id


def traceparent_sampled(value: Optional[str]) -> Optional[bool]:
    """The sampled flag of a valid traceparent (bit 0 of its flags), else None."""
    if parse_traceparent(value) is None:
        return None
    return bool(int(_TRACEPARENT.match(value.strip().lower()).group(4), 16) & 1)
