# Two entry points: `make demo` and `make test`. Both create .venv when it is
# missing and install what they need into it.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv

# Every test process (xdist workers, notebook kernels, device subprocesses,
# the documentation build) imports the same ~2,500 modules: with bytecode
# written on first import, later processes load it instead of compiling
# the sources again (pytest's collection: 17 s -> 8 s per process).
unexport PYTHONDONTWRITEBYTECODE
VPY := $(VENV)/bin/python

# Second leg: Python 3.12 with ArviZ 1.x (and the JAX it brings), in its own
# virtual environment. Found on PATH or through pyenv (.ci/find-python).
PYTHON312 ?= $(shell .ci/find-python 3.12)
VENV312 := .venv-py312
VPY312 := $(VENV312)/bin/python
# what the leg runs: the tests marked `py312` (ArviZ containers and
# JAX-version-dependent APIs) and `py312_only` (tutorial 06, run once).

# -n auto: one worker per core; each module is one unit of work (and each
# notebook, corpus program and device subprocess), so that one worker makes
# its fits and compilations once; the units run in tests/conftest.py's order.
PYTEST := -m pytest -q -p no:cacheprovider -n auto --dist loadgroup --no-loadscope-reorder

ifeq ($(PYTHON312),)
LEG312_VENV :=
LEG312_VERSIONS :=
DEFAULT_LEG :=
else
LEG312_VENV := $(VENV312)/.installed-test
LEG312_VERSIONS := $(VENV312)/.versions-checked
DEFAULT_LEG := -m "not py312_only"
endif

.PHONY: demo test test-fast test-default test-float64 test-py312 lint typecheck docs \
	docs-html docs-doctest docs-check checks-and-site release-check chromium bench clean clean-cache

$(VPY):
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(VPY)
	$(VPY) -m pip install --quiet --no-compile -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(VPY)
	$(VPY) -m pip install --quiet --no-compile -e ".[test,docs,dev]"
	touch $(VENV)/.installed $@

demo: $(VENV)/.installed
	$(VPY) tutorials/demo.py

# JAX's persistent compilation cache of the test processes (xdist workers,
# notebook kernels, device subprocesses, the doctests), kept between runs and
# shared by every clone on the machine, as pip keeps its wheels: a run loads
# the programs an earlier run compiled (HLO, compile options, JAX, jaxlib and
# the CPU in the key) instead of compiling them. Unused entries are pruned
# after two weeks, and the whole cache when it passes JAX_CACHE_MAX_MB;
# `make clean-cache` empties it, JAX_CACHE= (empty) runs without it.
JAX_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/numpyro-pvi/jax
JAX_CACHE_MAX_MB ?= 2048
ifneq ($(JAX_CACHE),)
TEST_ENV := JAX_COMPILATION_CACHE_DIR=$(JAX_CACHE) JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
PRUNE_CACHE := .ci/prune-cache $(JAX_CACHE) $(JAX_CACHE_MAX_MB)
else
TEST_ENV :=
PRUNE_CACHE := true
endif

# After every change: every module's unit and contract tests (CONTRIBUTING.md).
test-fast: $(VENV)/.installed-test
	$(VPY) -m ruff check numpyro_pvi tests benchmarks tutorials docs .ci
	$(PRUNE_CACHE)
	$(TEST_ENV) $(VPY) $(PYTEST) -m "not slow"

# Everything: the two virtual environments (and Chromium) are installed side
# by side, the 3.12 one's versions checked as soon as it is; then the checks
# that are not test legs, on the two cores: the release check (a wheel
# installed in a fresh environment, mostly pip) on one; lint, types, the
# documentation (HTML, then the doctests) and the site check one after the
# other on the other, so a lint or type error stops the run first (the site
# check takes the first core when the release check leaves it). Then the
# test legs, one after the other: oversubscribed cores slow the four-device
# subprocesses (their collectives wait on every device's thread) 3-5 times,
# more than the idle ends of a leg cost (benchmarks/RESULTS.md, "Seventh
# pass").
test:
	$(MAKE) -j2 $(VENV)/.installed-test $(LEG312_VERSIONS) chromium
	$(PRUNE_CACHE)
	$(MAKE) -j2 release-check checks-and-site
	$(MAKE) test-default test-float64
	$(MAKE) test-py312

