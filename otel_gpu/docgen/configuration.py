"""docs/configuration.md (`python -m otel_gpu.docgen.configuration > docs/configuration.md`).

Flags and their help come from the `run` parser; each flag's variable and default, and
every variable no flag sets, from a run of config_loader.load_config that records what it reads.
Documentation only: nothing here configures the collector."""
from __future__ import annotations

import argparse
import re
from typing import Optional

from .. import config_loader

# What the loader cannot tell about a variable no flag sets: its meaning, and its default
# where the loader passes none (declare one only there: the test checks). Also the
# variables only the OpenTelemetry SDK reads.
ENV_ONLY: dict[str, tuple[Optional[str], str]] = {
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": (None, "spans per OTLP batch (capped at the queue size)"),
    "OTEL_BSP_MAX_QUEUE_SIZE": (None, "spans queued for OTLP; past it new spans are dropped and counted"),
    "OTEL_BSP_SCHEDULE_DELAY": (None, "ms at most between OTLP span batches (sooner when a batch is full)"),
    "OTEL_EXPORTER_OTLP_ENDPOINT": (None, "where spans and metrics go over OTLP (unset: the console and the "
                                    "local store)"),
    "OTEL_EXPORTER_OTLP_HEADERS": (None, "headers for the backend, such as authentication (read by the "
                                   "OpenTelemetry SDK's exporters)"),
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": (None, "where metrics go over OTLP, for metrics only"),
    "OTEL_EXPORTER_OTLP_PROTOCOL": ("`grpc`", "`grpc` or `http/protobuf`; checked even without an endpoint"),
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": (None, "where spans go over OTLP, for spans only"),
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": (None, "as OTEL_EXPORTER_OTLP_PROTOCOL, for spans; wins over it"),
    "OTEL_GPU_AMD_SYSFS": (None, "the sysfs holding the amdgpu driver's KFD topology "
                           "(`class/kfd/kfd/topology/nodes`) and the boards' `product_name`: AMD GPU model and "
                           "UUID, for `--gpu-price` by model and `gpu.device.uuid`/`.model` of HIP work (in a "
                           "container: the host's, mounted)"),
    "OTEL_GPU_DEVICE_CLOCK_FLAG": (None, "device-clock mode's flag file, present while the collector runs: "
                                   "services that load `libotel_gpu_cupti.so` time their GPU work by the device "
                                   "only then (the same variable tells them where it is); empty: never raised"),
    "OTEL_GPU_HEALTH_FILE": (None, "file written once the probes are attached, removed on exit (Kubernetes "
                             "probes)"),
    "OTEL_GPU_NVIDIA_PROCFS": (None, "the NVIDIA driver's procfs: GPU model, UUID and bus location, for "
                               "`--gpu-price` by model and `gpu.device.uuid`/`.model` (in a container: the "
                               "host's, mounted)"),
    "OTEL_METRIC_EXPORT_INTERVAL": (None, "ms between OTLP metric exports"),
    "OTEL_RESOURCE_ATTRIBUTES": (None, "`key=value,...` added to every exported resource"),
    "OTEL_SPAN_LINK_COUNT_LIMIT": (None, "links on a window's span (its candidate requests); past it the links "
                                   "to the smallest shares are dropped and counted, their cost kept by feature"),
    "OTEL_SERVICE_NAME": (None, "`service.name` of the collector's own metrics (a traced process's own "
                          "variable names that process)"),
    "OTEL_TRACES_SAMPLER": ("`parentbased_always_on`", "which traces go out over OTLP, by the OpenTelemetry "
                            "names: `always_on`, `always_off`, `traceidratio`, `parentbased_always_on`, "
                            "`parentbased_always_off`, `parentbased_traceidratio`"),
    "OTEL_TRACES_SAMPLER_ARG": (None, "the ratio, for the `traceidratio` samplers"),
}

# Flags whose default the loader computes, or whose unset value means something: in words.
FLAG_DEFAULTS = {
    "pid": "all processes", "exe": "all processes",
    "console": "on when no OTLP endpoint is set", "store": "on when no OTLP endpoint is set",
    "feature_header": "`http.route`", "prometheus_port": "off", "store_group": "root only, 0600/0700",
    "stream_rate": "5000, times the ratio of a traceidratio sampler, at least 100",
}


