"""http.route from a URL path: explicit patterns first, then per-segment rules that
turn ids into placeholders, so that /users/42 and /users/43 are one route; then a
per-service bound on distinct routes (route_cap.py) for paths no rule recognises
(/search/<any word>). Explicit patterns are configured, hence bounded: never capped."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from ..ratelimit import Stats
from ..value_cap import ValueCap

# (name, segment regex): first match wins. Applied to whole path segments.
DEFAULT_SEGMENT_RULES: tuple[tuple[str, str], ...] = (
    ("{id}", r"\d+"),
    ("{uuid}", r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"),
    # hex tokens: 8+ hex chars with at least one digit (keeps words like "deadbeef"-free names)
    ("{hex}", r"(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{8,}"),
    # long opaque tokens (base64/url-safe ids) of 20+ chars with a digit
    ("{token}", r"(?=[A-Za-z0-9_-]*\d)[A-Za-z0-9_-]{20,}"),
)


def _compile_pattern(pattern: str) -> re.Pattern:
    """'/models/{name}/infer' -> a regex where each {x} matches one segment."""
    parts = re.split(r"(\{[^/{}]+\})", pattern)
    regex = "".join("[^/]+" if p.startswith("{") and p.endswith("}") else re.escape(p) for p in parts)
    return re.compile(f"^{regex}/?$")


@dataclass
class RouteTemplater:
    patterns: list[str] = field(default_factory=list)  # explicit routes, e.g. /v1/models/{model}
    segment_rules: tuple[tuple[str, str], ...] = DEFAULT_SEGMENT_RULES
    max_routes: int = 100  # distinct routes per service (config: --max-routes)
    stats: Optional[Stats] = None  # counts folds as routes_folded

    def __post_init__(self) -> None:
        for p in self.patterns:
            if not p.startswith("/"):
                raise ValueError(f"route pattern must start with '/': {p!r}")
        self._patterns = [(p, _compile_pattern(p)) for p in self.patterns]
        self._rules = [(name, re.compile(f"^(?:{rx})$")) for name, rx in self.segment_rules]
        self._cache: dict[str, str] = {}
        self._explicit = frozenset(self.patterns)
        self.cap = ValueCap(self.max_routes, self.stats, "routes_folded")

    def route(self, path: str, service: str = "") -> str:
        """The bounded route of `path` for `service`."""
        route = self.template(path)
        return route if route in self._explicit else self.cap.bound(service, route)

    def template(self, path: str) -> str:
        """The route before the per-service bound."""
        cached = self._cache.get(path)
        if cached is not None:
            return cached
        result = self._route(path)
        if len(self._cache) < 10000:  # paths are unbounded: bound the cache
            self._cache[path] = result
        return result

    def _route(self, path: str) -> str:
        if not path.startswith("/"):
            return "/" if path in ("", "*") else "{other}"
        for pattern, rx in self._patterns:
            if rx.match(path):
                return pattern
        segments = path.split("/")
        for i, seg in enumerate(segments):
            for name, rx in self._rules:
                if seg and rx.match(seg):
                    segments[i] = name
                    break
        return "/".join(segments)
