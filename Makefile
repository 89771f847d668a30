# Two commands for a newcomer: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Arize Phoenix, the OpenTelemetry receiver the export test sends to, lives in a venv of
# its own: its packages (a pytest plugin among them) must not load in the project's tests.
PHOENIX := .venv-phoenix/.installed

.PHONY: demo test bench lint format clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

$(PHOENIX):
	$(PYTHON) -m venv .venv-phoenix
	.venv-phoenix/bin/python -m pip install --quiet --upgrade pip
	.venv-phoenix/bin/python -m pip install --quiet 'arize-phoenix>=20,<21'
	touch $(PHOENIX)

demo: $(STAMP)
	$(VENV)/bin/replayable demo

test: $(STAMP) $(PHOENIX)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) bench/run.py

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples
	$(VENV)/bin/ruff format --check src tests bench examples
	$(VENV)/bin/mypy
	PYTHONPATH=src $(VENV)/bin/lint-imports

format: $(STAMP)
	$(VENV)/bin/ruff format src tests bench examples
	$(VENV)/bin/ruff check --fix src tests bench examples

clean:
	rm -rf $(VENV) .venv-phoenix .replayable .pytest_cache .mypy_cache .ruff_cache
