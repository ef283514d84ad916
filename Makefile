# Two commands do all set-up: `make run` and `make test`. The virtual environment is created on
# first use and reinstalled only when pyproject.toml changes.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed-stamp
# pytest-xdist workers for `make test`: the suite is independent tests on tmp dirs, run on both of CI's
# two cores (`make test TEST_WORKERS=0` runs it in one process).
TEST_WORKERS ?= 2

.PHONY: run test lint bench clean

$(STAMP): pyproject.toml
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/shard-search

# The layering first (import-linter's contracts in pyproject.toml: layers, no import circles), then the suite.
test: $(STAMP)
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/python -m pytest -n $(TEST_WORKERS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(VENV)/bin/python -m validation.bench.proxy

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
