"""The compiled programs of a cross-validation: fits of a grid of candidates
over all folds (``vmap`` over λ and folds, run in blocks), and the held-out
pointwise scores of the fits."""

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
from numpyro.handlers import seed, substitute, trace
from numpyro.infer import SVI

from numpyro_pvi._core import (
    CONCRETE_VALUE_ERRORS,
    DataPlate,
    ParticleSpec,
    Pointwise,
    feasible_improper,
    guide_draws,
    join_arrays,
    pair_gain,
    particle_terms,
    split_arrays,
)
from numpyro_pvi.evaluation import PointwiseEstimate
from numpyro_pvi.scores import Score
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


def pointwise_scorer(
    model: Callable,
    guide: Callable,
    plate: DataPlate,
    score: Score,
    num_draws: int,
    data: ModelData,
) -> Callable:
    """``scorer(key, params, dynamic) -> Pointwise`` of ``(N,)`` arrays: the
    score of the fit's posterior predictive at every observation of the
    data plate, with its error."""
    spec = ParticleSpec(
        num_draws, score.requires, plate.selector, objective="cross_validate"
    )
    reduce = PointwiseEstimate(score)

    def one(key, params, model, guide, args, kwargs):  # noqa: ANN001, ANN202
        return guide_draws(key, params, model, guide, args, kwargs, spec, reduce=reduce)

    return _over_data_plate(model, guide, plate, data, one)


def pair_gain_scorer(
    model: Callable,
    guide: Callable,
    plate: DataPlate,
    score: Score,
    num_draws: int,
    data: ModelData,
) -> Callable:
    """``scorer(key, (params_a, params_b), dynamic) -> (N,)``: the quadratic
    coefficient of the score of the mixture of two fits' predictives at
    every observation (:func:`~numpyro_pvi._core.pair_gain`), from the draws
    :func:`pointwise_scorer` makes with the same key."""
    spec = ParticleSpec(
        num_draws,
        score.requires,
        plate.selector,
        objective="cross_validate",
        require_reparam=False,
    )

    def one(key, params, model, guide, args, kwargs):  # noqa: ANN001, ANN202
        a, b = (
            particle_terms(key, p, model, guide, args, kwargs, spec) for p in params
        )
        return pair_gain(score, a, b)

    return _over_data_plate(model, guide, plate, data, one)


def _over_data_plate(
    model: Callable, guide: Callable, plate: DataPlate, data: ModelData, one: Callable
) -> Callable:
    """``scorer(key, params, dynamic)``: ``one(key, params, model, guide, args,
    kwargs)`` at every observation of the data plate. A subsampled data plate
    is scored in batches of its subsample size (the plate's indices
    substituted), so the model runs as written."""
    if plate.subsample_size == plate.size:

        def scorer(key: jax.Array, params: Any, dynamic: list) -> Any:
            args, kwargs = data.rebuild(dynamic)
            return one(key, params, model, guide, args, kwargs)

        return scorer
    b = plate.subsample_size
    num_batches = math.ceil(plate.size / b)
    batches = jnp.resize(jnp.arange(plate.size), (num_batches, b))

    def batched(key: jax.Array, params: Any, dynamic: list) -> Any:
        args, kwargs = data.rebuild(dynamic)

        def batch(idx: jax.Array) -> Any:
            sub = {plate.name: idx}
            return one(
                key,
                params,
                substitute(model, data=sub),
                substitute(guide, data=sub),
                args,
                kwargs,
            )

        out = lax.map(batch, batches)
        return jax.tree.map(lambda x: jnp.reshape(x, -1)[: plate.size], out)

    return batched


def lower_scores(
    scorer: Callable, rng_key: jax.Array, params: list[Any], data: ModelData
) -> Any:
    """Lower the scoring of a block of fits at every observation, one fit
    after another (``lax.map``: memory of one fit's draws), for
    :func:`run_scores`. ``params``: every grid's fits' shapes, with leading
    axes ``(G, K)``; a block is :func:`_score_block` of them."""
    block = _score_block(params)

    def run(key: jax.Array, fits: Any, dynamic: list) -> Any:
        return lax.map(lambda p: scorer(key, p, dynamic), fits)

    fits = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct((block,) + tuple(x.shape[2:]), x.dtype),
        params[0],
    )
    return jax.jit(run).lower(rng_key, fits, data.dynamic)


