# keras_posenc: every install step lives here (CI runs from a clean clone).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
LINT_PATHS := $(wildcard keras_posenc tflite_export examples tests benchmarks)
export TF_CPP_MIN_LOG_LEVEL ?= 3

.PHONY: install demo check test test-keras3 test-keras2 lint format bench bench-quick clean

$(STAMP): setup.cfg pyproject.toml
	@echo "[1/3] creating $(VENV) with $(PYTHON)"
	$(PYTHON) -m venv $(VENV)
	@echo "[2/3] upgrading pip"
	$(PY) -m pip install --quiet --upgrade pip
	@echo "[3/3] installing keras_posenc with TensorFlow, JAX, PyTorch (CPU), LiteRT, TFLM and the test tools (about 2.5 minutes on a fresh machine; pip lists each package it installs)"
	bash -o pipefail -c "$(PY) -m pip install --progress-bar off -e '.[all,dev,bench,backends]' \
		| sed -u -n -E '/^(Collecting|Successfully installed)/p'"
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(PY) examples/digits_demo.py --out demo_output

lint: install
	$(PY) -m ruff check $(LINT_PATHS)
	$(PY) -m ruff format --check $(LINT_PATHS)

format: install
	$(PY) -m ruff check --fix $(LINT_PATHS)
	$(PY) -m ruff format $(LINT_PATHS)

# A contributor's fast loop: lint, then the tests not marked slow, Keras 3
# only, on both cores (pytest-xdist).
check: lint
	$(PY) -m pytest -q -n 2 -m "not slow" tests

test-keras3: install
	$(PY) -m pytest -q tests

test-keras2: install
	TF_USE_LEGACY_KERAS=1 $(PY) -m pytest -q tests

# Both Keras modes side by side (2 cores, one thread each: 10% faster than
# two processes of two threads), each listing its 15 slowest tests (the
# budget is 20 minutes); the Keras 2 log is printed after.
ONE_THREAD := TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1 OMP_NUM_THREADS=1
test: lint
	@$(ONE_THREAD) TF_USE_LEGACY_KERAS=1 $(PY) -m pytest -q --durations=15 tests \
		> .pytest-keras2.log 2>&1 & \
	keras2=$$!; \
	$(ONE_THREAD) $(PY) -m pytest -q --durations=15 tests; keras3=$$?; \
	wait $$keras2; keras2=$$?; \
	echo "--- Keras 2 (TF_USE_LEGACY_KERAS=1) ---"; cat .pytest-keras2.log; \
	exit $$(( keras3 || keras2 ))

bench: install
	$(PY) -m benchmarks $(BENCH_ARGS)

bench-quick: install
	$(PY) -m benchmarks --quick $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
