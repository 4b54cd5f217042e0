# reveal-kit: every entry point a fresh machine needs. `make demo` and `make test` create the venv themselves.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export PYTHONUNBUFFERED := 1

.PHONY: install demo test sync nbtest pytest clean-nbs bench

$(STAMP): setup.py settings.ini
	test -x $(PY) || python3 -m venv $(VENV)
	# CPU torch first (a local CPU wheel); anything that pulls torch later then finds it satisfied.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

## the main job on the embedded default: generate a small benchmark, build memories, answer with reveal and base
demo: install
	$(VENV)/bin/reveal demo --out runs/demo

## the whole CPU test suite: library in sync with notebooks, notebook tests (slow included), pytest (gpu skipped)
test: install sync nbtest pytest

sync:
	PATH=$(VENV)/bin:$$PATH bash tools/check_sync.sh

nbtest:
	$(VENV)/bin/nbdev_test --flags slow --n_workers 2

pytest:
	$(VENV)/bin/pytest -m "not gpu" -q

clean-nbs:
	$(VENV)/bin/nbdev_clean

bench: install
	$(PY) benchmarks/index_bench.py --sizes 10000 100000
	$(PY) benchmarks/memory_bench.py
	$(PY) benchmarks/loop_bench.py
