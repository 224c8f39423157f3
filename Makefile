# Two entry points: `make demo` and `make test`. Both create .venv when it is
# missing and install what they need into it.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
VPY := $(VENV)/bin/python

.PHONY: demo test lint bench clean

$(VPY):
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(VPY)
	$(VPY) -m pip install --quiet --no-compile -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(VPY)
	$(VPY) -m pip install --quiet --no-compile -e ".[test]"
	touch $(VENV)/.installed $@

demo: $(VENV)/.installed
	$(VPY) -m numpyro_pvi.demo

# Tests are spread over two xdist workers one by one, except those marked
# with the same `xdist_group` (module-scoped fixtures), which share a worker.
test: $(VENV)/.installed-test
	$(VPY) -m ruff check numpyro_pvi tests benchmarks tutorials
	$(VPY) -m pytest -q -n 2 --dist loadgroup
	JAX_ENABLE_X64=1 $(VPY) -m pytest -q -n 2 --dist loadgroup -m numerics

lint: $(VENV)/.installed-test
	$(VPY) -m ruff check numpyro_pvi tests benchmarks tutorials
	$(VPY) -m ruff format --check numpyro_pvi tests benchmarks

# POSTERIORDB: directory of the posteriordb JSON data (default: the shared
# data directory beside the repository).
POSTERIORDB ?= ../shared/data/posteriordb

bench: $(VENV)/.installed
	$(VPY) -m benchmarks.step_time
	$(VPY) -m benchmarks.posteriordb $(POSTERIORDB)

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache
