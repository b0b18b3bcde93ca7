"""The OpenSSL probes' discovery and table: which libssl files a traced process gets
probed (OpenSSL 3 and 1.1 only, never NSS's libssl3.so or the unversioned dev link),
only for CUDA processes, the system's file ahead of any process, and every handler the
table names defined in bpf/tls_probes.c; on Debian's libssl, the internal read and write
functions probed in place of the single-stepped public entries (probes/tls_entries.py)."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from otel_gpu.probes.discovery import Discovery, known_library_files, libssl_in_maps
from otel_gpu.probes.prologue import emulated, entry_code
from otel_gpu.probes.source import bpf_dir
from otel_gpu.probes.tls_entries import READ, WRITE, internal_entries
from otel_gpu.cuda_calls import TLS
from otel_gpu.probes.rows import TLS_THROUGH, rows_for
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
    rows = rows_for(TLS) + rows_for(TLS, ((READ, 1), (WRITE, 2)))
    assert {r.symbol for r in rows} == {"SSL_read", "SSL_read_ex", "SSL_write", "SSL_write_ex", "SSL_do_handshake",
                                        "SSL_free", READ, WRITE}
    assert {r.entry for r in rows} | {r.ret for r in rows if r.ret} <= defined


SYSTEM_LIBSSL = Path("/usr/lib/x86_64-linux-gnu/libssl.so.3")


def _objdump_call(lib: Path, symbol: str) -> int:
    """Where `symbol`'s first call goes, as binutils' disassembler reads it (not our decoder)."""
    dump = subprocess.run(["objdump", "-d", "-T", str(lib)], capture_output=True, text=True, check=True).stdout
    start = int(re.search(rf"^([0-9a-f]+) .*\s{symbol}$", dump, flags=re.M).group(1), 16)
    body = subprocess.run(["objdump", "-d", f"--start-address={start:#x}", f"--stop-address={start + 96:#x}",
                           str(lib)], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"\scall\s+([0-9a-f]+)", body).group(1), 16)


@pytest.mark.skipif(not SYSTEM_LIBSSL.exists() or not shutil.which("objdump"), reason="no Debian libssl or objdump")
def test_debian_libssl_reads_and_writes_are_probed_where_they_all_go_through():
    """Its SSL_read*/SSL_write* start with `sub $imm,%rsp` (single-stepped); the internal
    functions they call start with a push: those are what the table probes."""
    found = dict(internal_entries(str(SYSTEM_LIBSSL)))
    assert found == {READ: _objdump_call(SYSTEM_LIBSSL, "SSL_read_ex"),
                     WRITE: _objdump_call(SYSTEM_LIBSSL, "SSL_write_ex")}
    assert found[READ] == _objdump_call(SYSTEM_LIBSSL, "SSL_read")
    assert found[WRITE] == _objdump_call(SYSTEM_LIBSSL, "SSL_write")
    rows = rows_for(TLS, tuple(found.items()))
    assert {r.symbol for r in rows} == {READ, WRITE, "SSL_do_handshake", "SSL_free"}
    assert all(emulated(entry_code(str(SYSTEM_LIBSSL), addr=a)) for a in found.values())  # once per read/write
    assert not any(emulated(entry_code(str(SYSTEM_LIBSSL), s)) for s in TLS_THROUGH)  # what they replace


def test_a_libssl_that_does_not_prove_it_keeps_the_public_entries(tmp_path):
    lib = tmp_path / "libssl.so.3"
    lib.write_bytes(b"\x7fELF" + bytes(60))
    assert internal_entries(str(lib)) == () and internal_entries(str(tmp_path / "gone")) == ()
    assert {r.symbol for r in rows_for(TLS, ())} >= TLS_THROUGH
