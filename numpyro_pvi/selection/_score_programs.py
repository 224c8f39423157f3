"""The compiled held-out scores of a cross-validation's fits: the pointwise
score of every fit's predictive at every observation (blocks of fits run at
once on the cores) and, for scores whose mixture score is quadratic in the
weights, the pairwise gains of stacking."""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from numpyro.handlers import substitute

from numpyro_pvi._trace.autoguide_setup import traceable_guide
from numpyro_pvi._trace.data_plate import DataPlate
from numpyro_pvi._trace.particles import ParticleSpec, particle_terms
from numpyro_pvi.evaluation.held_out import Pointwise, observation_subset, pair_gain
from numpyro_pvi.evaluation.scoring import PointwiseEstimate
from numpyro_pvi.scores import Score
from numpyro_pvi.selection._programs import ModelData


class HeldOut(NamedTuple):
    """Each fold's observations, the only ones its fits are scored at:
    ``observations`` ``(K, n)`` their indices along the data plate (``n``
    the largest fold's size; shorter folds repeat their last index) and
    ``position`` ``(N,)`` where each observation is in its fold's row."""

    observations: np.ndarray
    position: np.ndarray

    @classmethod
    def of(cls, folds: np.ndarray) -> HeldOut:
        members = [np.flatnonzero(folds == k) for k in range(int(folds.max()) + 1)]
        size = max(len(m) for m in members)
        rows = np.stack([np.resize(m, size) for m in members]).astype(np.int32)
        position = np.zeros(folds.shape, np.int32)
        for m in members:
            position[m] = np.arange(len(m))
        return cls(rows, position)


def pointwise_scorer(
    model: Callable,
    guide: Callable,
    plate: DataPlate,
    score: Score,
    num_draws: int,
    data: ModelData,
) -> Callable:
    """``scorer(key, params, dynamic, index) -> Pointwise`` of ``(n,)``
    arrays: the score of the fit's posterior predictive at the observations
    ``index`` ``(n,)`` of the data plate, with its error."""
    spec = ParticleSpec(
        num_draws,
        score.requires,
        plate.selector,
        objective="cross_validate",
        require_reparam=False,
        held_out=True,
    )

    def draw(key, params, model, guide, args, kwargs):  # noqa: ANN001, ANN202
        return (particle_terms(key, params, model, guide, args, kwargs, spec),)

    return _at_observations(model, guide, plate, data, draw, PointwiseEstimate(score))


def pair_gain_scorer(
    model: Callable,
    guide: Callable,
    plate: DataPlate,
    score: Score,
    num_draws: int,
    data: ModelData,
) -> Callable:
    """``scorer(key, (params_a, params_b), dynamic, index) -> (n,)``: the
    quadratic coefficient of the score of the mixture of two fits'
    predictives at the observations ``index``
    (:func:`~numpyro_pvi.evaluation.held_out.pair_gain`), from the draws
    :func:`pointwise_scorer` makes with the same key."""
    spec = ParticleSpec(
        num_draws,
        score.requires,
        plate.selector,
        objective="cross_validate",
        require_reparam=False,
        held_out=True,
    )

    def draw(key, params, model, guide, args, kwargs):  # noqa: ANN001, ANN202
        return tuple(
            particle_terms(key, p, model, guide, args, kwargs, spec) for p in params
        )

    return _at_observations(
        model, guide, plate, data, draw, functools.partial(pair_gain, score)
    )


