"""Where the collector's settings come from: the `run` flags (add_run_arguments) and the
environment, resolved by one loader (flag, else environment, else default) into a
validated Config (config.py)."""
from __future__ import annotations

import os
from typing import Mapping, Optional

from .config import DEFAULT_BPF_CACHE, DEFAULT_DEVICE_CLOCK_FLAG, DEFAULT_STATUS_FILE, Config, ConfigError, env_list, resource_attributes
from .store.paths import default_store_path


def add_run_arguments(p) -> None:
    """The `run` flags. Every default is None: load_config tells "not given" (environment,
    then default) from a given value."""
    p.add_argument("--pid", type=int, action="append", help="trace only this process (repeatable)")
    p.add_argument("--exe", action="append",
                   help="trace only processes with this comm/executable name (repeatable)")
    p.add_argument("--span-budget", type=int,
                   help="CUDA call spans per request before rolling up (OTEL_GPU_SPAN_BUDGET; default 256)")
    p.add_argument("--stream-budget", type=int,
                   help="CUDA calls per thread and request sent one by one; the rest are counted in the "
                        "kernel (OTEL_GPU_STREAM_BUDGET; default 64)")
    p.add_argument("--stream-rate", type=int,
                   help="CUDA calls per second sent one by one, host-wide; the rest are counted in the "
                        "kernel (OTEL_GPU_STREAM_RATE; default 5000, times the ratio of a traceidratio sampler, "
                        "at least 100)")
    p.add_argument("--console", dest="console", action="store_true", default=None,
                   help="print trace trees (default: on when no OTLP endpoint is set)")
    p.add_argument("--no-console", dest="console", action="store_false")
    p.add_argument("--route", action="append",
                   help="explicit route pattern such as /v1/models/{model}/infer (repeatable; OTEL_GPU_ROUTES)")
    p.add_argument("--max-routes", type=int,
                   help="distinct http.route values per service; later ones fold into a learned "
                        "{param} template or {other} (OTEL_GPU_MAX_ROUTES; default 100)")
    p.add_argument("--export-query", action="store_true", default=None,
                   help="export url.query (OTEL_GPU_EXPORT_QUERY=true; off by default: query strings may hold secrets)")
    p.add_argument("--export-command-line", action="store_true", default=None,
                   help="export process.command_line (OTEL_GPU_EXPORT_COMMAND_LINE=true; off by default: "
                        "command lines may hold secrets)")
    p.add_argument("--export-header", action="append",
                   help="request header whose value may be exported (repeatable; OTEL_GPU_EXPORT_HEADERS)")
    p.add_argument("--gpu-price", help='price per GPU-hour for cost estimates: "2.5" or '
                   '"H100=4.1,A100=2.2,default=1.5" (OTEL_GPU_PRICE_PER_HOUR)')
    p.add_argument("--currency", help="currency of the cost estimates (OTEL_GPU_CURRENCY; default USD)")
    p.add_argument("--feature-header",
                   help="request header whose value names the feature for cost (OTEL_GPU_FEATURE_HEADER; "
                        "default: http.route)")
    p.add_argument("--prometheus-port", type=int,
                   help="serve the GPU metrics for Prometheus on this port (OTEL_GPU_PROMETHEUS_PORT)")
    p.add_argument("--prometheus-addr",
                   help="address the Prometheus endpoint binds (OTEL_GPU_PROMETHEUS_ADDR; default 127.0.0.1)")
    p.add_argument("--ringbuf-pages", type=int,
                   help="ring buffer size in 4 KiB pages, a power of two (OTEL_GPU_RINGBUF_PAGES; default 2048)")
    p.add_argument("--max-connections", type=int,
                   help="connections of traced processes followed at once; past it new ones are counted "
                        "and left untracked (OTEL_GPU_MAX_CONNECTIONS; default 65536)")
    p.add_argument("--store", dest="store", help="local store (SQLite) path (OTEL_GPU_STORE); "
                   "default: on, at the default path, when no OTLP endpoint is set")
    p.add_argument("--no-store", dest="store", action="store_const", const="",
                   help="do not write the local store")
    p.add_argument("--store-group", help="group (name or gid) that may read the store: file 0640, directory "
                   "0750 (OTEL_GPU_STORE_GROUP; default: root only, 0600/0700)")
    p.add_argument("--flush-interval", type=int,
                   help="seconds between flushes of the GPU work no single request owns: the ambiguous, "
                        "shared and outside windows, and the calls the kernel counted outside requests "
                        "(OTEL_GPU_FLUSH_INTERVAL; default 5)")
    p.add_argument("--shutdown-timeout", type=int,
                   help="seconds from SIGTERM to exit, whatever the backend does (OTEL_GPU_SHUTDOWN_TIMEOUT; "
                        "default 5)")
    p.add_argument("--status-file", help="state file that `otel-gpu status` reads, rewritten every 2 s "
                   "(OTEL_GPU_STATUS_FILE; default /run/otel-gpu/status.json; '' turns it off)")
    p.add_argument("--bpf-cache", help="directory of compiled BPF programs: a start with a cached program "
                   "skips the clang compile (OTEL_GPU_BPF_CACHE; default /var/cache/otel-gpu; 'off' compiles "
                   "at every start)")
    p.add_argument("--log-level", help="debug, info, warning, error (OTEL_GPU_LOG_LEVEL; default info)")
    p.add_argument("--python-context", dest="python_context", action="store_true", default=None,
                   help="attribute CUDA calls of Python services by asyncio task / contextvars context "
                        "(OTEL_GPU_PYTHON_CONTEXT; default on)")
    p.add_argument("--no-python-context", dest="python_context", action="store_false")
    p.add_argument("--go-goroutines", dest="go_goroutines", action="store_true", default=None,
                   help="attribute CUDA calls of Go services by goroutine (OTEL_GPU_GO_GOROUTINES; default on)")
    p.add_argument("--no-go-goroutines", dest="go_goroutines", action="store_false")
    p.add_argument("--time-split", dest="time_split", action="store_true", default=None,
                   help="split each request's time into on CPU, waiting for a CPU, GPU sync and blocked, from "
                        "the sched_switch tracepoint, which every context switch on the host runs: ~+90 ns a "
                        "switch (OTEL_GPU_TIME_SPLIT; default on)")
    p.add_argument("--no-time-split", dest="time_split", action="store_false")
    p.add_argument("--uprobe-links", help="how uprobes are planted: auto (uprobe_multi links where the kernel "
                   "has them, 6.6+; else perf-event uprobes), multi or perf (OTEL_GPU_UPROBE_LINKS; default auto)")


