#!/usr/bin/env bash
# Runs the gpu tier (tests/gpu) on a bare GPU machine: no bcc, no kernel headers, no
# network; only the machine's Python (with PyTorch) and build/gpu-bundle (`make gpu-bundle`,
# carried there). Nothing is installed system-wide: the bundle unpacks into $PREFIX and
# the Python packages go into a venv that also sees the machine's own site-packages.
#   scripts/gpu-tier.sh           install, then pytest tests/gpu (results under $OUT)
#   scripts/gpu-tier.sh --check   install, compile and load a trivial program and the
#                                 collector's real one, then pytest tests/gpu (which skips
#                                 without a GPU): scripts/gpu_bundle_check.sh runs this here
#   scripts/gpu-tier.sh --bench   install, pytest tests/gpu, then bench/items/gpu_model_server.py (the
#                                 throughput of a PyTorch model server traced and not) and
#                                 bench/items/gpu_launch_cost.py (what a launch in a request costs)
# Settings (env): OTEL_GPU_BUNDLE (build/gpu-bundle), OTEL_GPU_PREFIX (/opt/otel-gpu-bundle),
# OTEL_GPU_PYTHON (python3: the one with torch), OUT (build/gpu-tier-out), PYTEST_ARGS,
# OTEL_GPU_KEEP_LIBS=1 (use every bundled library, even where the machine has its own).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUNDLE=$(realpath "${OTEL_GPU_BUNDLE:-build/gpu-bundle}")
PREFIX=${OTEL_GPU_PREFIX:-/opt/otel-gpu-bundle}
MACHINE_PY=${OTEL_GPU_PYTHON:-python3}
OUT=${OUT:-$ROOT/build/gpu-tier-out}
VENV=$PREFIX/venv
log() { echo "gpu-tier: $*" >&2; }
mkdir -p "$OUT"
for f in bcc.tar.xz headers.tar.xz wheels/requirements.txt; do
  [ -f "$BUNDLE/$f" ] || { log "$BUNDLE/$f missing: run make gpu-bundle here and carry build/gpu-bundle"; exit 1; }
done

unpack() {  # unpack ARCHIVE.tar.xz DIR; Python's lzma where the image has no xz
  if command -v xz >/dev/null; then xz -dc "$1" | tar -C "$2" -xf -
  else "$MACHINE_PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="tar")' "$1" "$2"; fi
}

