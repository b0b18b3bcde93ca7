"""bpf/events.h vs its ctypes mirror: a tiny C program compiled against the header
(with -Wpadded -Werror, so implicit padding fails the build) prints every sizeof,
offsetof and enum value; each must match otel_gpu/pipeline/events.py."""
import ctypes as ct
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from otel_gpu.pipeline import events as ev

ROOT = Path(__file__).resolve().parents[2]
HEADER = ROOT / "bpf" / "events.h"

STRUCTS = {
    "event_header": ev.EventHeader,
    "accept_event": ev.AcceptEvent,
    "sock_io_event": ev.SockIoEvent,
    "close_event": ev.CloseEvent,
    "cuda_event": ev.CudaEvent,
    "proc_exit_event": ev.ProcExitEvent,
    "rollup_key": ev.RollupKey,
    "rollup_value": ev.RollupValue,
}
MACROS = ("HTTP_DATA_CAP", "HTTP_TAIL_CAP")


def header_enum_members() -> list[str]:
    text = re.sub(r"/\*.*?\*/", "", HEADER.read_text(), flags=re.S)
    members = []
    for body in re.findall(r"enum\s+\w+\s*\{(.*?)\}", text, flags=re.S):
        members += [m.group(1) for m in re.finditer(r"\b([A-Z][A-Z0-9_]*)\s*(?:=|,|$)", body)]
    return members


def c_program() -> str:
    out = ['#include <stddef.h>', '#include <stdio.h>', '#include "events.h"', "int main(void) {"]
    for cname, cls in STRUCTS.items():
        out.append(f'  printf("size {cname} %zu\\n", sizeof(struct {cname}));')
        for fname, _ in cls._fields_:
            out.append(f'  printf("field {cname}.{fname} %zu %zu\\n", offsetof(struct {cname}, {fname}),'
                       f' sizeof(((struct {cname} *)0)->{fname}));')
    for name in header_enum_members() + list(MACROS):
        out.append(f'  printf("value {name} %lld\\n", (long long){name});')
    out += ["  return 0;", "}"]
    return "\n".join(out)


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory):
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed: cannot compile bpf/events.h for the layout check")
    d = tmp_path_factory.mktemp("layout")
    (d / "layout.c").write_text(c_program())
    build = subprocess.run([gcc, "-std=c11", "-Wall", "-Wextra", "-Wpadded", "-Werror",
                            f"-I{HEADER.parent}", "-o", str(d / "layout"), str(d / "layout.c")],
                           capture_output=True, text=True)
    assert build.returncode == 0, f"events.h does not compile cleanly with -Wpadded:\n{build.stderr}"
    run = subprocess.run([str(d / "layout")], capture_output=True, text=True, check=True)
    sizes, fields, values = {}, {}, {}
    for line in run.stdout.splitlines():
        kind, name, *nums = line.split()
        nums = [int(n) for n in nums]
        {"size": sizes, "field": fields, "value": values}[kind][name] = nums if kind == "field" else nums[0]
    return sizes, fields, values


@pytest.mark.parametrize("cname", STRUCTS)
def test_struct_layout_matches(c_layout, cname):
    sizes, fields, _ = c_layout
    cls = STRUCTS[cname]
    assert ct.sizeof(cls) == sizes[cname]
    for fname, _ in cls._fields_:
        f = getattr(cls, fname)
        assert [f.offset, f.size] == fields[f"{cname}.{fname}"], f"{cname}.{fname}"
    # -Wpadded rules out implicit padding in C, so equal sums mean no C field is unmirrored.
    assert sum(getattr(cls, n).size for n, _ in cls._fields_) == sizes[cname]


def test_nested_header_matches(c_layout):
    _, fields, _ = c_layout
    for cname, cls in STRUCTS.items():
        if cls._fields_[0][0] == "h":
            assert fields[f"{cname}.h"] == [0, ct.sizeof(ev.EventHeader)]


def test_record_kind_is_the_first_byte(c_layout):
    _, fields, _ = c_layout
    assert fields["event_header.kind"] == [0, 1]


def test_enum_values_match(c_layout):
    _, _, values = c_layout
    py_consts = {k: v for k, v in vars(ev).items()
                 if re.fullmatch(r"(EV|CALL|CNT)_[A-Z0-9_]+", k) and isinstance(v, int)}
    c_only = {"CALL_MAX", "CNT_MAX"}
    c_enums = {k: v for k, v in values.items() if k not in MACROS}
    assert set(c_enums) - c_only == set(py_consts), "enum members differ between C and Python"
    for name, value in py_consts.items():
        assert c_enums[name] == value, name
    assert c_enums["CALL_MAX"] == max(ev.CALL_NAMES) + 1
    assert set(ev.CALL_NAMES) == set(range(1, c_enums["CALL_MAX"]))
    assert c_enums["CNT_MAX"] == len(ev.COUNTER_NAMES)


def test_caps_match(c_layout):
    _, _, values = c_layout
    assert values["HTTP_DATA_CAP"] == ev.HTTP_DATA_CAP
    assert values["HTTP_TAIL_CAP"] == ev.HTTP_TAIL_CAP
    assert ev.SockIoEvent.data.size == ev.HTTP_DATA_CAP and ev.SockIoEvent.tail.size == ev.HTTP_TAIL_CAP


def test_padding_warning_is_effective(tmp_path):
    """The -Wpadded build really rejects implicit padding (guards the check itself)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed")
    src = tmp_path / "bad.c"
    src.write_text("#include <stdint.h>\nstruct bad { uint8_t a; uint64_t b; };\n"
                   "int main(void) { struct bad x = {0}; return (int)x.a; }\n")
    r = subprocess.run([gcc, "-Wpadded", "-Werror", "-o", str(tmp_path / "bad"), str(src)],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "padding" in r.stderr
