"""bpf/events.h vs its ctypes mirror: a tiny C program compiled against the header
(with -Wpadded -Werror, so implicit padding fails the build; the generated CALL_*
ids prepended as the loader does) prints every sizeof, offsetof and constant; each
must match otel_gpu/kernel_io/abi.py, cuda_calls.py and the decoder's Structs."""
import ctypes as ct
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from otel_gpu.kernel_io import abi, decode
from otel_gpu import records
from otel_gpu import cuda_calls as table

ROOT = Path(__file__).resolve().parents[2]
HEADER = ROOT / "bpf" / "events.h"
PROBES = ROOT / "bpf" / "cuda_probes.c"
MACROS = ("HTTP_DATA_CAP", "HTTP_TAIL_CAP", "KERNEL_NAME_CAP", "CALL_MAX", "H2_DIGEST_CAP", "H2_DIGEST_RECORDS",
          "H2_DIGEST_HEAD", "H2_PIECE_HEAD", "H2_STOP_ROOM", "H2_STOP_STEPS", "H2_STOP_IOVS", "H2_STOP_READ")
GCC = shutil.which("gcc")


def header_enum_members() -> list[str]:
    text = re.sub(r"/\*.*?\*/", "", HEADER.read_text(), flags=re.S)
    members = []
    for body in re.findall(r"enum\s+\w+\s*\{(.*?)\}", text, flags=re.S):
        members += [m.group(1) for m in re.finditer(r"\b([A-Z][A-Z0-9_]*)\s*(?:=|,|$)", body)]
    return members


def c_fields(cls) -> list[tuple[str, object]]:
    """(C member name, ctypes descriptor); an anonymous union's members stand for it."""
    out = []
    for fname, ftype in cls._fields_:
        if fname in getattr(cls, "_anonymous_", ()):
            base = getattr(cls, fname).offset
            out += [(sub, (base + getattr(ftype, sub).offset, getattr(ftype, sub).size))
                    for sub, _ in ftype._fields_]
        else:
            f = getattr(cls, fname)
            out.append((fname, (f.offset, f.size)))
    return out


