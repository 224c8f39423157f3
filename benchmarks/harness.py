"""The held-out benchmark harness: fit every candidate objective on the
training split of every seed (seeds vectorised, a grid of settings in one
compiled program), choose among candidates on the validation split, and
score the chosen fits on the test split with
:func:`numpyro_pvi.predictive_score`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import random
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.elbo import ELBO

from benchmarks.candidates import Objective
from numpyro_pvi import predictive_score
from numpyro_pvi.objectives.svi_scan import svi_scan

__all__ = [
    "BenchmarkResult",
    "DataSplit",
    "decaying_adam",
    "format_table",
    "merge_validation",
    "random_split",
    "run_benchmark",
]

#: Report order and display names of the scores.
SCORE_NAMES = {"log": "log score", "crps": "CRPS", "quadratic": "quadratic"}


class DataSplit(NamedTuple):
    """One seed's train / validation / test data, as model keyword arguments.

    Each field maps the model's keyword argument names to arrays; the model
    is called as ``model(**split.train)`` to fit and
    ``model(**split.validation)``, ``model(**split.test)`` to score.
    """

    train: dict[str, Any]
    validation: dict[str, Any]
    test: dict[str, Any]


def random_split(
    data: Mapping[str, Any],
    *,
    num_obs: int,
    seed: int,
    fractions: tuple[float, float, float] = (0.6, 0.2, 0.2),
    per_observation: Sequence[str] | None = None,
) -> DataSplit:
    """Random train / validation / test split of a data set.

    :param data: model keyword arguments; arrays whose leading axis has
        length ``num_obs`` are split (or those named in ``per_observation``),
        everything else is passed unchanged to all three parts.
    :param int num_obs: number of observations.
    :param int seed: seed of the permutation.
    :param fractions: train, validation and test fractions (summing to 1).
    :param per_observation: names of the arrays indexed by observation.
    :return: a :class:`DataSplit`; the part sizes depend only on ``num_obs``
        and ``fractions``, so splits of different seeds stack.
    """
    if len(fractions) != 3 or not math.isclose(sum(fractions), 1.0):
        raise ValueError(
            f"random_split: fractions must be three numbers summing to 1, got "
            f"{fractions!r}."
        )
    n_train = int(round(fractions[0] * num_obs))
    n_val = int(round(fractions[1] * num_obs))
    if min(n_train, n_val, num_obs - n_train - n_val) < 1:
        raise ValueError(
            f"random_split: num_obs={num_obs} is too small for fractions "
            f"{fractions!r} (every part needs an observation)."
        )
    perm = np.random.default_rng(seed).permutation(num_obs)
    parts = np.split(perm, [n_train, n_train + n_val])
    if per_observation is None:
        per_observation = [
            k for k, v in data.items() if np.ndim(v) >= 1 and len(v) == num_obs
        ]
    missing = set(per_observation) - set(data)
    if missing:
        raise ValueError(
            f"random_split: per_observation names {sorted(missing)} are not in data."
        )
    out = []
    for idx in parts:
        out.append(
            {
                k: (np.asarray(v)[idx] if k in per_observation else v)
                for k, v in data.items()
            }
        )
    return DataSplit(*out)


def merge_validation(split: DataSplit, per_observation: Sequence[str]) -> DataSplit:
    """One fitting part: ``train`` and ``validation`` concatenated along the
    observations (arrays named in ``per_observation``), ``validation`` empty.

    :param split: a :class:`DataSplit`.
    :param per_observation: names of the arrays indexed by observation.
    """
    train = {
        k: (
            np.concatenate([np.asarray(v), np.asarray(split.validation[k])])
            if k in per_observation
            else v
        )
        for k, v in split.train.items()
    }
    return DataSplit(train, {}, split.test)


@dataclass
class BenchmarkResult:
    """Scores of one (guide, objective) pair over the seeds.

    :ivar guide: the guide's label.
    :ivar objective: the objective's label.
    :ivar selected: the candidate chosen on validation, per seed.
    :ivar validation: candidate label -> ``(S,)`` validation sums of the
        objective's ``select_by`` score (empty with one candidate).
    :ivar test: score name -> ``(S,)`` test sums of the selected fits.
    :ivar final_loss: candidate label -> ``(S,)`` mean loss over the last
        10% of the steps.
    :ivar params: candidate label -> fitted parameters with a leading seed
        axis.
    :ivar seconds: wall time of the fits and evaluations.
    :ivar cpu_seconds: their CPU time (all threads of the process).
    """

    guide: str
    objective: str
    selected: list[str]
    validation: dict[str, np.ndarray]
    test: dict[str, np.ndarray]
    final_loss: dict[str, np.ndarray]
    params: dict[str, Any] = field(repr=False)
    seconds: float = 0.0
    cpu_seconds: float = 0.0


def _stack(trees: Sequence[Any]) -> Any:
    try:
        return jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *trees)
    except ValueError as err:
        raise ValueError(
            "run_benchmark: the splits of different seeds must have the same "
            "keys and array shapes (use random_split) so the seeds are fitted "
            f"in one vectorised program: {err}"
        ) from None


def decaying_adam(learning_rate: float, num_steps: int) -> optax.GradientTransformation:
    """Adam whose step size decays from ``learning_rate`` to a tenth of it on
    a cosine over ``num_steps`` steps: the benchmark's optimizer."""

    def schedule(t: jax.Array) -> jax.Array:
        frac = jnp.minimum(t / num_steps, 1.0)
        return learning_rate * (0.1 + 0.45 * (1.0 + jnp.cos(jnp.pi * frac)))

    return optax.adam(schedule)


