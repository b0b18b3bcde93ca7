"""The package's layout is its data flow: the imports of otel_gpu/ (read from the source,
every `import` and `from ... import` wherever it stands, lazy ones too) form no cycle,
and none runs back up the flow

    probes -> kernel_io -> pipeline -> enrich -> export

(a stage may import the stages before it, never one after it). The foundation modules,
which every stage reads (settings, the records and the call table, /proc), import only
each other; the top (wiring, collector, CLI) is imported by nothing below it."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "otel_gpu"
FLOW = ("otel_gpu.probes", "otel_gpu.kernel_io", "otel_gpu.pipeline", "otel_gpu.enrich", "otel_gpu.export")
FOUNDATION = {"otel_gpu", "otel_gpu.config", "otel_gpu.cuda_calls", "otel_gpu.records", "otel_gpu.proc",
              "otel_gpu.ratelimit", "otel_gpu.semconv", "otel_gpu.sanitize", "otel_gpu.clock", "otel_gpu.sockets",
              "otel_gpu.value_cap", "otel_gpu.gpu_devices", "otel_gpu.amd_gpus", "otel_gpu.span_tree"}
TOP = {"otel_gpu.wiring", "otel_gpu.collector", "otel_gpu.cli", "otel_gpu.config_loader", "otel_gpu.docgen",
       "otel_gpu.demo"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def imports(name: str) -> set[str]:
    """The otel_gpu modules `name` imports: `from pkg import sub` names the submodule, not
    the package (whose __init__ is already importing when a submodule imports a sibling)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in MODULES}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            subs = {f"{module}.{a.name}" for a in node.names} & MODULES.keys()
            out |= subs
            if module in MODULES and len(subs) < len(node.names):
                out.add(module)
    return out - {name}


GRAPH = {name: imports(name) for name in MODULES}


def area(name: str) -> str:
    """The flow stage, foundation module or top module `name` belongs to."""
    for group in (*FLOW, *TOP):
        if name == group or name.startswith(group + "."):
            return group
    return name


def test_no_module_imports_itself_round_a_cycle():
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))
    for v in GRAPH:
        if v not in index:
            visit(v)
    assert not cycles, cycles


@pytest.mark.parametrize("stage", FLOW)
def test_no_import_runs_back_up_the_flow(stage):
    later = FLOW[FLOW.index(stage) + 1:]
    wrong = sorted((m, d) for m, deps in GRAPH.items() if area(m) == stage for d in deps if area(d) in later)
    assert not wrong, f"{stage} imports stages after it: {wrong}"


def test_the_foundation_imports_only_the_foundation():
    wrong = sorted((m, d) for m in FOUNDATION for d in GRAPH[m] if d not in FOUNDATION)
    assert not wrong, wrong


def test_nothing_below_the_top_imports_it():
    wrong = sorted((m, d) for m, deps in GRAPH.items() if area(m) not in TOP for d in deps if area(d) in TOP)
    assert not wrong, wrong


def test_the_graph_is_read_from_real_imports():
    """The checks can fail: known edges are there, and a planted back edge is caught."""
    assert "otel_gpu.records" in GRAPH["otel_gpu.kernel_io.decode"]
    assert "otel_gpu.kernel_io.abi" in GRAPH["otel_gpu.kernel_io.decode"]
    assert "otel_gpu.pipeline.model" in GRAPH["otel_gpu.enrich.stage"]
    assert area("otel_gpu.pipeline.stitcher") == "otel_gpu.pipeline" and area("otel_gpu.cli") == "otel_gpu.cli"
    GRAPH["otel_gpu.probes.source"].add("otel_gpu.pipeline.model")
    try:
        with pytest.raises(AssertionError):
            test_no_import_runs_back_up_the_flow("otel_gpu.probes")
    finally:
        GRAPH["otel_gpu.probes.source"].discard("otel_gpu.pipeline.model")
