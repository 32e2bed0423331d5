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