# 1. Unpack (again only when the bundle changed).
stamp=$({ cat "$BUNDLE/MANIFEST.txt"; echo "${OTEL_GPU_KEEP_LIBS:-}"; } | md5sum | cut -d' ' -f1)
if [ "$(cat "$PREFIX/.stamp" 2>/dev/null)" != "$stamp" ]; then
  log "unpacking $BUNDLE into $PREFIX"
  rm -rf "$PREFIX"; mkdir -p "$PREFIX/bcc"
  unpack "$BUNDLE/bcc.tar.xz" "$PREFIX/bcc"
  unpack "$BUNDLE/headers.tar.xz" "$PREFIX"
  # A library the machine already has (same soname) is the machine's: the bundle's
  # copy would shadow it for every process under LD_LIBRARY_PATH (torch included).
  # bcc's own libraries always come from the bundle.
  for f in "$PREFIX"/bcc/lib/*.so*; do  # a soname is a symlink to its file, or the file
    name=$(basename "$f")
    case $name in libbcc*|libLLVM-14*|libclang-cpp*) continue ;; esac
    if [ -z "${OTEL_GPU_KEEP_LIBS:-}" ] && ldconfig -p | grep -q "^[[:space:]]*$name "; then
      [ -L "$f" ] && rm -f "$PREFIX/bcc/lib/$(readlink "$f")"
      rm -f "$f"
    fi
  done
  echo "$stamp" > "$PREFIX/.stamp"
fi
log "bundle libraries in use: $(cd "$PREFIX/bcc/lib" && ls | tr '\n' ' ')"
export LD_LIBRARY_PATH=$PREFIX/bcc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export BCC_KERNEL_SOURCE=$PREFIX/kernel-headers
# The device-clock library's headers (tests/gpu/test_device_clock.py builds it), where the
# machine has no CUDA toolkit of its own.
if [ -d "$PREFIX/cupti-include" ] && [ ! -f /usr/local/cuda/include/cupti.h ]; then
  export OTEL_GPU_CUPTI_INCLUDE=$PREFIX/cupti-include
fi

# 2. A venv over the machine's Python: --system-site-packages reaches only the base
#    interpreter's packages, and the machine's python3 may itself be a venv
#    (/opt/torch/.venv), so its site-packages are added by a .pth, with bcc's module.
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$VENV/.stamp" 2>/dev/null)" != "$stamp" ]; then
  log "creating $VENV from $MACHINE_PY ($("$MACHINE_PY" -V 2>&1))"
  "$MACHINE_PY" -m venv --system-site-packages --without-pip "$VENV"
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  { echo "$PREFIX/bcc/python"
    "$MACHINE_PY" -c 'import site; print("\n".join(site.getsitepackages()))'; } > "$site/otel_gpu_machine.pth"
  log "installing $(tr '\n' ' ' < "$BUNDLE/wheels/requirements.txt")from the bundle's wheels"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-cache-dir \
    --find-links "$BUNDLE/wheels" -r "$BUNDLE/wheels/requirements.txt"
  echo "$stamp" > "$VENV/.stamp"
fi
PY=$VENV/bin/python

# 3. tracefs: bcc 0.26 reads tracepoint formats under /sys/kernel/debug/tracing.
[ -e /sys/kernel/debug/tracing/uprobe_events ] || mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null || true
[ -e /sys/kernel/tracing/uprobe_events ] || mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null || true

# 4. The checks, then the tier.
if [ "${1:-}" = --check ]; then
  export OTEL_GPU_PREFIX=$PREFIX
  log "compiling and loading a trivial bcc program and the collector's own"
  "$PY" - <<'EOF' 2>&1 | tee "$OUT/bundle-check.log"
import bcc, os
b = bcc.BPF(text="TRACEPOINT_PROBE(sched, sched_process_exit) { return 0; }")
print("bundle-check: trivial program loaded, tracepoints attached:", b.num_open_tracepoints(),
      "bcc module:", os.path.dirname(bcc.__file__))
libs = sorted({l.split()[-1] for l in open("/proc/self/maps") if ".so" in l.split()[-1]})
print("bundle-check: libraries mapped from the bundle:", *[os.path.basename(l) for l in libs
                                                            if l.startswith(os.environ["OTEL_GPU_PREFIX"])])
print("bundle-check: libbcc/LLVM/clang from elsewhere:", [l for l in libs if not l.startswith(os.environ["OTEL_GPU_PREFIX"])
                                                     and any(k in l for k in ("libbcc", "LLVM", "clang"))])
b.cleanup()
from otel_gpu.probes.source import ProgramOptions, load
b = load(ProgramOptions())
print("bundle-check: the collector's program compiled and loaded,",
      "functions:", len(b.funcs), "BCC_KERNEL_SOURCE:", os.environ["BCC_KERNEL_SOURCE"])
b.cleanup()
EOF
  log "starting the collector as the gpu tier does (tests/harness.py), until ready"
  "$PY" - <<'EOF' 2>&1 | tee -a "$OUT/bundle-check.log"
import fastapi, uvicorn  # noqa: F401 (the gpu tier's model server)
from tests.support.otlp_receiver import OtlpReceiver
from tests.harness import RunningCollector
receiver = OtlpReceiver().start()
collector = RunningCollector(receiver, [], {})
print("bundle-check: collector ready; exit code after SIGTERM:", collector.stop())
receiver.stop()
EOF
fi
cd "$ROOT"
{ uname -r; nvidia-smi -L 2>&1 || true  # the machine, for the log
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
torch.zeros(1, device="cuda")
print(*sorted({l.split()[-1] for l in open("/proc/self/maps") if "libcud" in l or "libnvrtc" in l}), sep="\n")' 2>&1 || true
  # The first bytes of every function the collector probes in a torch process: a
  # single-stepped entry costs ~15x an emulated one (bench item 15).
  "$PY" -c 'import os, subprocess, sys, torch; torch.zeros(1, device="cuda")
r = subprocess.run([sys.executable, "scripts/probe_entries.py", str(os.getpid())], capture_output=True, text=True)
print(r.stdout, r.stderr)' 2>&1 || true
} | tee "$OUT/gpu-machine.log"
log "pytest tests/gpu (results under $OUT)"
set +e  # the bench runs after failed tests too; the exit status is the tests'
PYTHONUNBUFFERED=1 "$PY" -m pytest -rs -p no:cacheprovider --junitxml="$OUT/gpu-tier.xml" tests/gpu ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/gpu-tier.log"
rc=${PIPESTATUS[0]}
if [ "${1:-}" = --bench ]; then
  log "bench/items/gpu_model_server.py (results under $OUT)"
  PYTHONUNBUFFERED=1 "$PY" -m bench.items.gpu_model_server --json "$OUT/gpu-http.json" 2>&1 | tee "$OUT/gpu-http.log"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  log "bench/items/gpu_launch_cost.py (results under $OUT)"
  # 10 interleaved rounds, with their spread (#44 item 5); the map memory on this host (#45 item 1)
  PYTHONUNBUFFERED=1 "$PY" -m bench.items.gpu_launch_cost --rounds 10 --json "$OUT/gpu-launch-cost.json" 2>&1 | tee "$OUT/gpu-launch-cost.log"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
exit "$rc"
