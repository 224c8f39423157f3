"""Cross-validation's held-out scores: the unreliable estimates moment
matched (as :func:`~numpyro_pvi.predictive_score` does), named in a warning,
and gathered with the candidates' summaries into the result's
:class:`xarray.Dataset`."""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr
from jax import random
from numpyro.infer.elbo import ELBO

from numpyro_pvi._trace.data_plate import DataPlate
from numpyro_pvi._trace.recipes import FitRecipe
from numpyro_pvi.evaluation.draws import CONCRETE_VALUE_ERRORS
from numpyro_pvi.evaluation.held_out import Pointwise
from numpyro_pvi.evaluation.moment_matching import moment_matcher
from numpyro_pvi.evaluation.psis import good_k
from numpyro_pvi.evaluation.scoring import match_unreliable
from numpyro_pvi.scores import LogScore, Score
from numpyro_pvi.selection._candidates import Grid, grids, lam_coordinates
from numpyro_pvi.selection._programs import ModelData, compile_all, fit_grid, lower_grid
from numpyro_pvi.selection._score_programs import (
    HeldOut,
    lower_pair_gains,
    lower_scores,
    pair_gain_scorer,
    pointwise_scorer,
    run_scores,
    split_scores,
)


def reliable_scores(
    estimates: Pointwise,
    score: Score,
    num_draws: int,
    folds: np.ndarray,
    fold_params: list[Any],
    model: Callable,
    guide: Callable,
    plate: DataPlate,
    data: ModelData,
    rng_key: jax.Array,
) -> tuple[Pointwise, np.ndarray]:
    """One candidate's held-out estimates with those of k̂ ≥ ``good_k``
    re-estimated by moment matching under the fit that held them out, and
    which were."""
    adapted = np.zeros(estimates.score.shape, bool)
    if not isinstance(score, LogScore) or plate.subsample_size < plate.size:
        return estimates, adapted
    threshold = good_k(num_draws)
    for k, params in enumerate(fold_params):
        in_fold = folds == k
        sub = Pointwise(
            *(
                np.where(in_fold, x, np.nan if x.dtype.kind == "f" else False)
                for x in estimates
            )
        )
        matched, fold_adapted = match_unreliable(
            sub,
            threshold,
            functools.partial(
                moment_matcher,
                rng_key,
                params,
                model,
                guide,
                data.args,
                data.kwargs,
                num_draws=num_draws,
                plate=plate.selector,
            ),
            stacklevel=5,  # match_unreliable, here, _held_out, cross_validate
        )
        estimates = Pointwise(
            *(np.where(in_fold, m, e) for m, e in zip(matched, estimates, strict=True))
        )
        adapted |= fold_adapted
    return estimates, adapted


def warn_unreliable(dataset: xr.Dataset, plate: str | None) -> None:
    """Warn of the held-out estimates that stay unreliable, naming them."""
    k = dataset["pareto_k"].values
    bad = np.argwhere(~(k < dataset.attrs["good_k"]) & ~np.isnan(k))
    if bad.size == 0:
        return
    labels = dataset.candidate.values
    shown = ", ".join(
        f"{str(labels[c])!r} at {plate or 'observation'}[{i}] (k̂ {k[c, i]:.2f})"
        for c, i in bad[:10]
    ) + (f" and {len(bad) - 10} more" if len(bad) > 10 else "")
    warnings.warn(
        f"cross_validate: {len(bad)} held-out score(s) are unreliable Monte Carlo "
        f"estimates (k̂ ≥ good_k = {dataset.attrs['good_k']:.2f} after moment "
        f"matching): {shown}. These observations lie far in the tail of the "
        "fits' predictives; their scores are likely too low. Increase "
        "FitRecipe(num_draws=...).",
        UserWarning,
        stacklevel=3,  # the user's call: warn_unreliable, cross_validate
    )


