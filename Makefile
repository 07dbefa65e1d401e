# keras_posenc: every install step lives here (CI runs from a clean clone).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
LINT_PATHS := $(wildcard keras_posenc tflite_export examples tests benchmarks)
export TF_CPP_MIN_LOG_LEVEL ?= 3

.PHONY: install demo test test-keras3 test-keras2 lint format bench clean

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[all,dev]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(PY) examples/readme_example.py

lint: install
	$(PY) -m ruff check $(LINT_PATHS)
	$(PY) -m ruff format --check $(LINT_PATHS)

format: install
	$(PY) -m ruff check --fix $(LINT_PATHS)
	$(PY) -m ruff format $(LINT_PATHS)

test-keras3: install
	$(PY) -m pytest -q tests

test-keras2: install
	TF_USE_LEGACY_KERAS=1 $(PY) -m pytest -q tests

test: lint test-keras3 test-keras2

bench: install
	$(PY) -m benchmarks $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