def _score_block(params: list[Any]) -> int:
    """Fits per call of the scoring program: all ``sum G · K`` fits in as
    many blocks as there are cores."""
    total = sum(math.prod(jax.tree.leaves(p)[0].shape[:2]) for p in params)
    return -(-total // min(os.cpu_count() or 1, total))


def run_scores(
    program: Any, rng_key: jax.Array, params: list[Any], dynamic: list
) -> Pointwise:
    """Every grid's fits (leading axes ``(G, K)``) scored by the compiled
    :func:`lower_scores` program, its blocks at once on the cores (the last
    block padded with the last fit): a ``Pointwise`` of ``(sum G · K, N)``
    arrays, in grid, λ and fold order."""
    flat = jax.tree.map(
        lambda *xs: np.concatenate(
            [np.asarray(x).reshape((-1,) + x.shape[2:]) for x in xs]
        ),
        *params,
    )
    total, block = jax.tree.leaves(flat)[0].shape[0], _score_block(params)
    starts = range(0, total, block)
    pad = len(starts) * block - total
    padded = jax.tree.map(
        lambda x: np.concatenate([x, np.repeat(x[-1:], pad, 0)]), flat
    )

    def one(start: int) -> Any:
        fits = jax.tree.map(lambda x: x[start : start + block], padded)
        return jax.device_get(program(rng_key, fits, dynamic))

    with ThreadPoolExecutor(max_workers=len(starts)) as pool:
        outs = list(pool.map(one, starts))
    return jax.tree.map(lambda *xs: np.concatenate(xs)[:total], *outs)


def _flat(params: list[Any]) -> Any:
    """Every grid's fits along one leading axis (``sum G · K``; grid, λ,
    fold order)."""
    return jax.tree.map(
        lambda *xs: jnp.concatenate([x.reshape((-1,) + x.shape[2:]) for x in xs]),
        *params,
    )


class PairGains(NamedTuple):
    """The program of the pairwise gains of a stacking of the candidates
    (scores whose mixture score is quadratic in the weights) and what it
    reads: ``pairs`` ``(P, 2)`` flat fit indices (the same fold) with
    ``meta`` ``(P, 3)`` rows ``(c, d, fold)`` of candidate indices."""

    program: Any  # lowered, then compiled: (key, params, pairs, dynamic) -> (P, N)
    pairs: np.ndarray
    meta: np.ndarray

    def gains(self, out: Any, folds: np.ndarray, num_candidates: int) -> np.ndarray:
        """``(C, C, N)``: the gain of every pair of candidates at every
        observation, from the fits without the observation's fold
        (symmetric, zero diagonal)."""
        out = np.asarray(out)
        gains = np.zeros((num_candidates, num_candidates, folds.size), out.dtype)
        for row, (c, d, k) in zip(out, self.meta, strict=True):
            held = folds == k
            gains[c, d, held] = gains[d, c, held] = row[held]
        return gains


def lower_pair_gains(
    scorer: Callable,
    rng_key: jax.Array,
    params: list[Any],
    labels: list[list[str]],
    order: list[str],
    data: ModelData,
) -> PairGains:
    """Lower the pairwise gains of the candidates ``order`` (every pair,
    every fold; ``labels``: each grid's labels, the layout of ``params``)
    in one program, one pair after another."""
    num_folds = jax.tree.leaves(params[0])[0].shape[1]
    flat, start = {}, 0
    for grid in labels:
        for g, label in enumerate(grid):
            flat[label] = start + g * num_folds + np.arange(num_folds)
        start += len(grid) * num_folds
    meta = np.array(
        [
            (c, d, k)
            for c in range(len(order))
            for d in range(c + 1, len(order))
            for k in range(num_folds)
        ],
        dtype=np.int32,
    ).reshape(-1, 3)
    pairs = np.array(
        [(flat[order[c]][k], flat[order[d]][k]) for c, d, k in meta], dtype=np.int32
    ).reshape(-1, 2)

    def run(key: jax.Array, params: list[Any], pairs: jax.Array, dynamic: list):
        fits = _flat(params)

        def one(pair: jax.Array) -> jax.Array:
            a, b = (jax.tree.map(lambda x, i=i: x[pair[i]], fits) for i in (0, 1))
            return scorer(key, (a, b), dynamic)

        return lax.map(one, pairs)

    lowered = jax.jit(run).lower(rng_key, params, pairs, data.dynamic)
    return PairGains(lowered, pairs, meta)


def split_scores(scores: Pointwise, params: list[Any]) -> list[Pointwise]:
    """``Pointwise`` of ``(G, K, N)`` arrays per grid from
    :func:`lower_scores`'s output."""
    sizes = [jax.tree.leaves(p)[0].shape[0] for p in params]
    k = jax.tree.leaves(params[0])[0].shape[1]

    def split(x: jax.Array | np.ndarray) -> list[np.ndarray]:
        out = np.asarray(x).reshape((sum(sizes), k, -1))
        return np.split(out, np.cumsum(sizes)[:-1])

    fields = [split(x) for x in scores]
    return [Pointwise(*parts) for parts in zip(*fields, strict=True)]
