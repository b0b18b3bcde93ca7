"""otel-gpu command line: `run` (the collector) and `demo`."""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from .config import Config, ConfigError, env_list

log = logging.getLogger("otel_gpu")


def _run_parser(sub) -> None:
    p = sub.add_parser("run", help="attach the probes and export traces until SIGINT/SIGTERM")
    p.add_argument("--pid", type=int, action="append", default=[], help="trace only this process (repeatable)")
    p.add_argument("--exe", action="append", default=[], help="trace only processes with this comm/executable name (repeatable)")
    p.add_argument("--span-budget", type=int, default=_env_int("OTEL_GPU_SPAN_BUDGET", 256, minimum=0),
                   help="CUDA call spans per request before rolling up (default 256)")
    p.add_argument("--console", dest="console", action="store_true", default=None,
                   help="print trace trees (default: on when no OTLP endpoint is set)")
    p.add_argument("--no-console", dest="console", action="store_false")
    p.add_argument("--route", action="append", default=env_list("OTEL_GPU_ROUTES"),
                   help="explicit route pattern such as /v1/models/{model}/infer (repeatable)")
    p.add_argument("--export-query", action="store_true",
                   default=os.environ.get("OTEL_GPU_EXPORT_QUERY") == "true",
                   help="export url.query (off by default: query strings may hold secrets)")
    p.add_argument("--export-header", action="append", default=env_list("OTEL_GPU_EXPORT_HEADERS"),
                   help="request header whose value may be exported (repeatable; none by default)")
    p.add_argument("--gpu-price", default=os.environ.get("OTEL_GPU_PRICE_PER_HOUR", "0"),
                   help='price per GPU-hour for cost estimates: "2.5" or "H100=4.1,A100=2.2,default=1.5"')
    p.add_argument("--currency", default=os.environ.get("OTEL_GPU_CURRENCY", "USD"))
    p.add_argument("--feature-header", default=os.environ.get("OTEL_GPU_FEATURE_HEADER"),
                   help="request header whose value names the feature for cost (default: http.route)")
    p.add_argument("--prometheus-port", type=int,
                   default=_env_int("OTEL_GPU_PROMETHEUS_PORT", None),
                   help="serve the GPU metrics for Prometheus on this port")
    p.add_argument("--ringbuf-pages", type=int, default=_env_int("OTEL_GPU_RINGBUF_PAGES", 2048),
                   help="ring buffer size in 4 KiB pages, a power of two (default 2048 = 8 MiB)")
    p.add_argument("--store", dest="store", default=os.environ.get("OTEL_GPU_STORE"),
                   help="local store (SQLite) path; default: on, at the default path, when no OTLP endpoint is set")
    p.add_argument("--no-store", dest="store", action="store_const", const="",
                   help="do not write the local store")
    p.add_argument("--ebpf", action="store_true", help="print the BPF C program and exit")
    p.add_argument("--log-level", default=os.environ.get("OTEL_GPU_LOG_LEVEL", "info"))


def build_config(args) -> Config:
    return Config(pids=args.pid, exes=args.exe, span_budget=args.span_budget, console=args.console,
                  route_patterns=args.route, export_query=args.export_query,
                  export_headers=frozenset(h.lower() for h in args.export_header),
                  health_file=os.environ.get("OTEL_GPU_HEALTH_FILE"), gpu_price=args.gpu_price,
                  currency=args.currency, prometheus_port=args.prometheus_port,
                  ringbuf_pages=args.ringbuf_pages,
                  feature_header=args.feature_header.lower() if args.feature_header else None).validate()


def preflight() -> None:
    """Fails early with one line that names the fix."""
    if os.geteuid() != 0:
        raise SystemExit("otel-gpu: needs root (eBPF needs CAP_BPF and CAP_PERFMON, /proc of other users "
                         "CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH): run it with sudo")
    if not (os.path.exists("/sys/kernel/debug/tracing/uprobe_events")
            or os.path.exists("/sys/kernel/tracing/uprobe_events")):
        raise SystemExit("otel-gpu: tracefs is not mounted: mount -t debugfs debugfs /sys/kernel/debug "
                         "(scripts/setup.sh does this)")
    try:
        import bcc  # noqa: F401
    except ImportError:
        raise SystemExit("otel-gpu: cannot import bcc: apt-get install python3-bpfcc and run scripts/setup.sh")
    from .probes.program import MERGED_HEADERS
    source = os.environ.get("BCC_KERNEL_SOURCE")
    if source and not os.path.isfile(os.path.join(source, "include", "linux", "kconfig.h")):
        raise SystemExit(f"otel-gpu: BCC_KERNEL_SOURCE={source} holds no kernel headers (include/linux/kconfig.h): "
                         "point it at a header tree or unset it (scripts/setup.sh builds /var/lib/otel-gpu/kernel-headers)")
    if not (source or os.path.exists(f"/lib/modules/{os.uname().release}/build")
            or MERGED_HEADERS.is_dir()):
        raise SystemExit("otel-gpu: no kernel headers for this kernel: install linux-headers "
                         "(scripts/setup.sh merges Debian's into /var/lib/otel-gpu/kernel-headers)")


