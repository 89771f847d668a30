# Two commands for a newcomer: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test bench lint format clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/replayable demo

test: $(STAMP)
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
	rm -rf $(VENV) .replayable .pytest_cache .mypy_cache .ruff_cache
