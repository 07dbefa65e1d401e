# keras_posenc: every install step lives here (CI runs from a clean clone).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
LINT_PATHS := $(wildcard keras_posenc tflite_export examples tests benchmarks)
export TF_CPP_MIN_LOG_LEVEL ?= 3

.PHONY: install demo check test test-keras3 test-keras2 test-jax test-torch lint format bench bench-quick clean

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

# Two lanes on the two cores, one thread each (10% faster than two
# processes of two threads): Keras 3 on TensorFlow; Keras 2, then
# tests/backends on JAX and on PyTorch. Each pass lists its 15 slowest
# tests; the second lane's log is printed after. The backend passes share
# the .keras files each backend saves (KERAS_POSENC_BACKEND_FILES, kept
# under a digest of the sources), so each backend saves them once.
BACKEND_FILES := $(CURDIR)/.pytest-backend-files
ONE_THREAD := TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1 OMP_NUM_THREADS=1 \
	XLA_FLAGS=--xla_cpu_multi_thread_eigen=false KERAS_POSENC_BACKEND_FILES=$(BACKEND_FILES)
BACKEND_TESTS := tests/backends
test: lint
	@rm -rf $(BACKEND_FILES)
	@( $(ONE_THREAD) TF_USE_LEGACY_KERAS=1 $(PY) -m pytest -q --durations=15 tests; \
	   failed=$$?; \
	   for backend in jax torch; do \
	     echo "--- tests/backends, KERAS_BACKEND=$$backend ---"; \
	     $(ONE_THREAD) KERAS_BACKEND=$$backend $(PY) -m pytest -q --durations=15 \
	       $(BACKEND_TESTS) || failed=1; \
	   done; exit $$failed ) > .pytest-lane2.log 2>&1 & \
	lane2=$$!; \
	$(ONE_THREAD) $(PY) -m pytest -q --durations=15 tests; keras3=$$?; \
	wait $$lane2; lane2=$$?; \
	echo "--- Keras 2 (TF_USE_LEGACY_KERAS=1) ---"; cat .pytest-lane2.log; \
	exit $$(( keras3 || lane2 ))

# One backend's pass of tests/backends (the TensorFlow pass runs it in `make test-keras3`).
test-jax: install
	KERAS_BACKEND=jax $(PY) -m pytest -q $(BACKEND_TESTS)

test-torch: install
	KERAS_BACKEND=torch $(PY) -m pytest -q $(BACKEND_TESTS)

# litert-torch (the second export path, measured by `litert_torch`) only for
# the benchmarks: it pins typing_extensions and pulls transformers.
LITERT_TORCH := $(VENV)/.litert-torch-stamp
$(LITERT_TORCH): $(STAMP)
	$(PY) -m pip install --progress-bar off -e '.[litert_torch]' \
		| sed -u -n -E '/^(Collecting|Successfully installed)/p'
	touch $(LITERT_TORCH)

bench: install $(LITERT_TORCH)
	$(PY) -m benchmarks $(BENCH_ARGS)

bench-quick: install $(LITERT_TORCH)
	$(PY) -m benchmarks --quick $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache $(BACKEND_FILES)
