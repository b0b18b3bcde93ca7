"""Builds libotel_gpu_cupti.so, the CUPTI injection library of device-clock mode, and
libfake_cupti.so, the fake CUPTI its tests drive, with gcc against one CUPTI header set.

The library dlopens libcupti at run time, so it has no link-time dependency on it; the headers
only fix the record structs it reads, whose fields it uses sit at the same offsets in CUPTI 12
and 13 (asserted at compile time in otel_gpu_cupti.c)."""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

SOURCES = Path(__file__).resolve().parents[2] / "cupti"  # beside bpf/: C that is not Python's
LIBRARY_SOURCES = (SOURCES / "otel_gpu_cupti.c", SOURCES / "device_record.h", SOURCES / "record_versions.h")
FAKE_SOURCES = (SOURCES / "fake" / "fake_cupti.c", SOURCES / "record_versions.h")
CUDA_INCLUDE = Path("/usr/local/cuda/include")
# No -Bsymbolic, no -fno-semantic-interposition: the library must call otel_gpu_device_records
# through its PLT, so that a test executable defining the symbol sees every call.
CFLAGS = ("-std=c11", "-O2", "-fPIC", "-shared", "-Wall", "-Wextra", "-pthread")


def _in_wheels(header: str) -> Path | None:
    """The include directory of an NVIDIA wheel (nvidia/<package>/include: nvidia-cuda-cupti,
    nvidia-cuda-runtime; CUDA 13's nvidia/cu13/include) on this Python's path holding `header`."""
    paths = sysconfig.get_paths()
    for site in dict.fromkeys((paths["purelib"], paths["platlib"], *sys.path)):
        for found in sorted(glob.glob(f"{glob.escape(site)}/nvidia/*/include/{header}")):
            return Path(found[:-len(header) - 1])
    return None


def headers() -> Path | None:
    """The CUPTI include directory: $OTEL_GPU_CUPTI_INCLUDE, else the CUDA toolkit's, else an
    NVIDIA wheel's on this Python's path (PyTorch's CUDA wheels bring nvidia-cuda-cupti); None
    when there is none."""
    if env := os.environ.get("OTEL_GPU_CUPTI_INCLUDE"):
        return Path(env)
    if (CUDA_INCLUDE / "cupti.h").is_file():
        return CUDA_INCLUDE
    return _in_wheels("cupti.h")


def _include_dirs() -> list[Path]:
    """The CUPTI headers first, then the CUDA headers they include (cuda.h, builtin_types.h,
    crt/), which the CUPTI wheel does not ship: $OTEL_GPU_CUDA_INCLUDE, the toolkit's, or the
    nvidia-cuda-runtime and nvidia-cuda-nvcc wheels'."""
    cupti = headers()
    if cupti is None:
        raise RuntimeError(f"CUPTI headers not found: no cupti.h in {CUDA_INCLUDE} nor in an nvidia-cuda-cupti"
                           " wheel; install the CUDA toolkit or nvidia-cuda-cupti-cu12, or set OTEL_GPU_CUPTI_INCLUDE")
    if not (cupti / "cupti.h").is_file():
        raise RuntimeError(f"OTEL_GPU_CUPTI_INCLUDE={cupti} holds no cupti.h")
    if (cupti / "cuda.h").is_file():
        return [cupti]
    cuda = Path(os.environ.get("OTEL_GPU_CUDA_INCLUDE", CUDA_INCLUDE))
    if (cuda / "cuda.h").is_file():
        return [cupti, cuda]
    runtime, crt = _in_wheels("cuda.h"), _in_wheels("crt/host_defines.h")  # the latter: nvidia-cuda-nvcc's
    if runtime is None or crt is None:
        raise RuntimeError(f"cuda.h and crt/host_defines.h, which {cupti / 'cupti.h'} includes, are not in {cuda}"
                           " nor in the nvidia-cuda-runtime and nvidia-cuda-nvcc wheels; set OTEL_GPU_CUDA_INCLUDE"
                           " to a CUDA toolkit's include directory")
    return [cupti, runtime, crt]


def _compile(sources: tuple[Path, ...], output: Path, libs: tuple[str, ...] = ()) -> Path:
    """Compiles the .c files of `sources` into the shared library `output`, unless it is newer
    than all of them (and this file, which holds the flags). The headers are not compared: use
    one output directory per CUPTI header set."""
    newest = max(p.stat().st_mtime for p in (*sources, Path(__file__)))
    if output.exists() and output.stat().st_mtime >= newest:
        return output
    gcc = shutil.which("gcc")
    if gcc is None:
        raise RuntimeError(f"gcc not found on PATH; it builds {output.name}")
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(f".{output.name}.{os.getpid()}")  # never a half-written library
    command = [gcc, *CFLAGS, *(f"-I{d}" for d in _include_dirs()), "-o", str(partial),
               *(str(s) for s in sources if s.suffix == ".c"), *libs]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"building {output.name} failed:\n{' '.join(command)}\n{done.stderr}")
    partial.replace(output)
    return output


def build(out_dir: Path) -> Path:
    """libotel_gpu_cupti.so in out_dir."""
    return _compile(LIBRARY_SOURCES, Path(out_dir) / "libotel_gpu_cupti.so", ("-ldl",))


def build_fake(out_dir: Path) -> Path:
    """libfake_cupti.so, the fake CUPTI of the tests, in out_dir."""
    return _compile(FAKE_SOURCES, Path(out_dir) / "libfake_cupti.so")
