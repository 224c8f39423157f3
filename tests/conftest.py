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
import collections
import contextlib
import gc
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
# NumPyro's Trace_ELBO (and any code iterating over a set of site names)
# orders its operations by Python's string hash: with the hash seed fixed,
# one program lowers to the same module in every process of the run and of
# later runs, so the compilation cache finds it. The processes this one
# starts (xdist workers, notebook kernels, subprocesses) inherit it.
os.environ.setdefault("PYTHONHASHSEED", "0")

import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import pytest  # noqa: E402

numpyro.set_platform("cpu")
if os.environ.get("JAX_ENABLE_X64", "0") not in ("", "0", "false", "False"):
    numpyro.enable_x64()

import jax  # noqa: E402

from tests.collector import settle  # noqa: E402

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


#: Units of work that are not a module, scheduled first (in this order): the
#: four-device subprocesses (shared by tests of two modules), the tutorial
#: notebooks (one kernel each), the programs of the corpus (one group each).
_LONGEST_FIRST = ("four_devices", "notebook-", "program-")


def _unit(item: pytest.Item) -> str:
    """The item's unit of work under ``--dist loadgroup``: its ``xdist_group``
    if it names one, its module otherwise."""
    group = item.get_closest_marker("xdist_group")
    return group.args[0] if group else item.module.__name__


def _schedule_rank(unit: str) -> int:
    ranks = [i for i, name in enumerate(_LONGEST_FIRST) if unit.startswith(name)]
    return min(ranks, default=len(_LONGEST_FIRST))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """One unit of work per module: under ``--dist loadgroup`` a module's
    tests run in one worker, so that its module-scoped fits and the
    compilations its shapes need are made once. (Eager operations are
    compiled once per new shape per process, and lowering, which the
    compilation cache does not save, is most of a test's time.)

    The units run longest first (the subprocesses, then the notebooks and
    the corpus, then the modules with the most tests), so that short ones
    fill in the end of both workers; the Makefile passes
    ``--no-loadscope-reorder`` to keep this order."""
    units = {id(item): _unit(item) for item in items}
    sizes = collections.Counter(units.values())
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(units[id(item)]))
    items.sort(
        key=lambda item: (_schedule_rank(units[id(item)]), -sizes[units[id(item)]])
    )


def pytest_collection_finish(session):
    """Once the test modules (and JAX, NumPyro, ArviZ, ...) are imported,
    the collector settings of ``tests/collector.py``."""
    settle()


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


def _memory_maps() -> tuple[int, int] | None:
    """This process's memory maps and the kernel's limit on them (Linux), or
    ``None`` where ``/proc`` does not say."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            count = sum(1 for _ in maps)
        with open("/proc/sys/vm/max_map_count") as limit:
            return count, int(limit.read())
    except (OSError, ValueError):
        return None


def _resident_memory() -> tuple[int, int] | None:
    """This process's resident memory and the machine's, in bytes (Linux),
    or ``None`` where ``/proc`` does not say."""
    try:
        with open("/proc/self/statm") as statm:
            resident = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
    return resident, total


@pytest.fixture(autouse=True, scope="module")
def _bounded_memory_maps():
    """Each compiled program JAX keeps loaded holds about three memory maps
    (its code and data), and a process that reaches the kernel's limit
    (``vm.max_map_count``, 65,530 by default) segfaults at the next load. A
    worker that has run many modules drops its compiled programs
    (``jax.clear_caches()``) at the end of a module once it holds more than
    half the limit, or more than a quarter of the machine's memory, and
    collects them at once (the collector runs seldom here:
    ``tests/collector.py``); the next module loads what it needs from the
    compilation cache."""
    yield
    maps, memory = _memory_maps(), _resident_memory()
    if (maps is not None and maps[0] > maps[1] // 2) or (
        memory is not None and memory[0] > memory[1] // 4
    ):
        jax.clear_caches()
        gc.collect()


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
    from numpyro_pvi._trace.particles import ParticleSpec, particle_terms

    if vectorize_particles_fn is not None:
        options["vectorize"] = vectorize_particles_fn
    spec = ParticleSpec(num_particles, frozenset(requests), **options)
    return particle_terms(
        key, params, model, guide, args, kwargs, spec, plate_key=plate_key
    )
