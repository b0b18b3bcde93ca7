# The two commands: `make demo` and `make test` (both install what is missing first).
SHELL := /bin/bash
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PY := .venv/bin/python

.PHONY: setup demo test test-unit bench bench-quick clean gpu-bundle gpu-bundle-check

setup:
	@./scripts/setup.sh

demo: setup
	$(SUDO) $(PY) -m otel_gpu.cli demo

test: setup
	$(SUDO) $(PY) -m pytest -rfEs --durations=25 tests

test-unit: setup
	$(PY) -m pytest -rs tests/unit

bench: setup   # prints a table, writes bench/results/*.json (about 20 minutes on 2 cores; bench-quick about 8; neither writes the local store)
	$(PY) -m pip install -q py-spy
	$(SUDO) $(PY) -m bench

bench-quick: setup
	$(PY) -m pip install -q py-spy
	$(SUDO) $(PY) -m bench --quick

gpu-bundle:   # build/gpu-bundle: bcc, LLVM/clang libs, kernel headers, wheels for tests/gpu on a bare GPU machine
	./scripts/gpu_bundle.sh

gpu-bundle-check:   # installs that bundle here with this host's bcc and headers hidden; tests/gpu skips (no GPU)
	$(SUDO) ./scripts/gpu_bundle_check.sh

clean:
	rm -rf .venv build *.egg-info .pytest_cache
