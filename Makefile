# The README's commands, for development. `make install` creates .venv if it does not exist.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install test bench lint compile-check gpu-check gpu-carry check-min-versions clean

$(PY):
	python3 -m venv $(VENV)

install: $(PY)
	$(PY) -m pip install torch ninja
	$(PY) -m pip install --no-build-isolation -e ".[dev]"

test:
	$(PY) -m pytest -n auto

bench:
	$(PY) -m rlkernels bench

lint:
	$(PY) -m ruff check rlkernels tests benchmarks

compile-check:
	$(PY) -m rlkernels compile-check

gpu-check:  # a lent GPU machine has no .venv: its own python then
	$(if $(wildcard $(PY)),$(PY),python3) -m rlkernels selftest

gpu-carry:
	python3 .ci/gpu-carry

check-min-versions:
	bash .ci/min-versions

clean:
	rm -rf build *.egg-info rlkernels/_C*.so
