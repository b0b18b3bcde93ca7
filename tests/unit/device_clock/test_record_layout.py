"""The device-clock library's record (cupti/device_record.h) and the probe's copy of it
(bpf/events.h struct device_record, mirrored in kernel_io/abi.py) are one layout: the probe
copies the library's bytes as they are, so a field moved on one side only would be read as
another field, silently. Compiled with gcc, every field's offset compared."""
from __future__ import annotations

import ctypes as ct
import shutil
import subprocess

import pytest

from otel_gpu.device_clock import library
from otel_gpu.kernel_io import abi
from otel_gpu.probes.source import bpf_dir


def test_the_probe_reads_the_library_record_field_by_field(tmp_path):
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    fields = [name for name, _ in abi.DeviceRecord._fields_]
    lines = [f'printf("%s %zu %zu\\n", "{f}", offsetof(struct otel_gpu_device_record, {f}), '
             f'offsetof(struct device_record, {f}));' for f in fields]
    program = tmp_path / "layout.c"
    program.write_text(f'''#include <stdio.h>
#include <stddef.h>
#include "{library.SOURCES / "device_record.h"}"
#include "{bpf_dir() / "events.h"}"
int main(void) {{
    printf("size %zu %zu\\n", sizeof(struct otel_gpu_device_record), sizeof(struct device_record));
    printf("per_call %d %d\\n", OTEL_GPU_RECORDS_PER_CALL, DEVICE_RECORDS_PER_CALL);
    {" ".join(lines)}
    return 0;
}}
''')
    subprocess.run(["gcc", "-o", str(tmp_path / "layout"), str(program)], check=True, capture_output=True)
    out = subprocess.run([str(tmp_path / "layout")], check=True, capture_output=True, text=True).stdout
    rows = {name: (int(a), int(b)) for name, a, b in (line.split() for line in out.splitlines())}
    assert rows.pop("size") == (64, 64) and rows.pop("per_call") == (abi.DEVICE_RECORDS_PER_CALL,) * 2
    assert rows == {f: (getattr(abi.DeviceRecord, f).offset,) * 2 for f in fields}
    assert ct.sizeof(abi.DeviceRecord) == 64
