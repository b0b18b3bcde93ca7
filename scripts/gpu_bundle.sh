#!/usr/bin/env bash
# `make gpu-bundle`: what the gpu tier needs on a bare GPU machine (no bcc, no kernel
# headers, no network), packed to travel in one 64 MiB carry: build/gpu-bundle/
#   bcc.tar.xz      bcc's Python module + libbcc and every library it needs beyond
#                   libc/libstdc++/libgcc (Debian bookworm debs, docs/static/bins dropped)
#   headers.tar.xz  Debian's 6.1 kernel headers (-common + -amd64 merged, the same tree
#                   scripts/setup.sh uses here), trimmed to include/ and arch/x86/include;
#                   and cupti-include/: the CUDA and CUPTI headers the device-clock library
#                   includes (cupti/otel_gpu_cupti.c), from this machine's toolkit
#   wheels/         the Python packages the collector, the OTLP receiver and the gpu
#                   tier's FastAPI server import (cp312, the GPU image's Python), and
#                   requirements.txt naming them; pip skips those the machine already has
#   MANIFEST.txt    packages, versions, sizes
# scripts/gpu-tier.sh installs and runs it there; scripts/gpu_bundle_check.sh checks it here.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=build/gpu-bundle
WORK=build/gpu-bundle-work   # downloads and staging; never carried
LIMIT=$((64 * 1024 * 1024))
log() { echo "gpu-bundle: $*" >&2; }

LIBS=(python3-bpfcc libbpfcc libbpf1 libclang-cpp14 libllvm14 libelf1 libffi8 libedit2 libz3-4
      libtinfo6 libxml2 libicu72 libbsd0 libmd0 liblzma5 zlib1g)
# The kernel headers linux-headers-amd64 points at (the -amd64 flavour depends on -common).
flavour=$(apt-cache depends linux-headers-amd64 | awk '/Depends: linux-headers-.*-amd64/ {print $2; exit}')
[ -n "$flavour" ] || { log "apt-cache knows no linux-headers-amd64 (run apt-get update)"; exit 1; }
HEADERS=("$flavour" "${flavour%-amd64}-common")

rm -rf "$OUT" "$WORK"
mkdir -p "$OUT/wheels" "$WORK/debs" "$WORK/x" "$WORK/bcc/lib" "$WORK/bcc/python"
log "downloading ${LIBS[*]} ${HEADERS[*]}"
(cd "$WORK/debs" && apt-get download -q "${LIBS[@]}" "${HEADERS[@]}" 2>&1 | grep -v '^W: Download is performed unsandboxed' >&2 || true)
for pkg in "${LIBS[@]}" "${HEADERS[@]}"; do
  ls "$WORK/debs/${pkg}_"*.deb >/dev/null || { log "download of $pkg failed"; exit 1; }
done

# 1. bcc and its libraries: shared objects flattened into lib/ (soname symlinks kept),
#    the Python module into python/. Nothing else from the packages travels.
for deb in "$WORK"/debs/*.deb; do
  case $(basename "$deb") in linux-headers-*) continue ;; esac
  dpkg-deb -x "$deb" "$WORK/x"
done
while IFS= read -r f; do  # regular files first, then the symlinks that name them
  cp -p "$f" "$WORK/bcc/lib/"
done < <(find "$WORK/x" -type f -name '*.so*' ! -path '*/python3*')
while IFS= read -r l; do
  name=$(basename "$l"); target=$(basename "$(readlink "$l")")
  [ "$name" = "$target" ] || [ ! -e "$WORK/bcc/lib/$target" ] || ln -sf "$target" "$WORK/bcc/lib/$name"
