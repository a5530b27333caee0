# zeroedu: two commands do everything on a fresh machine.
#   make lab    set up .venv if needed, open JupyterLab on notebooks/ (127.0.0.1)
#   make test   set up .venv if needed, run every test (unit, multi-rank, nbval, browser), then
#               check that the run left the working tree exactly as it found it
#   make test-fast  the edit-run loop (under 2 minutes): theory, shard math, single-rank
#               strategy checks, grading, CLI parsing (tests marked `fast`)
#   make test-cpus  the suite (no browser) under other CPUs' kernels: the slow 16-bit path, the
#               emulated one, torch's scalar kernels (tests/README.md, "Any CPU")
# Also: make tour (every strategy at N = 4, measured vs predicted), make bench.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# torch: `make setup` installs TORCH_SPEC only when no torch is importable in .venv, so a CPU
# machine gets the pinned build and a GPU user's CUDA build is kept. GPU users: put a
# CUDA build of torch into .venv first (see README); an importable torch is never replaced.
TORCH_SPEC ?= torch==2.13.0
STAMP  := $(VENV)/.zeroedu-installed
PORT   ?= 8888
PYTEST_ARGS ?=

.PHONY: setup lab test test-cpus test-fast test-unit test-notebooks test-browser tour bench browser-deps clean

setup: $(STAMP)

# Bytecode: pip compiles every file it installs on one core (37 of the ~65 s set-up here); the
# packages go in uncompiled and compileall does it on every core, torch's files beside the second
# pip run, so every file still has its .pyc (a process never compiles a module again, which
# PYTHONDONTWRITEBYTECODE, set on the machines this was timed on, would make it do every time).
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q --no-compile "$(TORCH_SPEC)"
	@site=$$($(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"); \
	  ($(PY) -m compileall -qq "$$site/torch" >/dev/null 2>&1 || true) & \
	  $(PY) -m pip install -q --no-compile -e ".[lab,test]"; rc=$$?; wait; \
	  [ $$rc = 0 ] && ($(PY) -m compileall -qq -j 0 "$$site" >/dev/null 2>&1 || true) && exit $$rc
	@touch $(STAMP)

lab: setup
	@echo "JupyterLab on http://127.0.0.1:$(PORT)/lab (Ctrl-C to stop)"
	$(VENV)/bin/jupyter lab --no-browser --ServerApp.ip=127.0.0.1 --ServerApp.port=$(PORT) \
	  --ServerApp.root_dir=notebooks $(if $(filter 0,$(shell id -u)),--ServerApp.allow_root=True,)

# Stages and their budgets: tests/README.md. tests/run_suite.py runs the unit and multi-rank
# tests beside the two notebook stages, installs chromium (browser-deps) meanwhile when missing,
# times each stage and fails, naming the file, if the run changed anything git sees.
test: setup
	$(PY) tests/run_suite.py $(PYTEST_ARGS)

# The suite on the kernels other CPUs have (tests/README.md, "Any CPU"): the unit, multi-rank and
# notebook stages (no browser) once per setting: oneDNN without bf16 and AVX2 kernels (the
# probe then emulates 16-bit products), the emulated path forced, and torch's scalar kernels.
CPU_SETTINGS ?= ONEDNN_MAX_CPU_ISA=AVX2,ATEN_CPU_CAPABILITY=avx2 ZEROEDU_MATMUL16=emulated ATEN_CPU_CAPABILITY=default

test-cpus: setup
	@for s in $(CPU_SETTINGS); do echo "== make test-cpus: $$s" | tr , ' '; \
	  env $$(echo $$s | tr , ' ') $(PY) tests/run_suite.py --no-browser $(PYTEST_ARGS) || exit 1; done

test-fast: setup
	$(VENV)/bin/pytest -q tests -m fast $(PYTEST_ARGS)

test-unit: setup
	$(VENV)/bin/pytest -q tests -m "not browser" $(PYTEST_ARGS)

test-notebooks: setup
	$(VENV)/bin/pytest -q -p no:cacheprovider --nbval --nbval-sanitize-with notebooks/sanitize.cfg notebooks/solutions

test-browser: setup browser-deps
	$(VENV)/bin/pytest -q tests/test_browser.py -m browser

# The browser check drives Debian's chromium; install it when missing (as root, e.g. in CI).
browser-deps:
	@if [ ! -x /usr/bin/chromium ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null); \
	  else \
	    echo "the browser check needs Debian's chromium: sudo apt-get install -y chromium"; exit 1; \
	  fi; \
	fi

tour: setup
	$(VENV)/bin/zeroedu tour --world-size 4

# zeroedu vs torch (DDP, fully_shard, HSDP), ring vs gloo collectives, what the instrumentation
# costs, the N = 1..8 scaling table (benchmarks/results/*.json), cold vs warm start, overlap on
# emulated links (bucketed vs one-bucket DDP, FSDP prefetch on/off), step time measured vs predicted
# (every strategy, N = 2 and 4, two links), the notebooks' time lessons (benchmarks/results/lessons.json):
# the pipeline: equality, the bubble on an emulated device, ZeRO per stage (benchmarks/results/pipeline.json),
# the planner against published runs (benchmarks/results/planner.json), the suite's planner against its
# own runs (benchmarks/results/plans.json):
# over 25 minutes on 2 cores. Quick pass: make bench BENCH_ARGS=--quick
BENCH_ARGS ?=
BENCHES ?= compare collectives instrumentation scaling launch links predict lessons loss_curves pipeline matmul16 planner plans

bench: setup
	@for b in $(BENCHES); do echo "== benchmarks/bench_$$b.py"; \
	  $(PY) benchmarks/bench_$$b.py $(BENCH_ARGS) || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