class _Recorded(dict):
    """An empty environment that remembers every OTEL_* variable looked up in it."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def _saw(self, key) -> None:
        if isinstance(key, str) and key.startswith("OTEL_") and key not in self.names:
            self.names.append(key)

    def get(self, key, default=None):
        self._saw(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self._saw(key)
        return super().__getitem__(key)

    def __contains__(self, key) -> bool:
        self._saw(key)
        return super().__contains__(key)


NO_DEFAULT = object()  # read with no default (a list, or a value the loader computes)


def loader_reads() -> tuple[list[str], dict[str, tuple[Optional[str], object]]]:
    """What load_config reads when no flag and no variable is set: every OTEL_* variable,
    in order, and for each one read through _Sources, (its flag's dest or None, the
    default it falls back to, or NO_DEFAULT)."""
    seen: dict[str, tuple[Optional[str], object]] = {}
    plain = config_loader._Sources

    class Recording(plain):
        def raw(self, dest, var):
            seen.setdefault(var, (dest, NO_DEFAULT))
            return plain.raw(self, dest, var)

        def text(self, dest, var, default):
            seen.setdefault(var, (dest, default))
            return plain.text(self, dest, var, default)

        def integer(self, dest, var, default, minimum: int = 1):
            seen.setdefault(var, (dest, default))
            return plain.integer(self, dest, var, default, minimum)

        def boolean(self, dest, var, default: bool = False):
            seen.setdefault(var, (dest, default))
            return plain.boolean(self, dest, var, default)

        def names(self, dest, var):
            seen.setdefault(var, (dest, NO_DEFAULT))
            return plain.names(self, dest, var)

    parser = argparse.ArgumentParser()
    config_loader.add_run_arguments(parser)
    env = _Recorded()
    config_loader._Sources = Recording  # the loader builds its sources from this name at each call
    try:
        config_loader.load_config(parser.parse_args([]), env)
    finally:
        config_loader._Sources = plain
    return env.names, seen


def run_flags() -> list[tuple[str, list]]:
    """The `run` command's flags as cli.py defines them: [(dest, [argparse actions])]."""
    from ..cli import _run_parser
    sub = argparse.ArgumentParser().add_subparsers()
    _run_parser(sub)
    groups: dict[str, list] = {}
    for action in sub.choices["run"]._actions:
        if action.option_strings and action.dest != "help":
            groups.setdefault(action.dest, []).append(action)
    return list(groups.items())


def help_without(text: str, var: Optional[str]) -> tuple[str, list[str]]:
    """A flag's help less what the table's own columns say: the variable's name and the
    "default ..." parts of the parentheses that name it (returned, for the test)."""
    defaults: list[str] = []

    def strip(m) -> str:
        parts = [p.strip() for p in m.group(1).split(";")]
        if not any(p == var or p.startswith((f"{var}=", "default")) for p in parts):
            return m.group(0)
        defaults.extend(re.sub(r"^default:?\s*", "", p) for p in parts if p.startswith("default"))
        kept = [p for p in parts if not (p == var or p.startswith(f"{var}=") or p.startswith("default"))]
        return f" ({'; '.join(kept)})" if kept else ""
    return re.sub(r"\s*\(([^()]*)\)", strip, text).strip(), defaults


def _shown(value) -> str:
    if value is None or value is NO_DEFAULT:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"`{value}`" if str(value) else "`''`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def flag_rows() -> list[tuple[str, str, Optional[str], str, str, list[str]]]:
    """(dest, flags, variable, default, help, the defaults the help's parentheses stated)."""
    names, seen = loader_reads()
    by_dest = {dest: var for var, (dest, _) in seen.items() if dest}
    rows = []
    for dest, actions in run_flags():
        flags = ", ".join(f"`{s}`" for a in actions for s in a.option_strings if s.startswith("--"))
        var = by_dest.get(dest) or next((v for v in names if any(v in (a.help or "") for a in actions)), None)
        if dest in FLAG_DEFAULTS:
            default = FLAG_DEFAULTS[dest]
        elif var in seen:
            default = "none" if seen[var][1] is NO_DEFAULT else _shown(seen[var][1])
        else:
            default = _shown(actions[0].default)
        helps, stated = [], []
        for i, a in enumerate(a for a in actions if a.help):
            text, said = help_without(a.help, var)
            helps.append(text if i == 0 else f"`{a.option_strings[0]}`: {text}")
            stated += said
        rows.append((dest, flags, var, default, "; ".join(helps), stated))
    return rows


def env_rows() -> list[tuple[str, str, str]]:
    """(variable, default, meaning) for every variable no flag sets, by name."""
    names, seen = loader_reads()
    claimed = {row[2] for row in flag_rows()}
    rows = []
    for var in sorted((set(names) | set(ENV_ONLY)) - claimed):
        declared, meaning = ENV_ONLY[var]
        loaded = seen.get(var, (None, NO_DEFAULT))[1]
        rows.append((var, declared or _shown(loaded), meaning))
    return rows


def markdown() -> str:
    """docs/configuration.md (`python -m otel_gpu.docgen.configuration`)."""
    lines = [
        "# Configuration",
        "",
        "Every setting of `otel-gpu run`; `otel-gpu compile` takes the same flags except `--ebpf`.",
        "Generated from `otel_gpu/config_loader.py` (`python -m otel_gpu.docgen.configuration > docs/configuration.md`;",
        "`tests/unit/test_docs.py` fails when this page and the code differ).",
        "",
        "A flag wins over its variable (a repeated flag such as `--route` replaces the variable's",
        "list). Every setting is checked at start: a bad one is one line naming it, and exit",
        "status 2. The variable of an on/off flag takes `true` or `false`. `otel_gpu/config_loader.py`",
        "is the only reader of these settings (`otel_gpu/config.py` checks them). What they do in depth:",
        "[configuration notes](configuration-notes.md).",
        "",
        "## Flags",
        "",
        "| flag | variable | default | meaning |",
        "|---|---|---|---|",
    ]
    for _, flags, var, default, text, _ in flag_rows():
        lines.append(f"| {flags} | {f'`{var}`' if var else ''} | {default} | {_cell(text)} |")
    lines += ["", "## Environment only", "",
              "No flag sets these. The loader reads them, except where the meaning says the SDK does.", "",
              "| variable | default | meaning |", "|---|---|---|"]
    lines += [f"| `{var}` | {default} | {_cell(meaning)} |" for var, default, meaning in env_rows()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
