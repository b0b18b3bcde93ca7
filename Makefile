# The two commands: `make demo` and `make test` (both install what is missing first).
SHELL := /bin/bash
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PY := .venv/bin/python

.PHONY: setup demo test test-unit bench clean

setup:
	@./scripts/setup.sh

demo: setup
	$(SUDO) $(PY) -m otel_gpu.cli demo

test: setup
	$(SUDO) $(PY) -m pytest -rs tests

test-unit: setup
	$(PY) -m pytest -rs tests/unit

clean:
	rm -rf .venv build *.egg-info .pytest_cache
