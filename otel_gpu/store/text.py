"""Fitting text columns into a terminal width (report and traces share these)."""
from __future__ import annotations


def fit(text: str, width: int) -> str:
    """Middle ellipsis: both ends of a route say the most."""
    if len(text) <= width:
        return text.ljust(width)
    head = (width - 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]


def split_width(total: int, first: list[str], second: list[str], first_min: int = 7) -> tuple[int, int]:
    """Widths of two text columns sharing `total` (gap included): each gets what it
    needs when both fit, else the first gets at most a third."""
    need1 = max([first_min, *map(len, first)])
    need2 = max([first_min, *map(len, second)])
    w1 = need1 if need1 + 1 + need2 <= total else max(first_min, min(need1, total // 3))
    return w1, total - 1 - w1