def scores_dataset(
    candidates: dict[str, ELBO],
    held_out: dict[str, tuple[Pointwise, np.ndarray]],
    final_loss: dict[str, np.ndarray],
    folds: np.ndarray,
    reference: str | None,
) -> xr.Dataset:
    """The scores as an ``xarray.Dataset`` (see :class:`CrossValidation`).

    Observations that masks remove entirely are left out of every mean and
    standard error (``observed`` is ``False`` there)."""
    labels = list(candidates)
    # float64: the summaries square the scores (a fit that diverged scores
    # around -1e20, whose square overflows float32)
    pointwise = np.stack([held_out[c][0].score for c in labels]).astype(float)  # (C, N)
    observed = held_out[labels[0]][0].observed
    n_obs, k = int(observed.sum()), int(folds.max()) + 1
    kept = pointwise[:, observed]
    in_fold = (folds[None, :] == np.arange(k)[:, None]) & observed  # (K, N)
    fold_score = (np.where(observed, pointwise, 0.0) @ in_fold.T) / in_fold.sum(1)
    regs, lams = lam_coordinates(candidates)
    data_vars = {
        "pointwise": (("candidate", "observation"), pointwise),
        "pointwise_se": (
            ("candidate", "observation"),
            np.stack([held_out[c][0].se for c in labels]).astype(float),
        ),
        "pareto_k": (
            ("candidate", "observation"),
            np.stack([held_out[c][0].pareto_k for c in labels]),
        ),
        "adapted": (
            ("candidate", "observation"),
            np.stack([held_out[c][1] for c in labels]),
        ),
        "fold_score": (("candidate", "fold"), fold_score),
        "mean": ("candidate", kept.mean(1)),
        "se": ("candidate", kept.std(1, ddof=1) / np.sqrt(n_obs)),
        "final_loss": (
            ("candidate", "fold"),
            np.stack([final_loss[c] for c in labels]),
        ),
    }
    if reference is not None:
        diff = kept - pointwise[labels.index(reference), observed]
        data_vars["diff"] = ("candidate", diff.mean(1))
        data_vars["diff_se"] = ("candidate", diff.std(1, ddof=1) / np.sqrt(n_obs))
    coords = {
        "candidate": labels,
        "fold": np.arange(k),
        "observation": np.arange(pointwise.shape[1]),
        "regularizer": ("candidate", regs),
        "lam": ("candidate", np.asarray(lams)),
        "fold_of": ("observation", folds),
        "observed": ("observation", observed),
    }
    return xr.Dataset(data_vars, coords=coords, attrs={"reference": reference or ""})


