"""Config.validate: one clear ConfigError naming the bad field."""
import pytest

from otel_gpu.config import Config, ConfigError, base_resource_attributes, env_list


def test_defaults_are_valid():
    c = Config().validate()
    assert c.trace_all and c.span_budget == 256 and c.export_query is False
    assert c.export_headers == frozenset()


@pytest.mark.parametrize("kwargs,field", [
    ({"span_budget": -1}, "span_budget"),
    ({"span_budget": 100_001}, "span_budget"),
    ({"pids": [10, 0]}, "pid"),
    ({"pids": [-5]}, "pid"),
    ({"ringbuf_pages": 0}, "ringbuf_pages"),
    ({"ringbuf_pages": 3}, "ringbuf_pages"),
    ({"ringbuf_pages": -2048}, "ringbuf_pages"),
    ({"route_patterns": ["/ok/{x}", "models/{m}"]}, "route"),
    ({"scan_interval_s": 0}, "interval"),
    ({"flush_interval_s": -1.0}, "interval"),
])
def test_invalid_values_name_the_field(kwargs, field):
    with pytest.raises(ConfigError) as e:
        Config(**kwargs).validate()
    assert e.value.field == field
    assert str(e.value).startswith(f"invalid configuration: {field}: ")
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize("kwargs", [{"span_budget": 0}, {"span_budget": 100_000}, {"ringbuf_pages": 1},
                                    {"ringbuf_pages": 4096}, {"pids": [1]},
                                    {"route_patterns": ["/v1/models/{m}"]}, {"scan_interval_s": 0.01}])
def test_boundary_values_accepted(kwargs):
    assert Config(**kwargs).validate() is not None


def test_trace_all_only_without_targets():
    assert not Config(pids=[5]).trace_all
    assert not Config(exes=["/usr/bin/python3"]).trace_all


def test_env_list(monkeypatch):
    monkeypatch.setenv("OTEL_GPU_X", " a, ,b ,c")
    assert env_list("OTEL_GPU_X") == ["a", "b", "c"]
    monkeypatch.delenv("OTEL_GPU_X")
    assert env_list("OTEL_GPU_X") == []


def test_base_resource_attributes():
    env = {"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod, team = ml ,"}
    assert base_resource_attributes(env) == {"deployment.environment": "prod", "team": "ml"}
    assert base_resource_attributes({}) == {}
    assert base_resource_attributes({"OTEL_RESOURCE_ATTRIBUTES": "a=b=c"}) == {"a": "b=c"}


@pytest.mark.parametrize("value", ["novalue", "a=1,junk", "=x"])
def test_bad_resource_attributes_name_the_variable(value):
    with pytest.raises(ConfigError) as e:
        base_resource_attributes({"OTEL_RESOURCE_ATTRIBUTES": value})
    assert e.value.field == "OTEL_RESOURCE_ATTRIBUTES"