def _env_int(name: str, default, minimum: int = 1):
    """An integer setting from the environment; a bad one is a ConfigError naming it."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if not raw.strip().isdigit() or int(raw) < minimum:
        raise ConfigError(name, f"{raw!r} is not an integer >= {minimum}")
    return int(raw)


def _open_store(path, no_backend: bool):
    """The local store: an explicit path, else the default path when there is no backend."""
    if path == "" or (path is None and not no_backend):
        return None
    from .store.paths import default_store_path
    from .store.sink import StoreSink
    path = path or default_store_path()
    log.info("local store: %s (otel-gpu report / otel-gpu traces read it)", path)
    return StoreSink(path)


def cmd_run(args) -> int:
    from .probes.program import source_text
    if args.ebpf:
        print(source_text())
        return 0
    try:  # every setting is checked before anything starts
        config = build_config(args)
        from .config import base_resource_attributes
        from .export.sink import SpanSink, make_otlp_exporter, otlp_configured, otlp_protocol
        otlp_protocol()
        resource_attributes = base_resource_attributes()
        queue_size = _env_int("OTEL_BSP_MAX_QUEUE_SIZE", 8192)
        otlp = make_otlp_exporter() if otlp_configured() else None
    except (ConfigError, ValueError) as e:
        print(f"otel-gpu: {e}", file=sys.stderr)
        return 2
    preflight()
    from .collector import Collector
    console = config.console if config.console is not None else otlp is None
    store = _open_store(args.store, otlp is None)
    sink = SpanSink(otlp, console, max_queue_size=queue_size, store=store)
    k8s = None
    try:
        from .k8s import K8sResolver
        k8s = K8sResolver.from_environment(config.proc_root)
    except Exception as e:  # never fatal: spans flow without pod attributes
        log.warning("kubernetes attributes disabled: %s", e)
    collector = Collector(config, sink, k8s=k8s, resource_attributes=resource_attributes)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    # SIGUSR1: one log line with the size of every internal table (leak checks).
    signal.signal(signal.SIGUSR1, lambda *_: collector.state_requested.set())
    try:
        collector.start()
        collector.run(stop)
    except Exception as e:
        log.error("collector failed: %s", e)
        collector.shutdown()
        return 1
    collector.shutdown()
    if k8s is not None:
        k8s.stop()
    return 0


class _Parser(argparse.ArgumentParser):
    """A bad flag or value is one line naming it, exit 2 (no usage dump)."""

    def error(self, message):
        self.exit(2, f"otel-gpu {self.prog.split()[-1]}: {message}\n")


def main(argv=None) -> int:
    parser = _Parser(prog="otel-gpu", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    try:
        _run_parser(sub)  # reads the environment's defaults
    except ConfigError as e:
        print(f"otel-gpu: {e}", file=sys.stderr)
        return 2
    d = sub.add_parser("demo", help="run the collector on a bundled CUDA HTTP service and print traces")
    d.add_argument("--requests", type=int, default=3, help="requests per route")
    from .store.commands import COMMANDS, add_parsers, dispatch
    add_parsers(sub)
    args = parser.parse_args(argv)
    if args.command in COMMANDS:  # readers of the local store: no root, no collector
        return dispatch(args)
    logging.basicConfig(level=getattr(args, "log_level", "info").upper(), stream=sys.stderr,
                        format="%(asctime)s otel-gpu %(levelname)s %(message)s")
    if args.command == "run":
        return cmd_run(args)
    from .demo.runner import run_demo
    return run_demo(args.requests)


if __name__ == "__main__":
    sys.exit(main())
