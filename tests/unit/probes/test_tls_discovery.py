"""The OpenSSL probes' discovery and table: which libssl files a traced process gets
probed (OpenSSL 3 and 1.1 only, never NSS's libssl3.so or the unversioned dev link),
only for CUDA processes, the system's file ahead of any process, and every handler the
table names defined in bpf/tls_probes.c."""
import re

from otel_gpu.probes.discovery import Discovery, known_library_files, libssl_in_maps
from otel_gpu.probes.source import bpf_dir
from otel_gpu.cuda_calls import TLS, rows_for
from tests.unit.pipeline.test_groups import CUDA_MAPS, Tree


def maps_line(path: str) -> str:
    return f"7f10-7f11 r-xp 0 08:01 99 {path}\n"


def test_libssl_in_maps_takes_openssl_3_and_1_1_only():
    text = "".join(maps_line(p) for p in (
        "/usr/lib/x86_64-linux-gnu/libssl.so.3", "/opt/app/lib/libssl.so.1.1",
        "/usr/lib/x86_64-linux-gnu/libssl.so.3",   # mapped several times: once
        "/usr/lib/libssl3.so", "/usr/lib/libssl.so", "/usr/lib/libcrypto.so.3", "/usr/lib/libssl.so.3.bak"))
    text += "7f20-7f21 rw-p 0 00:00 0 \n"  # anonymous: no path
    assert libssl_in_maps(text) == ["/usr/lib/x86_64-linux-gnu/libssl.so.3", "/opt/app/lib/libssl.so.1.1"]
    assert libssl_in_maps(maps_line("/usr/lib/libssl.so.3 (deleted)")) == ["/usr/lib/libssl.so.3"]


def test_a_cuda_process_gets_its_libssl_probed_and_a_plain_one_not(tmp_path):
    lib = tmp_path / "libssl.so.3"
    lib.write_text("")
    (tmp_path / "proc").mkdir()
    tree = Tree(tmp_path / "proc")
    tree.add(1, 0)
    cuda = tree.add(100, 1, maps=CUDA_MAPS + maps_line(str(lib)))
    plain = tree.add(200, 1, maps=maps_line(str(lib)))
    found = Discovery(tree.path, has_static_cudart=lambda p: False).scan()
    assert found.cuda_pids == {cuda}
    assert [(t.kind, t.path) for t in found.by_pid[cuda] if t.kind == TLS] == [(TLS, str(lib))]
    assert plain not in found.by_pid
    assert [t.path for t in found.targets if t.kind == TLS] == [str(lib)]


def test_the_system_libssl_is_probed_ahead(tmp_path):
    d = tmp_path / "host/usr/lib/x86_64-linux-gnu"
    d.mkdir(parents=True)
    (d / "libssl.so.3").write_text("")
    (d / "libssl.so").write_text("")  # the dev link's name: not probed
    found = known_library_files(str(tmp_path / "host"), [])
    assert [(t.kind, t.path) for t in found] == [(TLS, str(d / "libssl.so.3"))]


def test_every_tls_handler_is_defined_in_tls_probes():
    text = (bpf_dir() / "tls_probes.c").read_text()
    defined = set(re.findall(r"^int\s+(\w+)\s*\(\s*struct pt_regs \*ctx\s*\)", text, flags=re.M))
    rows = rows_for(TLS)
    assert {r.symbol for r in rows} == {"SSL_read", "SSL_read_ex", "SSL_write", "SSL_write_ex", "SSL_do_handshake",
                                        "SSL_free"}
    assert {r.entry for r in rows} | {r.ret for r in rows if r.ret} <= defined