def c_program() -> str:
    out = [table.c_defines(), '#include <stddef.h>', '#include <stdio.h>', '#include "events.h"',
           "int main(void) {"]
    for cname, cls in abi.STRUCTS.items():
        out.append(f'  printf("size {cname} %zu\\n", sizeof(struct {cname}));')
        for fname, _ in c_fields(cls):
            out.append(f'  printf("field {cname}.{fname} %zu %zu\\n", offsetof(struct {cname}, {fname}),'
                       f' sizeof(((struct {cname} *)0)->{fname}));')
    consts = header_enum_members() + list(MACROS) + [f"CALL_{c.const}" for c in table.CALLS]
    for name in consts:
        out.append(f'  printf("value {name} %lld\\n", (long long){name});')
    out += ["  return 0;", "}"]
    return "\n".join(out)


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory):
    if GCC is None:
        pytest.skip("gcc is not installed: cannot compile bpf/events.h for the layout check")
    d = tmp_path_factory.mktemp("layout")
    (d / "layout.c").write_text(c_program())
    build = subprocess.run([GCC, "-std=c11", "-Wall", "-Wextra", "-Wpadded", "-Werror",
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


@pytest.mark.parametrize("cname", abi.STRUCTS)
def test_struct_layout_matches(c_layout, cname):
    sizes, fields, _ = c_layout
    cls = abi.STRUCTS[cname]
    assert ct.sizeof(cls) == sizes[cname]
    for fname, at in c_fields(cls):
        assert list(at) == fields[f"{cname}.{fname}"], f"{cname}.{fname}"
    # -Wpadded rules out implicit padding in C, so equal sums mean no C field is unmirrored.
    assert sum(getattr(cls, n).size for n, _ in cls._fields_) == sizes[cname]


def test_every_record_starts_with_the_header(c_layout):
    _, fields, _ = c_layout
    assert fields["event_header.kind"] == [0, 1]
    for cname, cls in abi.STRUCTS.items():
        first = cls._fields_[0][0]
        if first in ("h", "c"):
            assert fields[f"{cname}.{first}"][0] == 0
    assert fields["cuda_header.h"] == [0, ct.sizeof(abi.EventHeader)]


def test_launch_config_offsets_are_the_cuda_abi(c_layout):
    """Both cudaLaunchConfig_t and CUlaunchConfig: shared memory at 24, stream at 32."""
    _, fields, _ = c_layout
    assert fields["user_launch_config.dynamic_smem_bytes"] == [24, 8]
    assert fields["user_launch_config.shared_mem_bytes"] == [24, 4]
    assert fields["user_launch_config.stream"] == [32, 8]


CUDA_INCLUDE = next((p for p in sorted(Path("/usr/local").glob("cuda*/include"))
                     if (p / "cuda.h").exists()), None)


@pytest.mark.skipif(GCC is None or CUDA_INCLUDE is None, reason="needs gcc and a CUDA toolkit")
def test_launch_config_against_the_cuda_headers(tmp_path):
    checks = [("CUlaunchConfig", "sharedMemBytes", "shared_mem_bytes"), ("CUlaunchConfig", "hStream", "stream"),
              ("cudaLaunchConfig_t", "dynamicSmemBytes", "dynamic_smem_bytes"),
              ("cudaLaunchConfig_t", "stream", "stream")]
    src = ["#include <stddef.h>", "#include <cuda.h>", "#include <cuda_runtime_api.h>", '#include "events.h"']
    src += [f"_Static_assert(offsetof({t}, {f}) == offsetof(struct user_launch_config, {ours}), "
            f'"{t}.{f}");' for t, f, ours in checks]
    (tmp_path / "cfg.c").write_text("\n".join(src) + "\nint main(void) { return 0; }\n")
    r = subprocess.run([GCC, "-std=c11", f"-I{CUDA_INCLUDE}", f"-I{HEADER.parent}", "-o",
                        str(tmp_path / "cfg"), str(tmp_path / "cfg.c")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_enum_values_match(c_layout):
    _, _, values = c_layout
    py_consts = {k: v for k, v in vars(abi).items()
                 if re.fullmatch(r"(EV|CNT|LIB)_[A-Z0-9_]+", k) and isinstance(v, int)}
    c_enums = {k: v for k, v in values.items() if not k.startswith(("CALL_", "TIME_")) and k not in MACROS}
    assert set(c_enums) - {"CNT_MAX"} == set(py_consts), "enum members differ between C and Python"
    for name, value in py_consts.items():
        assert c_enums[name] == value, name
    assert c_enums["CNT_MAX"] == len(abi.COUNTER_NAMES)
    assert (records.EV_SOCK_READ, records.EV_SOCK_WRITE) == (abi.EV_SOCK_READ, abi.EV_SOCK_WRITE)


def test_time_parts_are_in_the_same_order(c_layout):
    """bpf/events.h enum time_part indexes sock_io_event.times as pipeline/time_split.py PARTS."""
    from otel_gpu.pipeline.time_split import PARTS
    _, _, values = c_layout
    assert values["TIME_PARTS"] == abi.TIME_PARTS == len(PARTS)
    assert [values[f"TIME_{part.upper()}"] for part in PARTS] == list(range(len(PARTS)))


def test_call_ids_come_from_the_table(c_layout):
    _, _, values = c_layout
    for c in table.CALLS:
        assert values[f"CALL_{c.const}"] == c.id, c.name
    assert values["CALL_MAX"] == table.CALL_MAX
    assert "enum cuda_call" not in HEADER.read_text()


def test_every_table_handler_exists_in_cuda_probes():
    text = "".join(p.read_text() for p in sorted(HEADER.parent.glob("*.c")))  # nccl_probes.c too
    defined = set(re.findall(r"^int\s+(\w+)\s*\(\s*struct pt_regs \*ctx\s*\)", text, flags=re.M))
    named = {c.entry for c in table.CALLS} | {c.ret for c in table.CALLS if c.ret}
    assert named <= defined, f"handlers named in cuda_calls.py but not in bpf/cuda_probes.c: {named - defined}"


@pytest.mark.parametrize("s,mirror", decode.STRUCT_MIRRORS, ids=lambda x: getattr(x, "__name__", ""))
def test_decoder_structs_match_their_mirrors(s, mirror):
    assert s.size == ct.sizeof(mirror)


def test_every_cuda_shape_has_a_struct():
    mirrored = {m for _, m in decode.STRUCT_MIRRORS}
    cuda = {cls for cls in abi.STRUCTS.values() if cls._fields_[0][1] is abi.CudaHeader}
    assert mirrored == cuda | {abi.PyContextEvent, abi.GoH2Event, abi.DeviceRecord}


def test_python_context_fields(c_layout):
    """ctx is in every CUDA record (through cuda_header) and in socket records; the
    py_procs value the collector writes is the one the probes read."""
    _, fields, _ = c_layout
    assert fields["cuda_header.ctx"] == [32, 8]
    assert fields["sock_io_event.ctx"][1] == 8
    assert fields["py_context_event.ctx"] == [24, 8] and fields["py_context_event.parent"] == [32, 8]
    assert [fields[f"py_proc.{name}"] for name in ("main_interp", "threads_head", "thread_id", "context_offset")] \
        == [[0, 8], [8, 4], [12, 4], [16, 4]]


def test_caps_match(c_layout):
    _, _, values = c_layout
    assert values["HTTP_DATA_CAP"] == abi.HTTP_DATA_CAP
    assert values["HTTP_TAIL_CAP"] == abi.HTTP_TAIL_CAP
    assert abi.SockIoEvent.data.size == abi.HTTP_DATA_CAP and abi.SockIoEvent.tail.size == abi.HTTP_TAIL_CAP
    assert values["KERNEL_NAME_CAP"] == abi.KERNEL_NAME_CAP == abi.KernelHandleEvent.name.size
    assert abi.KERNEL_NAME_CAP & (abi.KERNEL_NAME_CAP - 1) == 0  # the probe masks lengths with CAP - 1
    for name in MACROS[4:]:  # the HTTP/2 digest's shape (bpf/h2_walk.c)
        assert values[name] == getattr(abi, name), name
    assert abi.H2_DIGEST_CAP & (abi.H2_DIGEST_CAP - 1) == 0 and abi.H2_DIGEST_CAP >= abi.HTTP_DATA_CAP


def test_padding_warning_is_effective(tmp_path):
    """The -Wpadded build really rejects implicit padding (guards the check itself)."""
    if GCC is None:
        pytest.skip("gcc is not installed")
    src = tmp_path / "bad.c"
    src.write_text("#include <stdint.h>\nstruct bad { uint8_t a; uint64_t b; };\n"
                   "int main(void) { struct bad x = {0}; return (int)x.a; }\n")
    r = subprocess.run([GCC, "-Wpadded", "-Werror", "-o", str(tmp_path / "bad"), str(src)],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "padding" in r.stderr
