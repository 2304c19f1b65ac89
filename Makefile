# GPU JupyterHub.  Quick start: `make demo` (the hub on http://127.0.0.1:8000)
# and `make test` (the whole suite).  Everything a fresh Debian machine lacks
# (Docker engine, configurable-http-proxy, directories, PostgreSQL, Chromium)
# is installed by these targets or by the test fixtures.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# Test modules run side by side on this many workers (pytest-xdist); 0 runs them in one process.
TEST_WORKERS ?= 3
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder)
VARIANTS ?= mkl
# What the suite needs from Debian (besides docker.io, which `make docker` installs
# without recommends): installed in one apt transaction before pytest starts, so test
# workers never install side by side.  The fixtures still install what is missing when
# one test module is run by hand; every install goes through devservices/apt-install.sh.
TEST_PACKAGES := debootstrap slapd ldap-utils samba samba-common-bin openssl postgresql \
	chromium chromium-driver systemd openssh-client

.PHONY: help venv deps docker test-packages lint typecheck images install test-cuda-image demo demo-swarm test test-unit test-docs-cli test-integration docs bench bench-replay clean

help:
	@echo "make demo    run the hub on http://127.0.0.1:8000 (Ctrl-C stops it)"
	@echo "make demo-swarm  the same demo on a 2-node Docker Swarm made on this machine"
	@echo "make test    run the whole test suite (unit + integration, real services)"
	@echo "make images  build the notebook images (VARIANTS='mkl cuda') and the hub image (Swarm stack)"
	@echo "make lint    the linter (ruff), also run first by make test"
	@echo "make typecheck  the type checker (mypy on spawner/), run by make test after lint"
	@echo "make docs    build the documentation site into docs/_build/html (warnings are errors)"
	@echo "make bench   run the benchmarks and print their tables"
	@echo "make bench-replay  a lab's week replayed through the pool on a virtual clock (SIZE=small|large SEEDS='1 2 3' PLOTS=DIR; no Docker)"
	@echo "make install install on a server: /opt/jupyterhub-gpu, images, settings, systemd unit (as root)"

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	touch $@

venv: $(VENV)/.installed

# configurable-http-proxy, from the npm registry.
deps: venv
	@command -v configurable-http-proxy >/dev/null || npm install -g --silent configurable-http-proxy

docker:
	bash devservices/docker-up.sh

# The suite's Debian packages, in one transaction (nothing when all are there).
test-packages:
	bash devservices/apt-install.sh --missing-only $(TEST_PACKAGES)

# Debian base + notebook images (VARIANTS="mkl cuda" adds CUDA) + the hub image, then their sizes.
images: venv docker
	images/build-images.sh $(VARIANTS) hub

# A server install (docs/admins/install.md): venv in /opt/jupyterhub-gpu (the system's
# Python; the package from a wheel built out of tree), configurable-http-proxy, the
# images (CUDA too on a GPU host), /etc/jupyterhub-gpu/gpuhub.env if absent, the data
# directory, the systemd unit.  Idempotent; options: hub_config/install.sh --help.
install:
	bash hub_config/install.sh

# The hub on http://127.0.0.1:8000 with a seeded OpenLDAP directory; Ctrl-C stops it.
demo: deps docker
	$(PY) devservices/demo.py

# The same demo on a 2-node Docker Swarm made here (GPU workers in containers,
# PostgreSQL ledger, gpu-swarm); Ctrl-C removes the nodes again.
demo-swarm: deps docker
	$(PY) devservices/demo_swarm.py

# Builds the CUDA image (~2.6 GB of wheels, once) and checks it without a GPU.
test-cuda-image: deps docker
	GPUHUB_TEST_CUDA_IMAGE=1 $(PY) -m pytest tests/integration/test_images_cuda.py $(PYTEST_ARGS)

# Lint (ruff) first: it takes seconds and fails before anything starts.
lint: venv
	$(PY) -m ruff check .

# The type checker on the package (what it checks: [tool.mypy] in pyproject.toml); under a
# minute, before anything starts.
typecheck: venv
	$(PY) -m mypy

test: lint typecheck deps docker test-packages
	$(PY) -m pytest $(XDIST) --durations=20 $(PYTEST_ARGS)

test-unit: venv
	$(PY) -m pytest -m unit $(PYTEST_ARGS)

test-docs-cli: venv
	$(PY) -m pytest -m docs_cli $(PYTEST_ARGS)

test-integration: deps docker test-packages
	$(PY) -m pytest -m integration $(XDIST) $(PYTEST_ARGS)

# The documentation site (Sphinx + MyST); a warning (a broken link, say) fails the build.
docs: venv
	$(PY) -m sphinx -W --keep-going -n -q -b html docs docs/_build/html
	@echo "docs: docs/_build/html/index.html"

bench: deps docker
	@for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# A lab's week replayed through the real pool on a virtual clock (issue 37); no Docker.
# SIZE=large for 64 GPUs on 8 hosts and 300 users.
# SEEDS="1 2 3" for several weeks (one table each, then the product's figures against the goals);
# PLOTS=DIR also writes the weeks' PNGs there.  matplotlib comes from the bench extra.
SIZE ?= small
SEEDS ?= 1
PLOTS ?=
$(VENV)/.bench-installed: $(VENV)/.installed pyproject.toml
	$(PY) -m pip install --quiet -e ".[bench]"
	touch $@

bench-replay: venv $(VENV)/.bench-installed
	$(PY) bench/replay.py --size $(SIZE) --seed $(SEEDS) $(if $(PLOTS),--plots $(PLOTS))

clean:
	rm -rf $(VENV) .cache test-artifacts .pytest_cache docs/_build
