"""Real libcudart calls from Python (ctypes), used by the demo service and the tests'
target processes. Without a GPU every call returns 35 (insufficient driver); the
probes see the same arguments either way."""
from __future__ import annotations

import ctypes as ct
import glob
import os
import subprocess
import tempfile
from pathlib import Path

H2D, D2H = 1, 2  # cudaMemcpyKind
KERNELS = {
    "matmul_tile": "_Z11matmul_tilePKfS0_Pfi",
    "softmax": "_Z14softmax_kernelPfi",
    "layernorm": "_Z16layernorm_kernelPKfPfi",
    "embed_gather": "_Z12embed_gatherPKiPKfPfi",
}


def find_cudart() -> str:
    """OTEL_GPU_CUDART, the nvidia-cuda-runtime wheel, then the CUDA toolkit."""
    env = os.environ.get("OTEL_GPU_CUDART")
    if env:
        return env
    try:
        import nvidia.cuda_runtime as wheel
        for base in list(getattr(wheel, "__path__", [])):
            hits = sorted(glob.glob(f"{base}/lib/libcudart.so*"))
            if hits:
                return hits[0]
    except ImportError:
        pass
    for pattern in ("/usr/local/cuda/lib64/libcudart.so*", "/usr/local/cuda-*/lib64/libcudart.so*"):
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[0]
    raise FileNotFoundError("no libcudart found: pip install nvidia-cuda-runtime-cu12 or set OTEL_GPU_CUDART")


def kernels_library() -> str:
    """Builds kernels.c into a shared library once per source version (gcc)."""
    src = Path(__file__).with_name("kernels.c")
    out = Path(tempfile.gettempdir()) / f"otel-gpu-demo-kernels-{int(src.stat().st_mtime)}.so"
    if not out.exists():
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(tmp), str(src)], check=True)
        os.replace(tmp, out)
    return str(out)


class Dim3(ct.Structure):
    _fields_ = [("x", ct.c_uint), ("y", ct.c_uint), ("z", ct.c_uint)]


class CudaWork:
    def __init__(self, cudart_path: str | None = None) -> None:
        self.path = cudart_path or find_cudart()
        self.rt = ct.CDLL(self.path)
        self.kernels = ct.CDLL(kernels_library())
        rt = self.rt
        rt.cudaLaunchKernel.argtypes = [ct.c_void_p, Dim3, Dim3, ct.c_void_p, ct.c_size_t, ct.c_void_p]
        rt.cudaMemcpy.argtypes = [ct.c_void_p, ct.c_void_p, ct.c_size_t, ct.c_int]
        self._host = ct.create_string_buffer(1 << 20)

    def kernel_address(self, name: str) -> int:
        return ct.cast(getattr(self.kernels, KERNELS.get(name, name)), ct.c_void_p).value

    def launch(self, kernel: str, grid=(1, 1, 1), block=(1, 1, 1), shmem: int = 0, stream: int = 0) -> int:
        return self.rt.cudaLaunchKernel(self.kernel_address(kernel), Dim3(*grid), Dim3(*block), None,
                                        shmem, stream)

    def memcpy(self, nbytes: int, kind: int) -> int:
        # Host buffer on both sides: harmless without a device.
        buf = self._host if nbytes <= len(self._host) else ct.create_string_buffer(nbytes)
        return self.rt.cudaMemcpy(buf, buf, nbytes, kind)

    def synchronize(self) -> int:
        return self.rt.cudaDeviceSynchronize()
