"""The per-service bound on distinct routes: never more than the cap per service,
`{other}` included; past it, learned `{param}` templates, else `{other}`; every fold
counted."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_gpu.value_cap import MAX_SERVICES, OTHER, ValueCap
from otel_gpu.enrich.routes import RouteTemplater
from otel_gpu.ratelimit import Stats


def test_first_routes_keep_their_names_then_a_learned_template():
    stats = Stats()
    r = RouteTemplater(max_routes=10, stats=stats)  # 8 kept, 1 template, {other}
    words = [f"w{chr(97 + i)}x" for i in range(20)]  # no digit-only or hex segment: no rule applies
    out = [r.route(f"/search/{w}", "svc") for w in words]
    assert out[:8] == [f"/search/{w}" for w in words[:8]]
    assert out[8:] == ["/search/{param}"] * 12
    assert stats.snapshot()["routes_folded"] == 12
    # earlier routes keep their own name
    assert r.route("/search/wax", "svc") == "/search/wax"


def test_template_keeps_the_fixed_segments():
    r = RouteTemplater(max_routes=10)
    for i in range(8):
        r.route(f"/keep{chr(97 + i)}", "s")
    assert r.route("/files/alpha/meta", "s") == OTHER  # no sibling of this shape yet
    assert r.route("/files/beta/meta", "s") == "/files/{param}/meta"
    assert r.route("/files/gamma/meta", "s") == "/files/{param}/meta"


def test_no_room_for_templates_means_other():
    r = RouteTemplater(max_routes=5)  # 4 kept, no template, {other}
    out = {r.route(f"/a/x{chr(97 + i)}", "s") for i in range(30)}
    assert len(out) == 5 and OTHER in out


def test_each_service_has_its_own_cap():
    r = RouteTemplater(max_routes=3)
    assert r.route("/a", "one") == "/a" and r.route("/b", "one") == "/b"
    assert r.route("/c", "one") == OTHER
    assert r.route("/c", "two") == "/c"


def test_explicit_patterns_are_never_folded():
    r = RouteTemplater(patterns=["/v1/models/{model}/infer"], max_routes=2)
    r.route("/a", "s")
    r.route("/b", "s")
    assert r.route("/v1/models/m/infer", "s") == "/v1/models/{model}/infer"


def test_services_past_the_limit_get_other_and_are_counted():
    stats = Stats()
    cap = ValueCap(10, stats)
    for i in range(MAX_SERVICES):
        assert cap.bound(f"s{i}", "/a") == "/a"
    assert cap.bound("late", "/a") == OTHER
    assert cap.services() == MAX_SERVICES and stats.snapshot()["routes_folded"] == 1


def test_cap_must_be_positive():
    with pytest.raises(ValueError):
        ValueCap(0)


segment = st.one_of(st.text(alphabet="abcxyz-_.", min_size=1, max_size=8), st.integers(0, 99).map(str),
                    st.text(max_size=6))
paths = st.lists(segment, min_size=1, max_size=5).map(lambda s: "/" + "/".join(s))


@settings(max_examples=300, deadline=None, database=None)
@given(cap=st.integers(1, 40), requests=st.lists(st.tuples(st.sampled_from("abc"), paths), max_size=300))
def test_distinct_routes_never_exceed_the_cap_per_service(cap, requests):
    stats = Stats()
    r = RouteTemplater(max_routes=cap, stats=stats)
    seen: dict[str, set] = {}
    kept_as_is = 0
    for service, path in requests:
        route = r.route(path, service)
        seen.setdefault(service, set()).add(route)
        kept_as_is += route == r.template(path)
        assert route == r.template(path) or route == OTHER or "{param}" in route
    for routes in seen.values():
        assert len(routes) <= cap
    # every request whose route changed was counted as a fold
    assert stats.snapshot().get("routes_folded", 0) == len(requests) - kept_as_is
