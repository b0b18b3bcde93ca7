#!/usr/bin/env bash
# `make gpu-bundle-check`: runs scripts/gpu-tier.sh --check here (no GPU) as if on the
# bare GPU machine. In a private mount namespace, this host's bcc (python3-bpfcc,
# libbcc, LLVM 14, clang 14) and every kernel-header tree are hidden, and the "machine
# Python" is a pyenv CPython 3.12 venv (the GPU image's version) holding only pytest and
# the packages the image has but the bundle leaves out. Two passes: as the runner
# installs on the machine (bundled copies of libraries this host has are dropped), and
# with OTEL_GPU_KEEP_LIBS=1, where every library of bcc's closure must load from the
# bundle. Each pass compiles and loads a trivial program and the collector's own, then
# runs tests/gpu, which skips here (no GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=$ROOT/build/gpu-bundle-work
log() { echo "gpu-bundle-check: $*" >&2; }
[ "$(id -u)" = 0 ] || { log "needs root (mount namespace, bcc)"; exit 1; }
[ -f build/gpu-bundle/MANIFEST.txt ] || { log "no bundle: run make gpu-bundle"; exit 1; }

PY312=$(ls -d /root/.pyenv/versions/3.12.*/bin/python3 2>/dev/null | sort -V | tail -n1 || true)
[ -n "$PY312" ] || { log "no CPython 3.12 (pyenv) to stand in for the GPU image's"; exit 1; }
MACHINE=$WORK/machine-venv
if [ ! -x "$MACHINE/bin/python" ]; then
  log "creating the stand-in machine Python $MACHINE from $PY312"
  "$PY312" -m venv "$MACHINE"
  "$MACHINE/bin/pip" install -q --disable-pip-version-check pytest grpcio requests click h11 anyio typing_extensions
fi

# What the GPU machine lacks, hidden here: bcc's files, and kernel headers.
hide=()
for pkg in libbpfcc libllvm14 libclang-cpp14; do
  while IFS= read -r f; do [ -f "$f" ] && [ ! -L "$f" ] && hide+=("$f"); done < <(dpkg -L "$pkg" | grep '\.so')
done
dirs=(/usr/lib/python3/dist-packages/bcc /usr/src /var/lib/otel-gpu)
[ -d "/lib/modules/$(uname -r)" ] && dirs+=("/lib/modules/$(uname -r)")

for keep in "" 1; do
  log "pass: OTEL_GPU_KEEP_LIBS=${keep:-<unset>}"
  unshare -m --propagation private env HIDE="${hide[*]}" DIRS="${dirs[*]}" KEEP="$keep" \
    MACHINE="$MACHINE" WORK="$WORK" bash -euo pipefail -c '
    for f in $HIDE; do mount --bind /dev/null "$f"; done
    for d in $DIRS; do [ -d "$d" ] && mount -t tmpfs hidden "$d"; done
    python3 -c "import bcc" 2>/dev/null && { echo "gpu-bundle-check: host bcc still importable" >&2; exit 1; }
    OTEL_GPU_KEEP_LIBS=$KEEP OTEL_GPU_PYTHON=$MACHINE/bin/python OTEL_GPU_PREFIX=$WORK/prefix${KEEP:+-all} \
      OUT=$WORK/check-out${KEEP:+-all} scripts/gpu-tier.sh --check'
done
rm -rf "$WORK/prefix" "$WORK/prefix-all"  # about 250 MB unpacked each
log "ok: the bundle installs without this host's bcc or headers, and its programs load"
