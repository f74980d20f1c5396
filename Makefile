# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
# Both create or update .venv, install torch==2.13.0 when no torch is importable (the CPU
# build where that is what pip finds, the normal CUDA build elsewhere), then the project.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.gpudiag-installed

.PHONY: demo test lint typecheck unit venv bench gpu-check gpu-wheels gpu-wheels-lock \
	gpu-dry-run gpu-check-offline notebooks clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# Re-installs whenever pyproject.toml changes; a no-op otherwise.
$(STAMP): pyproject.toml | $(PY)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[dev]"
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/gpudiag demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

typecheck: $(STAMP)
	$(VENV)/bin/mypy

unit: $(STAMP)
	$(VENV)/bin/pytest -q

# ruff, mypy and pytest all run; the target fails if any of them fails.
test: $(STAMP)
	@status=0; \
	$(MAKE) --no-print-directory lint || status=1; \
	$(MAKE) --no-print-directory typecheck || status=1; \
	$(MAKE) --no-print-directory unit || status=1; \
	exit $$status

# Re-executes the notebooks and stores them with their outputs (commit the result).
notebooks: $(STAMP)
	$(PY) notebooks/store_outputs.py

bench: $(STAMP)
	@for script in benchmarks/*.py; do echo "== $$script"; $(PY) $$script || exit 1; done

# Every GPU path for real, one table (CONTRIBUTING.md): `pytest -m gpu` plus an end-to-end
# `gpudiag record`. Without CUDA every GPU test is "not applicable: needs a CUDA GPU". On a GPU
# machine whose CUDA torch is installed elsewhere: `make gpu-check GPU_PYTHON=python3`.
GPU_PYTHON ?= $(PY)
gpu-check:
	@if [ "$(GPU_PYTHON)" = "$(PY)" ]; then $(MAKE) --no-print-directory venv; fi
	$(GPU_PYTHON) -m gpudiag.cli.gpu_check

# A GPU machine without network (CONTRIBUTING.md, "On a GPU machine"). Here, with network:
# `make gpu-wheels` fills .gpu-wheels/ (ignored by git; it travels with the checkout) from
# scripts/gpu/wheels.lock.json; `make gpu-wheels-lock` resolves that lock again after a change
# of dependencies; `make gpu-dry-run` runs the GPU machine's command here in a Python 3.12 venv
# that has only what the GPU machine's image has (its cache: bash scripts/gpu/dry_run.sh
# --fill-cache, once). There: `bash scripts/gpu/check_offline.sh OUT_DIR` (or this target).
GPU_OUT ?= gpu-check-out
gpu-wheels-lock: $(STAMP)
	$(PY) scripts/gpu/wheels.py lock

gpu-wheels: $(STAMP)
	$(PY) scripts/gpu/wheels.py download

gpu-dry-run: $(STAMP)
	@test -d .gpu-wheels || $(MAKE) --no-print-directory gpu-wheels
	$(PY) scripts/gpu/wheels.py check
	bash scripts/gpu/dry_run.sh $(GPU_OUT)

gpu-check-offline:
	bash scripts/gpu/check_offline.sh $(GPU_OUT)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