def _at_observations(
    model: Callable,
    guide: Callable,
    plate: DataPlate,
    data: ModelData,
    draw: Callable,
    reduce: Callable,
) -> Callable:
    """``scorer(key, params, dynamic, index)``: ``reduce(*terms)`` of the
    particle terms ``draw(key, params, model, guide, args, kwargs)`` at the
    observations ``index`` of the data plate. The terms of a whole plate are
    cut to those observations
    (:func:`~numpyro_pvi.evaluation.held_out.observation_subset`)
    before the reduction; a subsampled data plate is drawn in batches of its
    subsample size with the plate's indices substituted, so the model runs
    as written."""
    if plate.subsample_size == plate.size:

        def scorer(key: jax.Array, params: Any, dynamic: list, index: jax.Array):  # noqa: ANN202
            args, kwargs = data.rebuild(dynamic)
            terms = draw(key, params, model, traceable_guide(guide), args, kwargs)
            return reduce(*(observation_subset(t, index) for t in terms))

        return scorer
    b = plate.subsample_size

    def batched(key: jax.Array, params: Any, dynamic: list, index: jax.Array):  # noqa: ANN202
        args, kwargs = data.rebuild(dynamic)
        traced = traceable_guide(guide)  # the prototype stays in this trace

        def batch(idx: jax.Array) -> Any:
            sub = {plate.name: idx}
            terms = draw(
                key,
                params,
                substitute(model, data=sub),
                substitute(traced, data=sub),
                args,
                kwargs,
            )
            return reduce(*terms)

        n = index.shape[0]
        out = lax.map(batch, jnp.resize(index, (-(-n // b), b)))
        return jax.tree.map(lambda x: jnp.reshape(x, -1)[:n], out)

    return batched


def lower_scores(
    scorer: Callable,
    rng_key: jax.Array,
    params: list[Any],
    held_out: HeldOut,
    data: ModelData,
) -> Any:
    """Lower the scoring of a block of fits at their held-out observations,
    one fit after another (``lax.map``: memory of one fit's draws), for
    :func:`run_scores`. ``params``: every grid's fits' shapes, with leading
    axes ``(G, K)``; a block is :func:`_score_block` of them."""
    block = _score_block(params)

    def run(key: jax.Array, fits: Any, index: jax.Array, dynamic: list) -> Any:
        return lax.map(lambda x: scorer(key, x[0], dynamic, x[1]), (fits, index))

    fits = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct((block,) + tuple(x.shape[2:]), x.dtype),
        params[0],
    )
    index = jax.ShapeDtypeStruct((block, held_out.observations.shape[1]), jnp.int32)
    return jax.jit(run).lower(rng_key, fits, index, data.dynamic)


def _score_block(params: list[Any]) -> int:
    """Fits per call of the scoring program: all ``sum G · K`` fits in as
    many blocks as there are cores."""
    total = sum(math.prod(jax.tree.leaves(p)[0].shape[:2]) for p in params)
    return -(-total // min(os.cpu_count() or 1, total))


def run_scores(
    program: Any,
    rng_key: jax.Array,
    params: list[Any],
    held_out: HeldOut,
    dynamic: list,
) -> Pointwise:
    """Every grid's fits (leading axes ``(G, K)``) scored at their fold's
    observations by the compiled :func:`lower_scores` program, its blocks at
    once on the cores (the last block padded with the last fit): a
    ``Pointwise`` of ``(sum G · K, n)`` arrays, in grid, λ and fold order
    (:class:`HeldOut`'s rows)."""
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
    num_folds = held_out.observations.shape[0]  # the fold is the fastest axis
    index = held_out.observations[
        np.minimum(np.arange(total + pad), total - 1) % num_folds
    ]

    def one(start: int) -> Any:
        fits = jax.tree.map(lambda x: x[start : start + block], padded)
        rows = index[start : start + block]
        return jax.device_get(program(rng_key, fits, rows, dynamic))

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
    ``meta`` ``(P, 3)`` rows ``(c, d, fold)`` of candidate indices, and
    ``observations`` ``(P, n)`` the fold's observations (:class:`HeldOut`)."""

    #: lowered, then compiled: (key, params, pairs, index, dynamic) -> (P, n)
    program: Any
    pairs: np.ndarray
    meta: np.ndarray
    observations: np.ndarray

    def gains(
        self, out: Any, folds: np.ndarray, held_out: HeldOut, num_candidates: int
    ) -> np.ndarray:
        """``(C, C, N)``: the gain of every pair of candidates at every
        observation, from the fits without the observation's fold
        (symmetric, zero diagonal)."""
        out = np.asarray(out)
        gains = np.zeros((num_candidates, num_candidates, folds.size), out.dtype)
        for row, (c, d, k) in zip(out, self.meta, strict=True):
            held = folds == k
            gains[c, d, held] = gains[d, c, held] = row[held_out.position[held]]
        return gains


def lower_pair_gains(
    scorer: Callable,
    rng_key: jax.Array,
    params: list[Any],
    labels: list[list[str]],
    order: list[str],
    held_out: HeldOut,
    data: ModelData,
) -> PairGains:
    """Lower the pairwise gains of the candidates ``order`` (every pair,
    every fold, at the fold's observations; ``labels``: each grid's labels,
    the layout of ``params``) in one program, one pair after another."""
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

    observations = held_out.observations[meta[:, 2]]

    def run(key, params, pairs, index, dynamic):  # noqa: ANN001, ANN202
        fits = _flat(params)

        def one(x: tuple) -> jax.Array:
            pair, rows = x
            a, b = (jax.tree.map(lambda x, i=i: x[pair[i]], fits) for i in (0, 1))
            return scorer(key, (a, b), dynamic, rows)

        return lax.map(one, (pairs, index))

    lowered = jax.jit(run).lower(rng_key, params, pairs, observations, data.dynamic)
    return PairGains(lowered, pairs, meta, observations)


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