def _fitter(
    model: Callable,
    guide: Callable,
    make_loss: Callable[[jax.Array], ELBO],
    learning_rate: float,
    num_steps: int,
) -> Callable:
    """``jit`` of SVI runs, mapped over the grid values (outer axis, a
    ``lax.map``) and vectorised over the seeds (inner axis, ``vmap``; the same
    keys for every value).

    The grid is a sequential ``lax.map``, not a second ``vmap``: the extra
    vectorisation bought little (the dense guide's LAPACK deadlock is avoided
    by :class:`DenseGuide`).

    The number of steps is a traced argument (a ``fori_loop``), so one
    compiled program serves every budget. Adam's step size decays from
    ``learning_rate`` to a tenth of it on a cosine over the budget. Returns
    the parameters and the mean loss over the last 10% of the steps.
    """

    def one(value: jax.Array, key: jax.Array, data: dict):
        optim = decaying_adam(learning_rate, num_steps)
        svi = SVI(model, guide, optim, loss=make_loss(value))
        state = svi.init(key, **data)
        state, losses = svi_scan(svi, state, num_steps=num_steps, kwargs=data)
        return svi.get_params(state), jnp.mean(losses[-max(1, num_steps // 10) :])

    over_seeds = jax.vmap(one, in_axes=(None, 0, 0))

    def over_grid(values: jax.Array, keys: jax.Array, data: dict):
        return jax.lax.map(lambda v: over_seeds(v, keys, data), values)

    return jax.jit(over_grid)


def _scorer(model: Callable, guide: Callable, score: str, num_draws: int) -> Callable:
    """Per seed, the summed :func:`numpyro_pvi.predictive_score` (with its
    moment matching of far observations, which runs between compiled
    programs: the seeds are scored one by one; the draws' program is
    compiled once)."""

    def scores(keys: jax.Array, params: Any, data: dict[str, Any]) -> jax.Array:
        totals = []
        for s in range(keys.shape[0]):
            one_params = jax.tree.map(lambda x, s=s: x[s], params)
            one_data = {k: v[s] for k, v in data.items()}
            result = predictive_score(
                keys[s],
                one_params,
                model,
                guide,
                score=score,
                num_draws=num_draws,
                **one_data,
            )
            totals.append(result.total)
        return jnp.asarray(totals)

    return scores


class _Scorers:
    """Compiled scorers of one model and guide, one per score name."""

    def __init__(self, model: Callable, guide: Callable, num_draws: int) -> None:
        self.model, self.guide, self.num_draws = model, guide, num_draws
        self.compiled: dict[str, Callable] = {}

    def __call__(self, name: str) -> Callable:
        if name not in self.compiled:
            self.compiled[name] = _scorer(self.model, self.guide, name, self.num_draws)
        return self.compiled[name]


def _pick(best: np.ndarray, candidates: list[Any]) -> Any:
    """Stack candidate ``best[s]``'s parameters of seed ``s`` over seeds."""
    return jax.tree.map(
        lambda *xs: jnp.stack([xs[c][s] for s, c in enumerate(best)]), *candidates
    )


def run_benchmark(
    model: Callable,
    splits: Sequence[DataSplit],
    objectives: Mapping[str, Objective],
    guides: Mapping[str, Callable[[Callable], Callable]],
    *,
    scores: Sequence[str] = ("log",),
    num_steps: int = 2000,
    learning_rate: float = 3e-2,
    num_draws: int = 1000,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> list[BenchmarkResult]:
    r"""Fit every objective with every guide on every split and score it.

    For each guide and objective, every candidate loss is fitted on the
    training part of all splits at once (``vmap`` over the seeds, ``lax.map``
    over the values of a :class:`Candidates` grid, inside one ``jit``) with Adam
    whose step size decays from ``learning_rate`` to a tenth of it (cosine
    schedule). The candidate with the largest validation
    sum of the objective's ``select_by`` score is kept per seed, and its
    test sums of every score in ``scores`` are returned. All scores are
    :func:`numpyro_pvi.predictive_score` sums (positively oriented: higher
    is better; the CRPS is reported as :math:`-\sum_i S_{\rm CRPS}`
    by :func:`format_table`).

    :param model: NumPyro model taking the data as keyword arguments.
    :param splits: one :class:`DataSplit` per seed, with equal shapes.
    :param objectives: label -> :class:`Objective`.
    :param guides: label -> guide constructor called with the model, e.g.
        ``AutoNormal``.
    :param scores: scores evaluated on the test split.
    :param int num_steps: optimisation steps of each fit.
    :param float learning_rate: initial Adam step size.
    :param int num_draws: guide draws of each :func:`predictive_score`.
    :param int seed: seed of the optimisation and evaluation keys.
    :param progress: optional callable receiving one line per fitted
        candidate.

    The keys are ``random.split(PRNGKey(k), S)`` for the ``S`` seeds, with
    ``k = seed`` for the fits (the same for every candidate), ``seed + 1``
    for validation and ``seed + 2`` for the test scores, so a test number is
    ``predictive_score(test_keys[s], params, model, guide, **split.test)``
    summed.
    :return: one :class:`BenchmarkResult` per (guide, objective).
    """
    if not splits:
        raise ValueError("run_benchmark: splits must not be empty.")
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(
            f"run_benchmark: num_steps must be a positive int, got {num_steps!r}."
        )
    train = _stack([s.train for s in splits])
    validation = _stack([s.validation for s in splits])
    test = _stack([s.test for s in splits])
    num_seeds = len(splits)
    fit_keys = random.split(random.PRNGKey(seed), num_seeds)
    val_keys = random.split(random.PRNGKey(seed + 1), num_seeds)
    test_keys = random.split(random.PRNGKey(seed + 2), num_seeds)

    results = []
    for guide_label, make_guide in guides.items():
        guide = make_guide(model)
        # Build the guide's prototype once, eagerly, on the first training
        # split, so that the vectorised fits share it.
        SVI(model, guide, optax.adam(learning_rate), loss=Trace_ELBO()).init(
            random.PRNGKey(seed), **splits[0].train
        )
        scorers = _Scorers(model, guide, num_draws)
        for obj_label, objective in objectives.items():
            start, cpu_start = time.perf_counter(), time.process_time()
            params, final_loss, val = {}, {}, {}
            select = objective.select_by if len(objective.labels) > 1 else None
            for grid in objective.candidates:
                fit = _fitter(model, guide, grid.make_loss, learning_rate, num_steps)
                values = jnp.asarray(grid.values, dtype=jnp.result_type(float))
                grid_params, last = fit(values, fit_keys, train)
                for c, label in enumerate(grid.labels):
                    params[label] = jax.tree.map(lambda x, c=c: x[c], grid_params)
                    final_loss[label] = np.asarray(last[c])
                    if select is not None:
                        val[label] = np.asarray(
                            scorers(select)(val_keys, params[label], validation)
                        )
                    if progress is not None:
                        progress(
                            f"{guide_label:>6} {obj_label:<9} {label:<20} "
                            f"loss {np.mean(final_loss[label]):12.3f}"
                            + (f"  val {np.mean(val[label]):10.2f}" if val else "")
                            + f"  [{time.perf_counter() - start:6.1f}s]"
                        )
            labels = objective.labels
            if val:
                table = np.stack([val[label] for label in labels])  # (C, S)
                best = np.argmax(np.where(np.isnan(table), -np.inf, table), axis=0)
            else:
                best = np.zeros(num_seeds, dtype=int)
            selected = [labels[c] for c in best]
            chosen = _pick(best, [params[label] for label in labels])
            test_scores = {
                name: np.asarray(scorers(name)(test_keys, chosen, test))
                for name in scores
            }
            results.append(
                BenchmarkResult(
                    guide=guide_label,
                    objective=obj_label,
                    selected=selected,
                    validation=val,
                    test=test_scores,
                    final_loss=final_loss,
                    params=params,
                    seconds=time.perf_counter() - start,
                    cpu_seconds=time.process_time() - cpu_start,
                )
            )
    return results


def format_table(
    results: Sequence[BenchmarkResult], *, title: str | None = None
) -> str:
    """Markdown table of test scores: mean (sd) over seeds.

    The log and quadratic scores are shown as sums of positively oriented
    scores (higher is better); the CRPS is shown as the sum of the CRPS
    (lower is better).

    :param results: the output of :func:`run_benchmark`.
    :param title: optional first column value (e.g. the model name).
    :return: the table as a string.
    """
    names = []
    for r in results:
        names += [n for n in r.test if n not in names]
    head = (
        ["model", "guide", "method"]
        + [SCORE_NAMES.get(n, n) + (" ↓" if n == "crps" else " ↑") for n in names]
        + ["selected (per seed)"]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        cells = [title or "", r.guide, r.objective]
        for n in names:
            if n not in r.test:
                cells.append("—")
                continue
            x = -r.test[n] if n == "crps" else r.test[n]
            sd = np.std(x, ddof=1) if len(x) > 1 else float("nan")
            cells.append(f"{np.mean(x):.1f} ({sd:.1f})")
        sel = sorted(set(r.selected), key=r.selected.index)
        cells.append(", ".join(f"{s}×{r.selected.count(s)}" for s in sel))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
