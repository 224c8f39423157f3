"""The compiled fits of a cross-validation: a grid of candidates over all
folds (``vmap`` over λ and folds, run in blocks of steps), and the model's
arguments as the programs' inputs. Their held-out scores:
:mod:`~numpyro_pvi.selection._score_programs`."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from numpyro.handlers import seed, trace
from numpyro.infer import SVI

from numpyro_pvi._core import (
    CONCRETE_VALUE_ERRORS,
    DataPlate,
    feasible_improper,
    join_arrays,
    split_arrays,
)
from numpyro_pvi.selection._candidates import Grid
from numpyro_pvi.selection._folds import mask_observations

#: Blocks of steps per fit: the progress bar's updates; the last block's
#: mean loss is reported.
_BLOCKS = 20


class ModelData:
    """Model arguments split into array leaves (inputs of the compiled
    programs) and everything else (compile-time constants); with
    ``constant=True`` all of them are constants (no inputs), for models
    that compute with their arguments in Python (:func:`model_data`)."""

    def __init__(self, args: tuple, kwargs: dict, *, constant: bool = False) -> None:
        self.args, self.kwargs, self.constant = args, kwargs, constant
        self._structure, arrays = split_arrays(args, kwargs)
        self.dynamic = [] if constant else [jnp.asarray(x) for x in arrays]

    def rebuild(self, dynamic: list[jax.Array]) -> tuple[tuple, dict]:
        """``(args, kwargs)`` with the array leaves ``dynamic``."""
        if self.constant:
            return self.args, self.kwargs
        return join_arrays(self._structure, dynamic)


def model_data(
    model: Callable, args: tuple, kwargs: dict, rng_key: jax.Array
) -> ModelData:
    """The model's arguments as inputs of the compiled programs, or as
    constants when the model computes with them in Python (``len(np.unique
    (x))``: SVI.run closes over them, and so do the programs then; they are
    compiled for these arguments only)."""
    data = ModelData(args, kwargs)

    def probe(dynamic: list[jax.Array]) -> int:
        a, k = data.rebuild(dynamic)
        trace(seed(feasible_improper(model), rng_key)).get_trace(*a, **k)
        return 0

    try:
        jax.eval_shape(probe, data.dynamic)
    except CONCRETE_VALUE_ERRORS:
        return ModelData(args, kwargs, constant=True)
    except Exception:  # noqa: BLE001 - the programs will say what is wrong
        pass
    return data


class GridProgram(NamedTuple):
    """The lowered programs of one grid's fits and their inputs."""

    grid: Grid
    init: Any  # lowered, then compiled: inputs -> states
    run: Any  # lowered, then compiled: (states, n, *inputs) -> (states, loss, params)
    inputs: tuple


def lower_grid(
    grid: Grid,
    model: Callable,
    guide: Callable,
    optim: Any,
    plate: DataPlate,
    keeps: jax.Array,
    rng_key: jax.Array,
    data: ModelData,
) -> GridProgram:
    """Trace and lower the fits of every λ of ``grid`` on every fold's
    complement (``keeps``, ``(K, N)``) from the same key: a ``vmap`` over λ
    and folds, ``n`` steps per call (a traced count)."""
    values = jnp.asarray(grid.values, dtype=jnp.result_type(float))

    def svi(value: jax.Array, keep: jax.Array) -> SVI:
        assert plate.selector is not None  # cross-validation has a data plate
        masked = mask_observations(model, keep=keep, data_plate=plate.selector)
        return SVI(masked, guide, optim, loss=grid.make_loss(value))

    def over_fits(f: Callable, *rest: Any) -> Any:  # λ outer, folds inner
        inner = jax.vmap(f, in_axes=(None, 0, None) + (0,) * len(rest))
        return jax.vmap(inner, in_axes=(0, None, None) + (0,) * len(rest))

    # keys, folds and data are inputs, not constants: a second call with
    # other ones runs the same program (cached when a compilation cache is on)
    def init(values: jax.Array, keeps: jax.Array, key: jax.Array, dynamic: list):
        args, kwargs = data.rebuild(dynamic)

        def one(value: jax.Array, keep: jax.Array, key: jax.Array) -> Any:
            return svi(value, keep).init(key, *args, **kwargs)

        return over_fits(one)(values, keeps, key)

    def run(states: Any, n: jax.Array, values, keeps, key, dynamic: list):
        args, kwargs = data.rebuild(dynamic)

        def one(value: jax.Array, keep: jax.Array, key: jax.Array, state: Any):
            s = svi(value, keep)
            s.init(key, *args, **kwargs)  # sets s up; the result is unused

            def step(_: Any, carry: tuple) -> tuple:
                state, total = carry
                state, loss = s.update(state, *args, **kwargs)
                return state, total + loss

            state, total = lax.fori_loop(0, n, step, (state, jnp.zeros(())))
            return state, total / n, s.get_params(state)

        return over_fits(one, states)(values, keeps, key, states)

    inputs = (values, keeps, rng_key, data.dynamic)
    init_lowered = jax.jit(init).lower(*inputs)
    states = jax.eval_shape(init, *inputs)
    count = jax.ShapeDtypeStruct((), jnp.int32)
    return GridProgram(
        grid, init_lowered, jax.jit(run).lower(states, count, *inputs), inputs
    )


#: XLA's options for the programs of a cross-validation on CPU: the backend
#: (LLVM) optimisation level 1 instead of 2 compiles them in about 60% of
#: the time, and their fits ran as fast (``benchmarks/RESULTS.md``, "CPU
#: programs at backend optimisation level 1"); level 0 runs them 5x slower.
CPU_COMPILER_OPTIONS = {"xla_backend_optimization_level": 1}


def compile_all(lowered: list[Any]) -> list[Any]:
    """Compile lowered programs, as many at once as there are cores (XLA's
    compiler runs outside Python's lock; tracing and lowering stay serial),
    with :data:`CPU_COMPILER_OPTIONS` on CPU."""
    options = CPU_COMPILER_OPTIONS if jax.default_backend() == "cpu" else None
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return list(pool.map(lambda p: p.compile(compiler_options=options), lowered))


def run_grid(
    program: GridProgram, *, num_steps: int, progress_bar: bool
) -> tuple[Any, np.ndarray]:
    """Run a compiled :class:`GridProgram` for ``num_steps`` steps in blocks.

    :return: the fitted parameters with leading axes ``(G, K)`` and the mean
        loss of each fit over its last block of steps (the last 5%),
        ``(G, K)``.
    """
    from tqdm.auto import tqdm

    states = program.init(*program.inputs)
    block = math.ceil(num_steps / _BLOCKS)
    desc = f"CV {', '.join(program.grid.labels)}"
    with tqdm(total=num_steps, disable=not progress_bar, desc=desc) as bar:
        done = 0
        while done < num_steps:
            n = min(block, num_steps - done)
            states, losses, params = program.run(
                states, jnp.asarray(n, jnp.int32), *program.inputs
            )
            done += n
            bar.update(n)
    return params, np.asarray(losses)


def run_grids(
    programs: list[GridProgram], *, num_steps: int, progress_bar: bool
) -> list[tuple[Grid, Any, np.ndarray]]:
    """:func:`run_grid` of every program, as many at once as there are cores
    (each program's steps are small: XLA runs them on one core).

    :return: per program its grid, fitted parameters and final losses.
    """

    def one(program: GridProgram) -> tuple[Grid, Any, np.ndarray]:
        params, losses = run_grid(
            program, num_steps=num_steps, progress_bar=progress_bar
        )
        return program.grid, params, losses

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return list(pool.map(one, programs))
