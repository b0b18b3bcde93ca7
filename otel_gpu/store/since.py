"""--since: a duration back from now ("90s", "15m", "2h", "1d", "1w") or an ISO time."""
from __future__ import annotations

import re
import time
from datetime import datetime, timezone
from typing import Optional

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)


def parse_since(text: Optional[str], now_ns: Optional[int] = None) -> Optional[int]:
    """Epoch ns of the cutoff, or None for "everything kept". ValueError names the forms."""
    if text is None or not text.strip():
        return None
    now_ns = time.time_ns() if now_ns is None else now_ns
    m = _DURATION.match(text)
    if m:
        return now_ns - int(float(m.group(1)) * _UNITS[m.group(2).lower()] * 1e9)
    try:
        # fromisoformat (3.11) takes "2024-05-01", "2024-05-01T12:00", "...Z", "+02:00".
        t = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"--since {text!r}: use a duration such as 15m, 2h, 1d, or an ISO time "
                         "such as 2024-05-01T12:00:00Z") from None
    if t.tzinfo is None:
        t = t.astimezone()  # a time without a zone is local time, as a user typing it means
    return int(t.timestamp()) * 1_000_000_000 + t.microsecond * 1000


def iso_utc(ns: Optional[int]) -> Optional[str]:
    if ns is None:
        return None
    return datetime.fromtimestamp(ns / 1e9, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