def _fitted_shapes(init_params: Any, lead: tuple[int, int]) -> Any:
    """The shapes of a grid's fitted parameters, leading axes ``(G, K)``."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(lead + jnp.shape(x), jnp.result_type(x)),
        init_params,
    )


def _fit_grids(
    grid_list: list[Grid], lowered: list[Any], fit: FitRecipe, setting: tuple
) -> tuple[list[tuple[Grid, Any, np.ndarray]], list[Any]]:
    """Compile the scoring programs ``lowered`` while each grid is lowered
    and its fits start at once (the next grid lowers while they run). An
    error or an interrupt stops every running fit after its current block of
    steps and is raised without waiting for them. ``setting``: ``(model,
    guide, optim, plate, keeps, fit_key, data)`` of :func:`lower_grid`."""
    stop = threading.Event()
    pool = ThreadPoolExecutor(max_workers=len(grid_list) + 1)
    try:
        compiling = pool.submit(compile_all, lowered)
        running = [
            pool.submit(
                fit_grid,
                lower_grid(grid, *setting),
                num_steps=fit.num_steps,
                progress_bar=fit.progress_bar,
                stop=stop,
                stop_early=fit.stop_early,
            )
            for grid in grid_list
        ]
        # a grid's result is None only once stopped, i.e. below
        fits = [cast(tuple, f.result()) for f in running]
        return fits, compiling.result()
    except BaseException:
        stop.set()
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def held_out_scores(
    procedure: tuple,
    candidates: dict[str, ELBO],
    folds: np.ndarray,
    score: Score,
    fit: FitRecipe,
    keys: tuple[jax.Array, jax.Array],
) -> tuple[
    dict[str, tuple[Pointwise, np.ndarray]], dict[str, np.ndarray], np.ndarray | None
]:
    """Every candidate's held-out score of every observation, the final
    loss of its fits and, for a score whose mixture score is quadratic in
    the weights, the ``(C, C, N)`` pairwise gains of stacking
    (:class:`~numpyro_pvi.selection._score_programs.PairGains`): one compiled
    program per λ grid, one that scores every fit and one for the pairs.
    The scoring programs lower first and compile while each grid is lowered
    and its fits run, in a thread of their own (:func:`_fit_grids`).
    ``procedure`` is ``(model, guide, optim, plate, data, init_params)``;
    ``folds`` the fold of every observation.

    When a program needs the model's arguments' values while it is traced
    (the quadratic score enumerates a Binomial's support up to its
    ``total_count``, an argument of the model), every program is made
    again with the arguments as constants, as ``SVI.run`` closes over
    them."""
    data = procedure[4]
    try:
        return _held_out_scores(procedure, candidates, folds, score, fit, keys)
    except CONCRETE_VALUE_ERRORS:
        if data.constant:
            raise
    constant = ModelData(data.args, data.kwargs, constant=True)
    procedure = procedure[:4] + (constant,) + procedure[5:]
    return _held_out_scores(procedure, candidates, folds, score, fit, keys)


def _held_out_scores(
    procedure: tuple,
    candidates: dict[str, ELBO],
    folds: np.ndarray,
    score: Score,
    fit: FitRecipe,
    keys: tuple[jax.Array, jax.Array],
) -> tuple[
    dict[str, tuple[Pointwise, np.ndarray]], dict[str, np.ndarray], np.ndarray | None
]:
    model, guide, optim, plate, data, init_params = procedure
    fit_key, score_key = keys
    num_folds = len(np.unique(folds))
    keeps = jnp.asarray(folds)[None, :] != jnp.arange(num_folds)[:, None]  # (K, N)
    scorer = pointwise_scorer(model, guide, plate, score, fit.num_draws, data)
    grid_list = grids(candidates)
    # the fits' parameters are shaped as the initial ones, whatever the loss
    # (SVI.init does not read it): the scores lower first, which checks that
    # the score applies before any fit runs
    shapes = [
        _fitted_shapes(init_params, (len(g.values), num_folds)) for g in grid_list
    ]
    held = HeldOut.of(folds)
    lowered = [lower_scores(scorer, score_key, shapes, held, data)]
    pairs = None
    if score.mixture_is_quadratic and len(candidates) > 1:
        pairs = lower_pair_gains(
            pair_gain_scorer(model, guide, plate, score, fit.num_draws, data),
            score_key,
            shapes,
            [list(grid.labels) for grid in grid_list],
            list(candidates),
            held,
            data,
        )
        lowered.append(pairs.program)
    fits, compiled = _fit_grids(
        grid_list, lowered, fit, (model, guide, optim, plate, keeps, fit_key, data)
    )
    params = [fitted for _, fitted, _ in fits]
    pointwise = split_scores(
        run_scores(compiled[0], score_key, params, held, data.dynamic), params
    )
    held_out, final_loss = {}, {}
    rows, cols = folds, held.position
    for (grid, fitted, losses), scores in zip(fits, pointwise, strict=True):
        for g, label in enumerate(grid.labels):  # scores: (G, K, n)
            estimates = Pointwise(*(x[g][rows, cols] for x in scores))
            fold_params = [
                jax.tree.map(lambda x, g=g, k=k: x[g, k], fitted)
                for k in range(num_folds)
            ]
            held_out[label] = reliable_scores(
                estimates,
                score,
                fit.num_draws,
                rows,
                fold_params,
                model,
                guide,
                plate,
                data,
                random.fold_in(score_key, 1),
            )
            final_loss[label] = losses[g]
    gains = None
    if pairs is not None:
        out = compiled[-1](
            score_key, params, pairs.pairs, pairs.observations, data.dynamic
        )
        gains = pairs.gains(out, folds, held, len(candidates))
    return held_out, final_loss, gains
