# make demo   - create .venv if missing, install, run the main job (rankwise bench, quick preset)
# make test   - same set-up, then ruff (lint and format), mypy, the docs build and the test suite but its long tier (make test-fast: the unit tier, about a minute)
# make test-long - same set-up, then the real-rank tests make test leaves out for time (tests/support/long.py says why each)
# make test-docs - same set-up, then every command block of README.md and docs/, run as written at a smoke size
# make zoo    - rankwise verify, bench --script and plan on public training scripts (zoo/): docs/reference/zoo.md
# make docs   - build the docs site into site/ (strict: a broken link or reference fails); make docs-serve: serve it locally
PYTHON     ?= python3
VENV       ?= .venv
# torch 2.13.0 installs from a local CPU build on the development machines; set e.g.
# TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126" for CUDA.
TORCH_SPEC ?= torch==2.13.0
EXTRAS     ?= dev,docs,deepspeed,accelerate
PY         := $(VENV)/bin/python
STAMP      := $(VENV)/.rankwise-installed
export TOKENIZERS_PARALLELISM := false
# mkdocs' plugins print a page-long notice about a future MkDocs 2 on every build; these switch it off
export NO_MKDOCS_2_WARNING := 1
export DISABLE_MKDOCS_2_WARNING := true

.PHONY: install demo test test-fast test-long test-docs docs docs-serve browser bench zoo gpu-wheels gpu-check clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	scripts/build_horovod.sh $(PY)
	@touch $(STAMP)

# DEMO_PRESET=smoke: CI's run of the demo (four rows, each checked; under 3 minutes on 2 cores)
DEMO_PRESET ?= quick
demo: $(STAMP)
	$(VENV)/bin/rankwise bench --preset $(DEMO_PRESET) --data sentiment --out runs/bench-demo

# Tiers (markers, explicit: tests/support/tiers.py): unit, multiproc, multinode (root: network namespaces), slurm (root: installs
# slurm-wlm with apt-get, only under `make test`), gpu.  `make test` runs them all; `make test-fast` the unit tier.
# TEST_WORKERS pytest-xdist workers share the tests (the two-host tests on one of them: --dist loadgroup); a test
# that waits (a rendezvous, a timeout, a reference run on one process) leaves its cores to the others.
TEST_WORKERS ?= 2
test: $(STAMP) browser
	$(VENV)/bin/ruff check src tests examples scripts
	$(VENV)/bin/ruff format --check src tests examples scripts
	$(PY) -m mypy  # src/rankwise, configured in pyproject.toml ([tool.mypy])
	$(VENV)/bin/mkdocs build --strict  # not --quiet: it hides the warnings strict mode counts
	RANKWISE_TEST_INSTALL=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=25 -m "not long" tests

# The long tier: real-rank tests whose behaviour a shorter test in make test already runs, or a second strategy or
# precision of one (tests/support/long.py names each and why): about 100 worker-minutes on a slow day, 55 minutes
# on 2 cores.  Run it before a change to what they cover lands.
test-long: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=15 -m long tests

test-fast: $(STAMP)
	$(VENV)/bin/ruff check src tests examples scripts
	$(VENV)/bin/ruff format --check src tests examples scripts
	$(PY) -m mypy
	$(PY) -m pytest -q -m unit tests

# The documentation tier: every ```bash / ```python block of README.md and docs/, exactly as written, each
# `rankwise` command at a smoke size (RANKWISE_SMOKE=1); a block that cannot run here says why in an HTML comment
# above it (tests/support/docs/codeblocks.py, with pytest-codeblocks).  A page's blocks run in order on one
# pytest-xdist worker (--dist loadfile), in that worker's copy of the repository (the checkout is left as it was);
# TEST_WORKERS pages at once: a command's start-up and its single-process parts leave a core to the other page
# (43.5 minutes one page at a time in the last CI run).
test-docs: $(STAMP)
	$(PY) -m pytest -q -p tests.support.docs.codeblocks --codeblocks -n $(TEST_WORKERS) --dist loadfile \
	  -p no:cacheprovider --durations=0 README.md docs

docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict

docs-serve: $(STAMP)
	$(VENV)/bin/mkdocs serve

# A headless Chromium for tests/docs/test_site.py: one already installed, else Playwright's own build where its
# download server is reachable (it fails in about 9 s where not), else Debian's (apt-get, as root); without one
# that test skips, saying why.
browser: $(STAMP)
	@command -v chromium >/dev/null || $(PY) -m playwright install chromium >/dev/null 2>&1 || \
	  { test "$$(id -u)" = 0 && command -v apt-get >/dev/null && \
	    { apt-get install -y -q chromium >/dev/null 2>&1 || \
	      { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; }; }; } || \
	  echo "no headless Chromium could be installed: tests/docs/test_site.py will skip"

bench: $(STAMP)
	$(VENV)/bin/rankwise bench --preset full --strategies ddp,plain-ddp,plain-accelerate,per-step-sync

# The zoo (docs/reference/zoo.md): public training scripts pinned under zoo/, each through rankwise verify,
# bench --script and plan as a user runs them, scored against its manifest; writes runs/zoo/results.json and the
# page. ZOO_ARGS="--only nanogpt --commands verify" for some; make test runs the cases marked fast (tests/zoo).
ZOO_ARGS ?=
zoo: $(STAMP)
	nice $(PY) scripts/zoo $(ZOO_ARGS)

# The GPU pass (docs/gpu.md).  On a machine with a CUDA GPU and rankwise's dependencies,
# `make gpu-check` runs scripts/gpu_check.sh: tests/gpu, then the speed script (GPU_STEPS to choose:
# smoke tests speed scaling).  For a lent device machine without a package registry, fetch the
# wheels it lacks here first (`make gpu-wheels`, into the git-ignored .whl/), then call the device
# tool from the repository root: run(command="bash scripts/gpu_check.sh smoke tests", carry=[".whl"]);
# the script installs .whl/*.whl into /tmp/site and writes its logs to $$OUT.
GPU_STEPS  ?= smoke tests speed
GPU_WHEELS ?= pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
              typing-extensions==4.16.0 hjson==3.1.0 snownlp==0.12.3 deepspeed==0.19.8

# sdist-only packages (snownlp, deepspeed) are built here as pure-Python wheels.
gpu-wheels:
	@mkdir -p .whl && (grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude)
	for spec in $(GPU_WHEELS); do \
	  $(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	    --platform any -d .whl $$spec 2>/dev/null || $(PYTHON) -m pip wheel -q --no-deps -w .whl $$spec || exit 1; \
	done
	@du -sh .whl

gpu-check:
	bash scripts/gpu_check.sh $(GPU_STEPS)

clean:
	rm -rf $(VENV) runs .pytest_cache site
