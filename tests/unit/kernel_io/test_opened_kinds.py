"""The `loaded` table's bits (bpf/library_probes.c, abi.LIB_*) name the kinds of file
discovery finds mapped: each bit one kind, so the collector scans an opening process until it
maps a file of that kind (collector.py _settle)."""
from otel_gpu.kernel_io import abi
from otel_gpu.kernel_io.program import OPENED_KINDS
from otel_gpu.probes.discovery import libraries_in_maps, libssl_in_maps
from otel_gpu.cuda_calls import TLS

# One mapped file of each library the open watch flags, as /proc/<pid>/maps lists it.
MAPS = "\n".join(f"7f0000000000-7f0000001000 r-xp 00000000 08:01 {i} {path}" for i, path in enumerate((
    "/usr/lib/libcudart.so.12", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/opt/conda/lib/libnccl.so.2",
    "/opt/rocm/lib/librccl.so.1", "/usr/lib/x86_64-linux-gnu/libamdhip64.so.5",
    "/opt/otel-gpu/libotel_gpu_cupti.so", "/usr/lib/x86_64-linux-gnu/libssl.so.3")))


def test_every_bit_has_one_kind():
    bits = {v for k, v in vars(abi).items() if k.startswith("LIB_")}
    assert set(OPENED_KINDS) == bits
    assert all(b & (b - 1) == 0 for b in bits)  # one bit each
    assert len(set(OPENED_KINDS.values())) == len(bits)


def test_each_kind_is_one_discovery_finds_mapped():
    found = {kind for kind, _path in libraries_in_maps(MAPS)} | ({TLS} if libssl_in_maps(MAPS) else set())
    assert set(OPENED_KINDS.values()) == found