done < <(find "$WORK/x" -type l -name '*.so.*')
# Keep only what libbcc.so.0 loads (ctypes opens it by soname): its DT_NEEDED closure.
keep=(libbcc.so.0); i=0
while [ $i -lt ${#keep[@]} ]; do
  for dep in $(readelf -d "$WORK/bcc/lib/${keep[$i]}" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    [ -e "$WORK/bcc/lib/$dep" ] && [[ " ${keep[*]} " != *" $dep "* ]] && keep+=("$dep")
  done
  i=$((i + 1))
done
for f in "$WORK"/bcc/lib/*; do
  soname=$(basename "$f")
  [ -L "$f" ] && [[ " ${keep[*]} " == *" $soname "* ]] && continue
  [ -L "$f" ] && { rm "$f"; continue; }
  # a regular file stays if a kept soname links to it
  for k in "${keep[@]}"; do [ "$(readlink "$WORK/bcc/lib/$k" || echo "$k")" = "$soname" ] && continue 2; done
  rm "$f"
done
log "libraries: ${keep[*]}"
cp -a "$WORK/x/usr/lib/python3/dist-packages/bcc" "$WORK/bcc/python/"
find "$WORK/bcc" -name '__pycache__' -prune -exec rm -rf {} +
log "compressing bcc ($(du -sh "$WORK/bcc" | cut -f1))"
tar -C "$WORK/bcc" -cf - . | xz -9e -T0 > "$OUT/bcc.tar.xz"

# 2. Kernel headers: bcc needs one directory (Debian splits it in two); only the
#    include trees are read when compiling uprobe and tracepoint programs.
mkdir -p "$WORK/h" "$WORK/merged" "$WORK/kernel-headers"
for pkg in "${HEADERS[@]}"; do dpkg-deb -x "$WORK"/debs/"${pkg}"_*.deb "$WORK/h"; done
cp -as "$(realpath "$WORK"/h/usr/src/linux-headers-*-common)/." "$WORK/merged/"
cp -asf "$(realpath "$WORK"/h/usr/src/"$flavour")/." "$WORK/merged/"
(cd "$WORK/merged" && tar -chf - Makefile include arch/x86/include arch/x86/Makefile) | tar -C "$WORK/kernel-headers" -xf -
# Subsystems no uprobe/tracepoint program includes.
(cd "$WORK/kernel-headers/include" && rm -rf dt-bindings sound drm rdma media scsi video xen target soc \
  kunit ras pcmcia math-emu crypto/internal keys)
# 2b. The CUDA and CUPTI headers the device-clock library compiles against (tests/gpu builds
#     it on the GPU machine, whose PyTorch wheels lack crt/): exactly those it includes.
CUDA_INC=${OTEL_GPU_CUDA_INCLUDE:-/usr/local/cuda/include}
cupti_dir=()
if [ -f "$CUDA_INC/cupti.h" ]; then
  mkdir -p "$WORK/cupti-include"
  for h in $(gcc -M -I"$CUDA_INC" cupti/otel_gpu_cupti.c | tr ' \\' '\n\n' | grep "^$CUDA_INC/" | sort -u); do
    rel=${h#"$CUDA_INC"/}
    mkdir -p "$WORK/cupti-include/$(dirname "$rel")"
    cp "$h" "$WORK/cupti-include/$rel"
  done
  cupti_dir=(cupti-include)
else
  log "no $CUDA_INC/cupti.h: the gpu tier's device-clock test will skip (set OTEL_GPU_CUDA_INCLUDE)"
fi
log "compressing kernel headers ($(du -sh "$WORK/kernel-headers" | cut -f1)) ${cupti_dir[*]}"
tar -C "$WORK" -cf - kernel-headers "${cupti_dir[@]}" | xz -9 -T0 > "$OUT/headers.tar.xz"

# 3. Wheels for the GPU image's Python (3.12), at the versions this checkout's .venv runs.
REQS=(opentelemetry-sdk opentelemetry-exporter-otlp-proto-grpc opentelemetry-exporter-otlp-proto-http
      grpcio protobuf hpack fastapi uvicorn)
PIP=${PIP:-.venv/bin/pip}
"$PIP" freeze --exclude-editable > "$WORK/constraints.txt"
printf '%s\n' "${REQS[@]}" > "$OUT/wheels/requirements.txt"
log "downloading wheels: ${REQS[*]} (and their dependencies)"
"$PIP" download -q --disable-pip-version-check --only-binary=:all: --python-version 3.12 \
  --implementation cp --abi cp312 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -c "$WORK/constraints.txt" -d "$OUT/wheels" "${REQS[@]}"
# The GPU image already has these (device KINDS.md); pip uses its copies, so they stay
# home to keep the carry under 64 MiB. pip names any it then lacks.
for name in grpcio requests urllib3 certifi charset_normalizer idna click h11 anyio typing_extensions; do
  rm -f "$OUT/wheels/${name}-"*.whl
done

# 4. Manifest, and the size check: everything travels in one carry of at most 64 MiB.
total=$(du -cb "$OUT"/*.tar.xz "$OUT"/wheels/* | tail -n1 | cut -f1)
{
  echo "# build/gpu-bundle: scripts/gpu_bundle.sh $(date -u +%FT%TZ); carry it as one path (<= 64 MiB)"
  echo "## Debian packages"
  for deb in "$WORK"/debs/*.deb; do
    echo "$(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version) deb=$(stat -c %s "$deb")"
  done
  echo "## files (bytes)"
  (cd "$OUT" && find . -type f ! -name MANIFEST.txt -printf '%s %P\n' | sort -k2)
  echo "## total $total bytes ($((total / 1024 / 1024)) MiB) of $LIMIT"
} > "$OUT/MANIFEST.txt"
log "$(tail -n1 "$OUT/MANIFEST.txt")"
[ "$total" -le "$LIMIT" ] || { log "bundle is over 64 MiB: trim it"; exit 1; }
rm -rf "$WORK"/{x,h,merged,bcc,kernel-headers,cupti-include}  # staging: about 700 MB unpacked