class _Sources:
    """Flag, else environment variable, else default. Remembers which variable gave a
    value, so that a value validate() refuses is reported under the variable's name."""

    def __init__(self, args, env: Mapping[str, str]) -> None:
        self.args, self.env = args, env
        self.from_env: dict[str, str] = {}  # validate()'s field name -> variable

    def flag(self, dest: str):
        return getattr(self.args, dest, None)

    def raw(self, dest: Optional[str], var: str) -> Optional[str]:
        value = self.flag(dest) if dest else None
        if value is not None:
            return value
        value = self.env.get(var, "").strip()
        if not value:
            return None
        self.from_env[dest or var] = var
        return value

    def text(self, dest: Optional[str], var: str, default: Optional[str]) -> Optional[str]:
        value = self.raw(dest, var)
        return default if value is None else value

    def integer(self, dest: Optional[str], var: str, default: Optional[int], minimum: int = 1) -> Optional[int]:
        value = self.raw(dest, var)
        if value is None or isinstance(value, int):
            return default if value is None else value
        if not (value.isascii() and value.isdigit()) or int(value) < minimum:
            raise ConfigError(var, f"{value!r} is not an integer >= {minimum}")
        return int(value)

    def names(self, dest: str, var: str) -> list[str]:
        value = self.flag(dest)
        if value is not None:
            return [x.strip() for x in value if x.strip()]
        if env_list(var, self.env):
            self.from_env[dest] = var
        return env_list(var, self.env)

    def boolean(self, dest: str, var: str, default: bool = False) -> bool:
        value = self.raw(dest, var)
        if value is None:
            return default
        if isinstance(value, bool):
            return value
        if value.lower() not in ("true", "false"):
            raise ConfigError(var, f"{value!r} is not true or false")
        return value.lower() == "true"


def _store_path(src: _Sources, otlp_traces: bool) -> Optional[str]:
    """An explicit path; "" (or --no-store) off; unset: on at the default path unless
    spans go to an OTLP backend."""
    value = src.flag("store")
    if value is None and "OTEL_GPU_STORE" in src.env:
        value = src.env["OTEL_GPU_STORE"]
    if value is None:
        if otlp_traces:
            return None
        return default_store_path(src.env)
    return value.strip() or None


def _group(value: Optional[str], src: _Sources) -> Optional[int]:
    """A group name or a numeric gid (one that /etc/group may not list)."""
    if value is None:
        return None
    var = src.from_env.get("store_group", "store_group")
    if value.isascii() and value.isdigit():
        return int(value)
    import grp
    try:
        return grp.getgrnam(value).gr_gid
    except KeyError:
        raise ConfigError(var, f"no group named {value!r}") from None


def _off(value: str) -> Optional[str]:
    return None if value.strip().lower() == "off" else value.strip()


def _otlp_protocol(src: _Sources) -> str:
    traces = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
    var = traces if src.env.get(traces, "").strip() else "OTEL_EXPORTER_OTLP_PROTOCOL"
    value = src.raw(None, var)
    if value is not None:  # validated even without an endpoint: a typo shows now, not later
        src.from_env["otlp_protocol"] = var
    return value or "grpc"


