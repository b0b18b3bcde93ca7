"""A bound on the distinct values of a label per service (http.route, a feature
header's values), so that paths a client chooses cannot grow spans, the store and
metrics without end.

At most `max_values` distinct values per service, OTHER included: the first
`max_values - max_values // 10 - 1` distinct values keep their own name; past them a
value folds into a template learned from the path shapes seen (one varying segment
becomes PARAM: /search/cat, /search/dog -> /search/{param}) while there is room for
templates (max_values // 10), else into OTHER. Every fold is counted in `stats`."""
from __future__ import annotations

from typing import Optional

from .ratelimit import Stats

OTHER = "{other}"
PARAM = "{param}"
MAX_SERVICES = 256       # distinct services tracked; values of later ones are OTHER
MAX_LEARNED_SEGMENTS = 8  # only the last segments of a path may vary in a template
MAX_LEARNED_LENGTH = 256  # longer values never teach a shape (bounds what is kept)


class _Service:
    __slots__ = ("kept", "templates", "shapes")

    def __init__(self) -> None:
        self.kept: set[str] = set()
        self.templates: set[str] = set()
        self.shapes: dict[str, int] = {}  # template -> values seen of that shape


class ValueCap:
    def __init__(self, max_values: int = 100, stats: Optional[Stats] = None,
                 counter: str = "routes_folded") -> None:
        if max_values < 1:
            raise ValueError(f"max_values must be >= 1, got {max_values}")
        self.max_values = max_values
        self.template_room = max_values // 10
        self.kept_room = max_values - self.template_room - 1
        self.max_shapes = 4 * max_values  # per service: the learning memory is bounded too
        self.stats = stats or Stats()
        self.counter = counter
        self._services: dict[str, _Service] = {}

    def bound(self, service: str, value: str) -> str:
        s = self._services.get(service)
        if s is None:
            if len(self._services) >= MAX_SERVICES:
                return self._fold(None, value)
            s = self._services[service] = _Service()
        if value in s.kept or value in s.templates or value == OTHER:
            return value
        if len(s.kept) < self.kept_room:
            s.kept.add(value)
            self._learn(s, _shapes(value))
            return value
        return self._fold(s, value)

    def _fold(self, s: Optional[_Service], value: str) -> str:
        self.stats.add(self.counter)
        if s is None:
            return OTHER
        shapes = _shapes(value)
        for t in shapes:  # last segment first: ids usually end a path
            if t in s.templates:
                return t
        seen = max(shapes, key=lambda t: s.shapes.get(t, 0), default=None)
        self._learn(s, shapes)
        if seen is not None and s.shapes.get(seen, 0) >= 2 and len(s.templates) < self.template_room:
            s.templates.add(seen)  # another value had this shape: a learned template
            return seen
        return OTHER

    def _learn(self, s: _Service, shapes: list[str]) -> None:
        for t in shapes:
            if t in s.shapes:
                s.shapes[t] += 1
            elif len(s.shapes) < self.max_shapes:
                s.shapes[t] = 1

    def services(self) -> int:
        return len(self._services)


def _shapes(value: str) -> list[str]:
    """The templates a path could belong to: each of its last literal segments as PARAM."""
    if not value.startswith("/") or len(value) > MAX_LEARNED_LENGTH:
        return []
    segs = value.split("/")
    out = []
    for i in range(len(segs) - 1, max(0, len(segs) - 1 - MAX_LEARNED_SEGMENTS), -1):
        seg = segs[i]
        if seg and not (seg.startswith("{") and seg.endswith("}")):
            out.append("/".join(segs[:i] + [PARAM] + segs[i + 1:]))
    return out
