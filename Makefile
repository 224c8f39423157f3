# Two entry points: `make demo` and `make test`. Both create .venv when it is
# missing and install what they need into it.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
VPY := $(VENV)/bin/python

# Second leg: Python 3.12 with ArviZ 1.x (and the JAX it brings), in its own
# virtual environment. Found on PATH or through pyenv (.ci/find-python).
PYTHON312 ?= $(shell .ci/find-python 3.12)
VENV312 := .venv-py312
VPY312 := $(VENV312)/bin/python
# what the leg runs: every diagnostics and export test (calibration tests,
# report, predictive calibration's container and plots, heterogeneity), the
# tutorial that reads the diagnostics' containers most, and
# cross-validation's result and its equality with separately fitted folds
# (JAX 1.x-era APIs), the flow guide's diagnostics (flowjax on that JAX)
LEG312_TUTORIALS := 06_did_it_work
LEG312_TESTS := tests/test_arviz_generations.py tests/test_psis.py \
	tests/test_nan_and_zero_density.py tests/test_held_out.py \
	tests/test_export.py tests/test_vsbc.py tests/test_diagnostics_edges.py \
	"tests/test_calibration_tests.py::test_band_is_arviz_simultaneous_band" \
	tests/test_report.py tests/test_comparison.py tests/test_programs.py \
	"tests/test_predictive_calibration.py::test_layout_and_plots_agree_with_the_verdicts" \
	"tests/test_heterogeneity.py::test_binary_logistic_regression_flags_nothing_and_says_why[False]" \
	"tests/test_selection.py::test_result_reading_and_plot" \
	"tests/test_selection.py::test_cv_equals_separately_fitted_folds[local_latent-log]" \
	"tests/test_flow.py::test_psis_and_export_at_the_exact_posterior" \
	"tests/test_flow.py::test_vsbc_runs_with_the_flow" \
	$(foreach nb,$(LEG312_TUTORIALS),\
	"tests/test_tutorials.py::test_notebook_executes_in_smoke_mode[$(nb)]")

ifeq ($(PYTHON312),)
LEG312_VENV :=
else
LEG312_VENV := $(VENV312)/.installed-test
endif

.PHONY: demo test test-default test-py312 lint bench clean

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

# The two virtual environments are installed side by side, then the legs run
# one after the other.
test:
	$(MAKE) -j2 $(VENV)/.installed-test $(LEG312_VENV)
	$(MAKE) test-default
	$(MAKE) test-py312

# Tests are spread over two xdist workers one by one, except those marked
# with the same `xdist_group` (module-scoped fixtures), which share a worker.
test-default: $(VENV)/.installed-test
	$(VPY) -m ruff check numpyro_pvi tests benchmarks tutorials
	$(VPY) -m pytest -q -n 2 --dist loadgroup --durations=15
	JAX_ENABLE_X64=1 $(VPY) -m pytest -q -n 2 --dist loadgroup -m numerics

$(VENV312)/.installed-test: pyproject.toml
	$(PYTHON312) -m venv $(VENV312)
	$(VPY312) -m pip install --quiet --upgrade pip
	$(VPY312) -m pip install --quiet --no-compile -e ".[test]"
	touch $@

ifeq ($(PYTHON312),)
test-py312:
	@echo "*** SKIPPED: the Python 3.12 / ArviZ 1.x leg: no Python 3.12 found" \
	      "(not on PATH, not in pyenv). Install one to run it. ***" >&2
else
test-py312: $(VENV312)/.installed-test
	$(VPY312) -c "import arviz, jax, sys; print('Python', sys.version.split()[0], \
	    '| ArviZ', arviz.__version__, '| JAX', jax.__version__); \
	    sys.exit(int(arviz.__version__.split('.')[0]) < 1 and 'ArviZ 1.x expected')"
	$(VPY312) -m pytest -q -n 2 --dist loadgroup --durations=10 $(LEG312_TESTS)
endif

lint: $(VENV)/.installed-test
	$(VPY) -m ruff check numpyro_pvi tests benchmarks tutorials
	$(VPY) -m ruff format --check numpyro_pvi tests benchmarks

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
	rm -rf $(VENV) $(VENV312) build dist *.egg-info .pytest_cache .ruff_cache
