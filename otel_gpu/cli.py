"""otel-gpu command line: `run` (the collector), `compile` (warms the BPF cache), `demo`, `status`, and the local store's `report` and `traces`."""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from .config import ConfigError
from .config_loader import add_run_arguments, load_config
from .signal_flag import SignalFlag

log = logging.getLogger("otel_gpu")
LOG_FORMAT = "%(asctime)s otel-gpu %(levelname)s %(message)s"


def setup_logging(level: str) -> None:
    """stderr, one sanitised line per record (log lines quote other processes' names)."""
    from .sanitize import LogFormatter
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogFormatter(LOG_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])


def _run_parser(sub) -> None:
    p = sub.add_parser("run", help="attach the probes and export traces until SIGINT/SIGTERM")
    add_run_arguments(p)
    p.add_argument("--ebpf", action="store_true", help="print the BPF C program and exit")


def _compile_parser(sub) -> None:
    p = sub.add_parser("compile", help="compile the BPF program into the BPF cache (--bpf-cache) and exit: "
                       "a later `run` with the same settings starts without compiling (install step)")
    add_run_arguments(p)


def _config(args):
    """The checked settings with logging set up, or None after one line on stderr."""
    try:  # every setting is checked before anything starts
        config = load_config(args)
    except ConfigError as e:
        print(f"otel-gpu: {e}", file=sys.stderr)
        return None
    setup_logging(config.log_level)
    return config


def cmd_compile(args) -> int:
    config = _config(args)
    if config is None:
        return 2
    if not config.bpf_cache:
        print("otel-gpu: the BPF cache is off (--bpf-cache / OTEL_GPU_BPF_CACHE): nothing to compile into",
              file=sys.stderr)
        return 2
    preflight()
    from .probes.program_cache import CacheError
    from .probes.source import ProgramOptions, load, program_cache
    options = ProgramOptions.from_config(config)
    cache, key = program_cache(options)
    try:
        if cache.read(key) is not None:
            log.info("BPF cache %s already holds this program", cache.entry_path(key))
            return 0
    except CacheError as e:
        log.info("BPF cache entry %s replaced: %s", cache.entry_path(key), e)
    load(options, compile_only=True).cleanup()
    return 0 if cache.entry_path(key).is_file() else 1  # not cacheable: load said why


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
    from .probes.source import MERGED_HEADERS, release_headers
    source = os.environ.get("BCC_KERNEL_SOURCE")
    if source and not os.path.isfile(os.path.join(source, "include", "linux", "kconfig.h")):
        raise SystemExit(f"otel-gpu: BCC_KERNEL_SOURCE={source} holds no kernel headers (include/linux/kconfig.h): "
                         "point it at a header tree or unset it (scripts/setup.sh builds /var/lib/otel-gpu/kernel-headers)")
    if not (source or release_headers().exists() or MERGED_HEADERS.is_dir()):
        raise SystemExit("otel-gpu: no kernel headers for this kernel: install linux-headers "
                         "(scripts/setup.sh merges Debian's into /var/lib/otel-gpu/kernel-headers)")


def handle_signals(stop: SignalFlag, state_requested: SignalFlag) -> None:
    """SIGINT and SIGTERM stop the collector; SIGUSR1 asks for one log line with the size
    of every internal table (leak checks). The handlers only set flags (signal_flag.py)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    signal.signal(signal.SIGUSR1, lambda *_: state_requested.set())


def _k8s_resolver(config):
    """Pod attributes where the collector runs in Kubernetes; None elsewhere, or when the
    API cannot be reached (never fatal: spans flow without them)."""
    if not (os.environ.get("KUBECONFIG") or os.environ.get("KUBERNETES_SERVICE_HOST")):
        # The kubernetes client costs ~30 MB and ~0.4 s to import: only where it can serve.
        log.info("k8s: not in Kubernetes (no KUBERNETES_SERVICE_HOST or KUBECONFIG); no pod attributes")
        return None
    try:
        from .k8s import K8sResolver
        return K8sResolver.from_environment(config.proc_root)
    except Exception as e:
        log.warning("kubernetes attributes disabled: %s", e)
        return None


def cmd_run(args) -> int:
    if args.ebpf:
        from .probes.source import source_text
        print(source_text())
        return 0
    config = _config(args)
    if config is None:
        return 2
    preflight()
    if config.store_path:
        log.info("local store: %s (otel-gpu report / otel-gpu traces read it)", config.store_path)
    from .kernel_io.program import discard, start_loading
    from .ratelimit import Stats
    from .store.schema import StoreError
    stats = Stats()  # the collector's one set of counters, the program's load among them
    loading = start_loading(config, stats)  # beside the imports below
    k8s = None
    try:
        from . import gc_policy
        from .collector import Collector
        k8s = _k8s_resolver(config)
        collector = Collector(config, k8s=k8s, stats=stats)
    except BaseException as e:  # no collector will take the load (Ctrl-C included): it ends before we do
        discard(loading)
        if k8s is not None:
            k8s.stop()
        if not isinstance(e, StoreError):
            raise
        log.error("%s", e)  # the store was the only destination and cannot be written
        return 2
    stop = SignalFlag()
    handle_signals(stop, collector.state_requested)
    try:
        collector.start(loading)
        gc_policy.set_for_the_loop()
        collector.run(stop)
    except Exception as e:
        log.error("collector failed: %s", e)
        return 1
    finally:
        collector.shutdown()
        if k8s is not None:
            k8s.stop()
    return 0


class _Parser(argparse.ArgumentParser):
    """A bad flag or value is one line naming it, exit 2 (no usage dump)."""

    def error(self, message):
        self.exit(2, f"otel-gpu {self.prog.split()[-1]}: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="otel-gpu", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _run_parser(sub)
    _compile_parser(sub)
    d = sub.add_parser("demo", help="run the collector on a bundled CUDA HTTP service and print traces; "
                       "its data stays in the local store")
    d.add_argument("--requests", type=int, default=3, help="requests per route")
    d.add_argument("--keep", action="store_true",
                   help="add to the previous demo runs' data in the store (default: replace it)")
    from .status.command import add_parser as add_status_parser
    add_status_parser(sub)
    from .store.commands import add_parsers
    add_parsers(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from .store.commands import COMMANDS, dispatch
    if args.command in COMMANDS:  # readers of the local store: no root, no collector
        return dispatch(args)
    if args.command == "status":  # reads the collector's state file: no root
        from .status.command import run as status
        return status(args)
    if args.command == "run":
        return cmd_run(args)  # sets up logging once its configuration is loaded
    if args.command == "compile":
        return cmd_compile(args)
    setup_logging("INFO")
    from .demo.runner import run_demo
    return run_demo(args.requests, keep=args.keep)


if __name__ == "__main__":
    sys.exit(main())
