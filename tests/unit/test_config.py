"""Config.validate and load_config: flag, else environment, else default; one clear
ConfigError naming the bad field or variable."""
import argparse

import pytest

from otel_gpu.config import Config, ConfigError, env_list, resource_attributes
from otel_gpu.config_loader import add_run_arguments, load_config
from otel_gpu.store.paths import default_store_path

ENDPOINT = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}


def load(*argv: str, **env: str) -> Config:
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    return load_config(parser.parse_args(list(argv)), env)


def test_defaults_are_valid():
    c = Config().validate()
    assert c.trace_all and c.span_budget == 256 and c.export_query is False
    assert c.export_headers == frozenset()


@pytest.mark.parametrize("kwargs,field", [
    ({"span_budget": -1}, "span_budget"),
    ({"span_budget": 100_001}, "span_budget"),
    ({"stream_rate": -1}, "stream_rate"),
    ({"stream_rate": 10_000_001}, "stream_rate"),
    ({"pids": [10, 0]}, "pid"),
    ({"pids": [-5]}, "pid"),
    ({"ringbuf_pages": 0}, "ringbuf_pages"),
    ({"ringbuf_pages": 3}, "ringbuf_pages"),
    ({"ringbuf_pages": -2048}, "ringbuf_pages"),
    ({"max_connections": 15}, "max_connections"),
    ({"max_connections": (1 << 20) + 1}, "max_connections"),
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
                                    {"stream_rate": 0}, {"stream_rate": 10_000_000},
                                    {"ringbuf_pages": 4096}, {"pids": [1]}, {"max_connections": 16},
                                    {"max_connections": 1 << 20},
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


def test_resource_attributes():
    assert resource_attributes("deployment.environment=prod, team = ml ,") == {
        "deployment.environment": "prod", "team": "ml"}
    assert resource_attributes("") == {}
    assert resource_attributes("a=b=c") == {"a": "b=c"}
    assert resource_attributes("a=1,junk,=x", strict=False) == {"a": "1"}  # a traced process's


@pytest.mark.parametrize("value", ["novalue", "a=1,junk", "=x"])
def test_bad_resource_attributes_name_the_variable(value):
    with pytest.raises(ConfigError) as e:
        load(OTEL_RESOURCE_ATTRIBUTES=value)
    assert e.value.field == "OTEL_RESOURCE_ATTRIBUTES"


# --- load_config ---------------------------------------------------------------------

def test_defaults_without_flags_or_environment():
    c = load()
    assert c == load_config(None, {})
    assert (c.span_budget, c.ringbuf_pages, c.gpu_price, c.currency) == (256, 2048, "0", "USD")
    assert c.trace_all and c.route_patterns == [] and c.export_headers == frozenset()
    assert c.export_query is False and c.feature_header is None and c.prometheus_port is None
    assert c.prometheus_addr == "127.0.0.1" and c.health_file is None and c.log_level == "info"
    assert c.store_group is None and c.shutdown_timeout_s == 5
    assert not c.otlp_traces and not c.otlp_metrics and c.otlp_protocol == "grpc"
    assert (c.queue_size, c.export_batch_size, c.schedule_delay_ms) == (8192, 512, 1000)
    assert c.resource_attributes == {} and c.self_service_name == "otel-gpu"
    assert c.stream_rate == 5000  # the default sampler has no ratio


@pytest.mark.parametrize("env, rate", [
    ({}, 5000),
    ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"}, 500),
    ({"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"}, 1250),
    ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.001"}, 100),  # the floor
    ({"OTEL_TRACES_SAMPLER": "parentbased_always_off"}, 5000),  # the parents decide how many
    ({"OTEL_TRACES_SAMPLER": "always_on"}, 5000),
    ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1", "OTEL_GPU_STREAM_RATE": "3000"}, 3000),
])
def test_stream_rate_follows_the_sampler_unless_given(env, rate):
    """Only sampled requests stream their calls, so the default rate is scaled by a ratio
    sampler's ratio; a rate given by flag or variable is taken as it is."""
    assert load(**env).stream_rate == rate
    assert load("--stream-rate", "7", **env).stream_rate == 7


# (flags, environment, field, value from the flag, value from the environment)
SETTINGS = [
    (["--span-budget", "5"], {"OTEL_GPU_SPAN_BUDGET": "7"}, "span_budget", 5, 7),
    (["--stream-rate", "100"], {"OTEL_GPU_STREAM_RATE": "0"}, "stream_rate", 100, 0),
    (["--ringbuf-pages", "64"], {"OTEL_GPU_RINGBUF_PAGES": "128"}, "ringbuf_pages", 64, 128),
    (["--max-connections", "512"], {"OTEL_GPU_MAX_CONNECTIONS": "2048"}, "max_connections", 512, 2048),
    (["--route", "/a/{x}", "--route", "/b"], {"OTEL_GPU_ROUTES": " /c/{y}, ,/d "}, "route_patterns",
     ["/a/{x}", "/b"], ["/c/{y}", "/d"]),
    (["--export-query"], {"OTEL_GPU_EXPORT_QUERY": "TRUE"}, "export_query", True, True),
    (["--export-command-line"], {"OTEL_GPU_EXPORT_COMMAND_LINE": "true"}, "export_command_line", True, True),
    (["--export-header", "X-Tenant"], {"OTEL_GPU_EXPORT_HEADERS": "X-A,x-b"}, "export_headers",
     frozenset({"x-tenant"}), frozenset({"x-a", "x-b"})),
    (["--gpu-price", "2.5"], {"OTEL_GPU_PRICE_PER_HOUR": "H100=4.1,default=1"}, "gpu_price", "2.5",
     "H100=4.1,default=1"),
    (["--currency", "EUR"], {"OTEL_GPU_CURRENCY": "GBP"}, "currency", "EUR", "GBP"),
    (["--feature-header", "X-Feature"], {"OTEL_GPU_FEATURE_HEADER": "X-Product"}, "feature_header",
     "x-feature", "x-product"),
    (["--prometheus-port", "9464"], {"OTEL_GPU_PROMETHEUS_PORT": "9100"}, "prometheus_port", 9464, 9100),
    (["--store", "/tmp/a.db"], {"OTEL_GPU_STORE": "/tmp/b.db"}, "store_path", "/tmp/a.db", "/tmp/b.db"),
    (["--log-level", "DEBUG"], {"OTEL_GPU_LOG_LEVEL": "warning"}, "log_level", "debug", "warning"),
    (["--prometheus-addr", "0.0.0.0"], {"OTEL_GPU_PROMETHEUS_ADDR": "::1"}, "prometheus_addr", "0.0.0.0", "::1"),
    (["--store-group", "4242"], {"OTEL_GPU_STORE_GROUP": "root"}, "store_group", 4242, 0),
    (["--shutdown-timeout", "2"], {"OTEL_GPU_SHUTDOWN_TIMEOUT": "9"}, "shutdown_timeout_s", 2, 9),
    (["--uprobe-links", "PERF"], {"OTEL_GPU_UPROBE_LINKS": "multi"}, "uprobe_links", "perf", "multi"),
    (["--no-console"], {}, "console", False, True),
]


@pytest.mark.parametrize("argv, env, name, from_flag, from_env", SETTINGS, ids=[s[2] for s in SETTINGS])
def test_flag_beats_environment_beats_default(argv, env, name, from_flag, from_env):
    assert getattr(load(*argv, **env), name) == from_flag
    assert getattr(load(**env), name) == from_env


@pytest.mark.parametrize("env, name, value", [
    ({"OTEL_GPU_PROMETHEUS_ADDR": "127.0.0.1"}, "prometheus_addr", "127.0.0.1"),
    ({"OTEL_GPU_HEALTH_FILE": "/tmp/ready"}, "health_file", "/tmp/ready"),
    ({"OTEL_GPU_HEALTH_FILE": ""}, "health_file", None),
    ({"OTEL_BSP_MAX_QUEUE_SIZE": "100"}, "queue_size", 100),
    ({"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "64"}, "export_batch_size", 64),
    ({"OTEL_BSP_MAX_QUEUE_SIZE": "100", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "512"}, "export_batch_size", 100),
    ({"OTEL_BSP_SCHEDULE_DELAY": "200"}, "schedule_delay_ms", 200),
    ({}, "metric_interval_ms", 10_000),
    ({"OTEL_METRIC_EXPORT_INTERVAL": "1000"}, "metric_interval_ms", 1000),
    ({}, "max_links", 128),  # the OpenTelemetry default link count limit
    ({"OTEL_SPAN_LINK_COUNT_LIMIT": "0"}, "max_links", 0),
    ({"OTEL_SERVICE_NAME": "gpu-collector"}, "self_service_name", "gpu-collector"),
    ({"OTEL_RESOURCE_ATTRIBUTES": "team=ml"}, "resource_attributes", {"team": "ml"}),
    ({"OTEL_GPU_EXPORT_QUERY": "false"}, "export_query", False),
    ({}, "export_command_line", False),  # off by default: command lines may hold secrets
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, "otlp_protocol", "http/protobuf"),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "bogus", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"},
     "otlp_protocol", "grpc"),
])
def test_environment_only_settings(env, name, value):
    assert getattr(load(**env), name) == value


@pytest.mark.parametrize("var, value", [
    ("OTEL_GPU_SPAN_BUDGET", "abc"), ("OTEL_GPU_SPAN_BUDGET", "-1"), ("OTEL_GPU_SPAN_BUDGET", "100001"),
    ("OTEL_GPU_STREAM_RATE", "-1"), ("OTEL_GPU_STREAM_RATE", "10000001"),
    ("OTEL_GPU_RINGBUF_PAGES", "abc"), ("OTEL_GPU_RINGBUF_PAGES", "3"), ("OTEL_GPU_RINGBUF_PAGES", "0"),
    ("OTEL_GPU_PROMETHEUS_PORT", "abc"), ("OTEL_GPU_PROMETHEUS_PORT", "70000"),
    ("OTEL_GPU_ROUTES", "/ok,models/{m}"), ("OTEL_GPU_EXPORT_QUERY", "yes"),
    ("OTEL_GPU_EXPORT_COMMAND_LINE", "1"),
    ("OTEL_GPU_PRICE_PER_HOUR", "H100=abc"), ("OTEL_GPU_PRICE_PER_HOUR", "-2"),
    ("OTEL_GPU_LOG_LEVEL", "loud"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon"),
    ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "json"), ("OTEL_BSP_MAX_QUEUE_SIZE", "0"), ("OTEL_METRIC_EXPORT_INTERVAL", "10s"),
    ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "x"), ("OTEL_BSP_SCHEDULE_DELAY", "0"),
    ("OTEL_SPAN_LINK_COUNT_LIMIT", "-1"), ("OTEL_SPAN_LINK_COUNT_LIMIT", "many"),
    ("OTEL_RESOURCE_ATTRIBUTES", "novalue"), ("OTEL_GPU_PROMETHEUS_ADDR", "localhost:9464"),
    ("OTEL_GPU_STORE_GROUP", "no-such-group-otel-gpu"), ("OTEL_GPU_SHUTDOWN_TIMEOUT", "0"),
    ("OTEL_GPU_SHUTDOWN_TIMEOUT", "1.5"), ("OTEL_GPU_UPROBE_LINKS", "kprobes"),
])
def test_each_invalid_variable_is_named(var, value):
    with pytest.raises(ConfigError) as e:
        load(**{var: value})
    assert e.value.field == var
    assert str(e.value).startswith(f"invalid configuration: {var}: ")


def test_an_invalid_flag_names_the_field_even_when_the_variable_is_fine():
    with pytest.raises(ConfigError) as e:
        load("--span-budget", "-1", OTEL_GPU_SPAN_BUDGET="5")
    assert e.value.field == "span_budget"


def test_a_valid_flag_hides_an_invalid_variable_of_the_same_setting():
    assert load("--ringbuf-pages", "64", OTEL_GPU_RINGBUF_PAGES="3").ringbuf_pages == 64


def test_otlp_endpoints():
    assert load(**ENDPOINT).otlp_traces and load(**ENDPOINT).otlp_metrics
    traces = load(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="http://t:4317")
    assert traces.otlp_traces and not traces.otlp_metrics
    metrics = load(OTEL_EXPORTER_OTLP_METRICS_ENDPOINT="http://m:4317")
    assert metrics.otlp_metrics and not metrics.otlp_traces


def test_console_is_on_without_an_otlp_traces_endpoint_unless_a_flag_says():
    assert load().console is True
    assert load(**ENDPOINT).console is False
    assert load(OTEL_EXPORTER_OTLP_METRICS_ENDPOINT="http://m:4317").console is True
    assert load("--console", **ENDPOINT).console is True
    assert load("--no-console").console is False


def test_store_resolution(tmp_path):
    home = {"HOME": str(tmp_path)}
    assert load(**home).store_path == default_store_path(home)  # unset, no backend: on
    assert load(**home, **ENDPOINT).store_path is None           # unset, a backend: off
    assert load(OTEL_GPU_STORE="/x.db", **ENDPOINT).store_path == "/x.db"
    assert load(OTEL_GPU_STORE="").store_path is None
    assert load("--no-store", OTEL_GPU_STORE="/x.db").store_path is None
    assert load("--store", "/y.db", OTEL_GPU_STORE="").store_path == "/y.db"
    assert load("--store", "/y.db", **ENDPOINT).store_path == "/y.db"


def test_pids_and_exes_come_from_flags_only():
    c = load("--pid", "10", "--pid", "11", "--exe", "python3")
    assert c.pids == [10, 11] and c.exes == ["python3"] and not c.trace_all
    with pytest.raises(ConfigError) as e:
        load("--pid", "0")
    assert e.value.field == "pid"


def test_python_context_is_on_unless_turned_off():
    from otel_gpu.config_loader import load_config
    assert load_config(None, {}).python_context is True
    assert load_config(None, {"OTEL_GPU_PYTHON_CONTEXT": "false"}).python_context is False


def test_max_routes_flag_beats_environment_beats_default():
    assert load().max_routes == 100
    assert load(OTEL_GPU_MAX_ROUTES="30").max_routes == 30
    assert load("--max-routes", "7", OTEL_GPU_MAX_ROUTES="30").max_routes == 7
    with pytest.raises(ConfigError, match="OTEL_GPU_MAX_ROUTES"):
        load(OTEL_GPU_MAX_ROUTES="0")
    with pytest.raises(ConfigError, match="max_routes"):
        load("--max-routes", "0")


def test_bpf_cache_flag_env_default_and_off():
    assert load().bpf_cache == "/var/cache/otel-gpu"
    assert load(OTEL_GPU_BPF_CACHE="/tmp/c").bpf_cache == "/tmp/c"
    assert load("--bpf-cache", "/tmp/f", OTEL_GPU_BPF_CACHE="/tmp/c").bpf_cache == "/tmp/f"  # flag wins
    assert load("--bpf-cache", "off").bpf_cache is None
    assert load(OTEL_GPU_BPF_CACHE="OFF").bpf_cache is None
    with pytest.raises(ConfigError) as e:
        load(OTEL_GPU_BPF_CACHE="relative/dir")
    assert e.value.field == "OTEL_GPU_BPF_CACHE"


def test_flush_interval_flag_beats_environment_beats_default():
    assert load().flush_interval_s == 5
    assert load(OTEL_GPU_FLUSH_INTERVAL="2").flush_interval_s == 2
    assert load("--flush-interval", "1", OTEL_GPU_FLUSH_INTERVAL="2").flush_interval_s == 1
    with pytest.raises(ConfigError, match="OTEL_GPU_FLUSH_INTERVAL"):
        load(OTEL_GPU_FLUSH_INTERVAL="0")