checks-and-site:
	$(MAKE) lint typecheck docs docs-check

# The default leg: every test, fast and slow tiers.
test-default: $(VENV)/.installed-test
	$(TEST_ENV) $(VPY) $(PYTEST) --durations=15 $(DEFAULT_LEG)

# The float64 rerun of what float32 cannot show.
test-float64: $(VENV)/.installed-test
	$(TEST_ENV) JAX_ENABLE_X64=1 $(VPY) $(PYTEST) -m numerics

$(VENV312)/.installed-test: pyproject.toml
	$(PYTHON312) -m venv $(VENV312)
	$(VPY312) -m pip install --quiet --upgrade pip
	$(VPY312) -m pip install --quiet --no-compile -e ".[test]"
	touch $@

# The 3.12 leg's environment has the versions it is for (ArviZ 1.x).
$(LEG312_VERSIONS): $(VENV312)/.installed-test
	$(VPY312) -c "import arviz, jax, sys; print('Python', sys.version.split()[0], \
	    '| ArviZ', arviz.__version__, '| JAX', jax.__version__); \
	    sys.exit(int(arviz.__version__.split('.')[0]) < 1 and 'ArviZ 1.x expected')"
	touch $@

ifeq ($(PYTHON312),)
test-py312:
	@echo "*** SKIPPED: the Python 3.12 / ArviZ 1.x leg: no Python 3.12 found" \
	      "(not on PATH, not in pyenv). Install one to run it. ***" >&2
else
test-py312: $(LEG312_VERSIONS)
	$(TEST_ENV) $(VPY312) $(PYTEST) --durations=10 -m "py312 or py312_only"
endif

# pre-commit's hooks (ruff, ruff format, codespell) on every file; the
# hooks are the venv's own tools, so its bin/ goes first on PATH.
lint: $(VENV)/.installed-test
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VPY) -m pre_commit run --all-files

# mypy on the package (configuration in pyproject.toml). Its incremental
# cache is kept beside JAX's, shared by every clone: mypy reuses an entry only
# when the file's hash and mypy's version and options match (10 s -> 0.5 s).
MYPY_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/numpyro-pvi/mypy
typecheck: $(VENV)/.installed-test
	$(VPY) -m mypy --cache-dir $(MYPY_CACHE)

# The documentation site: warnings (broken cross-references included) are
# errors; the prose's examples run as doctests (from the doctrees the HTML
# build has just read).
docs: docs-html docs-doctest

docs-html: $(VENV)/.installed-test
	$(VPY) -m sphinx -b html -E -W --keep-going -n -q -d docs/_build/doctrees docs docs/_build/html

docs-doctest: docs-html
	$(TEST_ENV) $(VPY) -m sphinx -b doctest -W --keep-going -q -d docs/_build/doctrees \
	    docs docs/_build/doctest

# The site, built, in headless Chromium: internal links, figures, math.
docs-check: docs-html chromium
	$(VPY) docs/check_site.py docs/_build/html

chromium:
	.ci/install-chromium

# sdist and wheel built and checked; the wheel installed in a fresh virtual
# environment outside the repository runs the README's quickstart.
release-check: $(VENV)/.installed-test
	$(TEST_ENV) $(VPY) .ci/check_release.py

# POSTERIORDB: directory of the posteriordb JSON data (default: the shared
# data directory beside the repository).
POSTERIORDB ?= ../shared/data/posteriordb
# SLCP: sbibm's slcp directory (num_observation_N/ with reference draws).
SLCP ?= ../shared/data/sbibm/slcp

$(VENV)/.installed-bench: pyproject.toml | $(VPY)
	$(VPY) -m pip install --quiet --no-compile -e ".[bench]"
	touch $(VENV)/.installed $@

bench: $(VENV)/.installed-bench
	$(VPY) -m benchmarks.step_time
	$(VPY) -m benchmarks.posteriordb $(POSTERIORDB)
	$(VPY) -m benchmarks.slcp $(SLCP)

clean:
	rm -rf $(VENV) $(VENV312) build dist *.egg-info .pytest_cache .ruff_cache .cache \
	    docs/_build docs/api/generated

clean-cache:
	rm -rf $(JAX_CACHE) $(MYPY_CACHE)
