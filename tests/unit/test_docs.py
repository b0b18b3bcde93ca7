"""The generated pages of docs/ are what the code generates, and the generators miss
nothing: docs/configuration.md from otel_gpu/config_loader.py (the `run` parser and the loader),
docs/attributes.md from otel_gpu/semconv.py. docs/attribution.md has its own test
(tests/unit/pipeline/test_rules.py)."""
import argparse
import difflib
import re
from pathlib import Path

import pytest

from otel_gpu import config_loader as config
from otel_gpu.docgen import attributes as attributes_doc
from otel_gpu.docgen import configuration as configuration_doc

ROOT = Path(__file__).resolve().parents[2]

GENERATED = {
    "docs/configuration.md": ("otel_gpu.docgen.configuration", configuration_doc.markdown),
    "docs/attributes.md": ("otel_gpu.docgen.attributes", attributes_doc.markdown),
}


@pytest.mark.parametrize("page", sorted(GENERATED))
def test_the_generated_page_equals_the_code(page):
    module, generate = GENERATED[page]
    path = ROOT / page
    committed = path.read_text() if path.exists() else ""
    expected = generate()
    if committed != expected:
        diff = "\n".join(list(difflib.unified_diff(committed.splitlines(), expected.splitlines(),
                                                   f"{page} (committed)", f"{page} (from the code)",
                                                   lineterm=""))[:40])
        pytest.fail(f"{page} differs from the code. Regenerate it:\n"
                    f"    .venv/bin/python -m {module} > {page}\n{diff}", pytrace=False)


# --- docs/configuration.md misses no setting ----------------------------------------------

def _loader_source() -> str:
    return (ROOT / "otel_gpu" / "config_loader.py").read_text()


def test_every_variable_the_loader_names_is_documented():
    named = set(re.findall(r'"(OTEL_[A-Z_]+)"', _loader_source()))
    documented = {row[2] for row in configuration_doc.flag_rows() if row[2]} | {var for var, _, _ in configuration_doc.env_rows()}
    assert named <= documented, f"not in docs/configuration.md: {sorted(named - documented)}"


def test_every_variable_no_flag_sets_has_a_meaning():
    names, _ = configuration_doc.loader_reads()
    claimed = {row[2] for row in configuration_doc.flag_rows()}
    missing = set(names) - claimed - set(configuration_doc.ENV_ONLY)
    assert not missing, f"add {sorted(missing)} to ENV_ONLY in otel_gpu/docgen/configuration.py"


def test_env_only_declares_a_default_only_where_the_loader_has_none():
    _, seen = configuration_doc.loader_reads()
    for var, (declared, _) in configuration_doc.ENV_ONLY.items():
        loaded = seen.get(var, (None, configuration_doc.NO_DEFAULT))[1]
        if declared is not None:
            assert loaded is None or loaded is configuration_doc.NO_DEFAULT, \
                f"{var}: the loader's default is {loaded!r}; ENV_ONLY must not declare {declared!r}"


def test_a_flags_help_names_its_own_variable_and_default():
    helps = {dest: " ".join(a.help or "" for a in actions) for dest, actions in configuration_doc.run_flags()}
    for dest, flags, var, default, _, stated in configuration_doc.flag_rows():
        help_text = helps[dest]
        assert set(re.findall(r"OTEL_[A-Z_]+", help_text)) <= {var}, f"{flags}: help names another variable"
        for value in stated:
            assert value in default.replace("`", ""), f"{flags}: help says default {value!r}, loader {default!r}"


# Values a test may set each text setting to (numbers and on/off flags need none).
SAMPLES = {
    "route": "/v1/models/{model}/infer", "export_header": "x-tenant", "gpu_price": "2.5", "currency": "EUR",
    "feature_header": "x-feature", "prometheus_addr": "0.0.0.0", "store": "/tmp/otel-gpu-docs-test.db",
    "store_group": "0", "status_file": "/tmp/otel-gpu-docs-test.json", "bpf_cache": "/tmp/otel-gpu-docs-test",
    "log_level": "debug", "uprobe_links": "perf",
}


def _parse(argv):
    p = argparse.ArgumentParser()
    config.add_run_arguments(p)
    return p.parse_args(argv)


def test_each_flags_variable_sets_what_the_flag_sets():
    """The variable column is the loader's: setting the variable gives the config the flag gives."""
    base = config.load_config(_parse([]), {})
    checked = 0
    variables = {row[0]: row[2] for row in configuration_doc.flag_rows()}
    for dest, actions in configuration_doc.run_flags():
        var = variables[dest]
        if var is None:
            continue
        if all(a.nargs == 0 for a in actions):  # on/off flags
            flip = next(a for a in actions if a.const != getattr(base, dest, a.default) and a.const is not None
                        and isinstance(a.const, bool))
            argv, value = [flip.option_strings[0]], "true" if flip.const else "false"
        elif actions[0].type is int:
            argv, value = [actions[0].option_strings[0], "16"], "16"
        else:
            assert dest in SAMPLES, f"add a sample value for --{dest.replace('_', '-')} to SAMPLES in this test"
            argv, value = [actions[0].option_strings[0], SAMPLES[dest]], SAMPLES[dest]
        by_flag = config.load_config(_parse(argv), {})
        by_var = config.load_config(_parse([]), {var: value})
        assert by_flag == by_var != base, f"{var} does not set what {argv[0]} sets"
        checked += 1
    assert checked >= 20
