# make demo   - create .venv if missing, install, run the main job (rankwise bench, quick preset)
# make test   - same set-up, then the whole test suite
PYTHON     ?= python3
VENV       ?= .venv
# torch 2.13.0 installs from a local CPU build on the development machines; set e.g.
# TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126" for CUDA.
TORCH_SPEC ?= torch==2.13.0
EXTRAS     ?= dev,deepspeed,accelerate
PY         := $(VENV)/bin/python
STAMP      := $(VENV)/.rankwise-installed
export TOKENIZERS_PARALLELISM := false

.PHONY: install demo test bench clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	scripts/build_horovod.sh $(PY)
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/rankwise bench --preset quick --data sentiment --out runs/bench-demo

test: $(STAMP)
	$(VENV)/bin/ruff check src tests examples
	$(PY) -m pytest -q tests

bench: $(STAMP)
	$(VENV)/bin/rankwise bench --preset full --strategies ddp,plain-ddp,plain-accelerate,per-step-sync

clean:
	rm -rf $(VENV) runs .pytest_cache
