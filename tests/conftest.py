"""Test configuration: CPU only, fixed seeds, float64 on request.

The numerics tests (marker ``numerics``) run a second time with
``JAX_ENABLE_X64=1``; ``make test`` does both.

Compilation, not run time, dominates most tests (small models, few steps):

* they compile with ``JAX_DISABLE_MOST_OPTIMIZATIONS=1`` and XLA's CPU
  loop emitters instead of its fusion emitters
  (``--xla_cpu_use_fusion_emitters=false``), as the tutorial smoke runs do:
  this halves compile times. Tests marked ``optimized`` (and fixtures inside
  ``with xla_optimizations():``) run long optimisation loops and compile
  with XLA's optimisations;
* source locations are left out of the lowered programs
  (``JAX_TRACEBACK_IN_LOCATIONS_LIMIT=0``; they serve XLA dumps and
  profiles, not tests): lowering is about 5% faster;
* every process of one test run (xdist workers, notebook kernels,
  subprocesses) shares one persistent compilation cache, so a computation
  compiled once is loaded, not compiled again: ``make test`` and ``make
  test-fast`` keep it between runs in ``~/.cache/numpyro-pvi/jax``
  (``JAX_COMPILATION_CACHE_DIR``); a plain ``pytest`` uses a temporary
  directory for the run.

All are defaults: set the environment variables to override them. They are
read when JAX is imported: a pytest plugin that imports JAX before this file
(e.g. a profiler's) leaves the main process with JAX's own defaults.
"""

import atexit
import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def _load_tutorial_runner():
    """``tutorials/execute.py`` (notebook runner and fast-compile flag), or
    ``None`` without the notebook test dependencies."""
    path = Path(__file__).resolve().parents[1] / "tutorials" / "execute.py"
    spec = importlib.util.spec_from_file_location("_tutorials_execute", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError:
        return None
    return module


TUTORIAL_RUNNER = _load_tutorial_runner()


os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
os.environ.setdefault("JAX_TRACEBACK_IN_LOCATIONS_LIMIT", "0")
os.environ.setdefault("JAX_INCLUDE_FULL_TRACEBACKS_IN_LOCATIONS", "false")
# decided once per run: xdist workers and subprocesses inherit the result
if TUTORIAL_RUNNER is not None:
    TUTORIAL_RUNNER.add_fast_compile_flag(os.environ)
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="numpyro-pvi-tests-jax-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import pytest  # noqa: E402

numpyro.set_platform("cpu")
if os.environ.get("JAX_ENABLE_X64", "0") not in ("", "0", "false", "False"):
    numpyro.enable_x64()

import jax  # noqa: E402

X64 = bool(jax.config.jax_enable_x64)


@contextlib.contextmanager
def xla_optimizations():
    """Compile with XLA's optimisations inside the block (long-running loops)."""
    previous = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", False)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", previous)


@pytest.fixture(autouse=True)
def _optimized_marker(request):
    if request.node.get_closest_marker("optimized") is None:
        yield
    else:
        with xla_optimizations():
            yield


#: The longest units of work, scheduled first (in this order): the sharding
#: groups (four-device subprocesses, up to a minute each), the tutorial
#: notebooks.
_LONGEST_FIRST = ("four_devices", "four_devices_vsbc", "test_tutorials")


def _schedule_rank(item: pytest.Item) -> int:
    group = item.get_closest_marker("xdist_group")
    names = {item.module.__name__} | ({group.args[0]} if group else set())
    ranks = [i for i, name in enumerate(_LONGEST_FIRST) if name in names]
    return min(ranks, default=len(_LONGEST_FIRST))


def pytest_collection_modifyitems(items):
    """The longest units of work go first: under ``--dist loadgroup`` the
    short tests then fill in the end of both workers."""
    items.sort(key=_schedule_rank)


@pytest.fixture(scope="session")
def tutorial_runner():
    """The module ``tutorials/execute.py`` (``execute_notebook``)."""
    if TUTORIAL_RUNNER is None:
        pytest.skip("the notebook runner needs nbformat and nbclient")
    return TUTORIAL_RUNNER


def _run_sharding_worker(part: str) -> dict:
    """The JSON results of ``sharding_worker.py 4 <part>``, run in a
    subprocess with four host devices."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    )
    env["JAX_PLATFORMS"] = "cpu"
    out = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).with_name("sharding_worker.py")),
            "4",
            part,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if out.returncode:
        raise AssertionError(out.stderr[-4000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def four_devices():
    """The objectives on sharded data (four host devices), run once. Tests
    that use it share the ``xdist_group`` ``"four_devices"``, so that one
    worker runs it."""
    return _run_sharding_worker("objectives")


@pytest.fixture(scope="session")
def four_devices_vsbc():
    """VSBC dispatched over four host devices, run once (``xdist_group``
    ``"four_devices_vsbc"``)."""
    return _run_sharding_worker("vsbc")


@pytest.fixture(autouse=True)
def _fixed_seed():
    np.random.seed(0)
    yield


def run_particles(
    key,
    params,
    model,
    guide,
    args,
    kwargs,
    *,
    num_particles,
    requests=("log_lik",),
    vectorize_particles_fn=None,
    plate_key=None,
    **options,
):
    """``particle_terms`` with its spec given as keywords (tests only)."""
    from numpyro_pvi._core import ParticleSpec, particle_terms

    if vectorize_particles_fn is not None:
        options["vectorize"] = vectorize_particles_fn
    spec = ParticleSpec(num_particles, frozenset(requests), **options)
    return particle_terms(
        key, params, model, guide, args, kwargs, spec, plate_key=plate_key
    )
