# Quick start on a fresh machine: `make demo`, then `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO   := build/demo

export TF_CPP_MIN_LOG_LEVEL ?= 3
export PYTHONWARNINGS ?= ignore

.PHONY: install bytecode samples demo test test-corpus test-fast test-samples bench clean

install: $(STAMP)

# Re-installs only when pyproject.toml, the version or the C extension changes.
$(STAMP): pyproject.toml exportkit/version.py exportkit/compare/_log_bins.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The bytecode of the project's own modules, written by hand: where PYTHONDONTWRITEBYTECODE=1 is set (as on these CI
# machines) no process writes it, and every one of the suite's few hundred CLI processes compiled the modules it
# imports again (~0.15 CPU-s each). compileall writes only what changed.
bytecode: install
	$(PY) -m compileall -q exportkit tests sample_models

samples: bytecode
	$(PY) sample_models/build_samples.py --out build/samples

demo: samples
	rm -rf $(DEMO)
	$(VENV)/bin/exportkit export build/samples/mixed_functional.keras -o $(DEMO)/ranker \
	    --custom-objects sample_models.custom_layers --python-path .
	$(VENV)/bin/exportkit verify $(DEMO)/ranker
	$(VENV)/bin/exportkit inspect $(DEMO)/ranker
	@echo "SavedModel ready: $(DEMO)/ranker/1"

# Two pytest workers, one per core: the suite waits on TensorFlow imports and child processes a lot, and one
# process left a core idle (21.9 min serial vs the 12-minute budget). Whole files go to one worker (loadfile), so
# module fixtures are built once.
XDIST := -n 2 --dist loadfile

test: bytecode
	$(PY) -m pytest -q $(XDIST) tests -m "not corpus"

# The whole tf_keras corpus (tests/tfkeras_corpus: every format in both Kerases, ~40 s an entry); `make test` runs
# one entry per way of writing a source.
test-corpus: bytecode
	$(PY) -m pytest -q $(XDIST) tests/test_tfkeras_corpus.py

# The quick loop while developing: everything but the tests marked slow (exports, servers, extra processes).
test-fast: bytecode
	$(PY) -m pytest -q $(XDIST) tests -m "not slow"

# The sample builders' own tests (sample_models/tests), not part of exportkit's suite.
test-samples: bytecode
	$(PY) -m pytest -q sample_models/tests

bench: samples
	$(PY) benchmarks/bench.py $(BENCH_ARGS)

clean:
	rm -rf build .pytest_cache