def load_config(args=None, env: Mapping[str, str] = os.environ) -> Config:
    """The one loader: `args` from a parser given add_run_arguments (None: no flags).
    Raises ConfigError naming the field (a flag's) or the environment variable."""
    src = _Sources(args, env)
    otlp_traces = bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))
    console = src.flag("console")
    queue_size = src.integer(None, "OTEL_BSP_MAX_QUEUE_SIZE", 8192)
    feature = src.text("feature_header", "OTEL_GPU_FEATURE_HEADER", None)
    delay = src.integer(None, "OTEL_BSP_SCHEDULE_DELAY", 1000)
    config = Config(
        pids=src.flag("pid") or [],
        exes=src.flag("exe") or [],
        span_budget=src.integer("span_budget", "OTEL_GPU_SPAN_BUDGET", 256, minimum=0),
        stream_budget=src.integer("stream_budget", "OTEL_GPU_STREAM_BUDGET", 64, minimum=0),
        stream_rate=src.integer("stream_rate", "OTEL_GPU_STREAM_RATE", None, minimum=0),
        console=(not otlp_traces) if console is None else console,
        route_patterns=src.names("route", "OTEL_GPU_ROUTES"),
        max_routes=src.integer("max_routes", "OTEL_GPU_MAX_ROUTES", 100),
        export_query=src.boolean("export_query", "OTEL_GPU_EXPORT_QUERY"),
        export_command_line=src.boolean("export_command_line", "OTEL_GPU_EXPORT_COMMAND_LINE"),
        export_headers=frozenset(h.lower() for h in src.names("export_header", "OTEL_GPU_EXPORT_HEADERS")),
        ringbuf_pages=src.integer("ringbuf_pages", "OTEL_GPU_RINGBUF_PAGES", 2048),
        max_connections=src.integer("max_connections", "OTEL_GPU_MAX_CONNECTIONS", 65536),
        health_file=src.text(None, "OTEL_GPU_HEALTH_FILE", None),
        gpu_price=src.text("gpu_price", "OTEL_GPU_PRICE_PER_HOUR", "0"),
        nvidia_procfs=src.text(None, "OTEL_GPU_NVIDIA_PROCFS", "/proc/driver/nvidia"),
        amd_sysfs=src.text(None, "OTEL_GPU_AMD_SYSFS", "/sys"),
        currency=src.text("currency", "OTEL_GPU_CURRENCY", "USD"),
        feature_header=feature.lower() if feature else None,
        prometheus_port=src.integer("prometheus_port", "OTEL_GPU_PROMETHEUS_PORT", None),
        prometheus_addr=src.text("prometheus_addr", "OTEL_GPU_PROMETHEUS_ADDR", "127.0.0.1"),
        otlp_traces=otlp_traces,
        otlp_metrics=bool(env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")),
        otlp_protocol=_otlp_protocol(src),
        queue_size=queue_size,
        # The SDK refuses an export batch larger than the queue.
        export_batch_size=min(src.integer(None, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512), queue_size),
        schedule_delay_ms=delay,
        metric_interval_ms=src.integer(None, "OTEL_METRIC_EXPORT_INTERVAL", 10_000),
        max_links=src.integer(None, "OTEL_SPAN_LINK_COUNT_LIMIT", 128, minimum=0),
        store_path=_store_path(src, otlp_traces),
        status_file=src.text("status_file", "OTEL_GPU_STATUS_FILE", DEFAULT_STATUS_FILE) or None,
        device_clock_flag=src.text(None, "OTEL_GPU_DEVICE_CLOCK_FLAG", DEFAULT_DEVICE_CLOCK_FLAG) or None,
        bpf_cache=_off(src.text("bpf_cache", "OTEL_GPU_BPF_CACHE", DEFAULT_BPF_CACHE)),
        store_group=_group(src.text("store_group", "OTEL_GPU_STORE_GROUP", None), src),
        shutdown_timeout_s=src.integer("shutdown_timeout", "OTEL_GPU_SHUTDOWN_TIMEOUT", 5),
        flush_interval_s=src.integer("flush_interval", "OTEL_GPU_FLUSH_INTERVAL", 5),
        resource_attributes=resource_attributes(env.get("OTEL_RESOURCE_ATTRIBUTES", "")),
        self_service_name=src.text(None, "OTEL_SERVICE_NAME", "otel-gpu"),
        log_level=src.text("log_level", "OTEL_GPU_LOG_LEVEL", "info").lower(),
        uprobe_links=src.text("uprobe_links", "OTEL_GPU_UPROBE_LINKS", "auto").lower(),
        python_context=src.boolean("python_context", "OTEL_GPU_PYTHON_CONTEXT", True),
        go_goroutines=src.boolean("go_goroutines", "OTEL_GPU_GO_GOROUTINES", True),
        time_split=src.boolean("time_split", "OTEL_GPU_TIME_SPLIT", True),
        traces_sampler=(env.get("OTEL_TRACES_SAMPLER") or "parentbased_always_on").strip().lower(),
        traces_sampler_arg=env.get("OTEL_TRACES_SAMPLER_ARG"),
    )
    try:
        return config.validate()
    except ConfigError as e:
        var = src.from_env.get(e.field)
        if var is None:
            raise
        raise ConfigError(var, e.reason) from None
