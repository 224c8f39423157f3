r"""The held-out benchmark with λ chosen by cross-validation: for every split,
:func:`numpyro_pvi.selection.cross_validate` chooses among VI and the PVI
grid on the fitting part (train and validation merged), the chosen
objective is refitted on the whole fitting part and scored on the test
part, beside VI fitted the same way. The candidates are also stacked
(:func:`numpyro_pvi.selection.stacking_weights`): those with weight at
least 0.01 are refitted the same way and their stacked predictive
(:class:`numpyro_pvi.selection.StackedGuide`) is scored on the test part.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax import random
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.elbo import ELBO

from benchmarks.harness import BenchmarkResult, DataSplit, decaying_adam
from numpyro_pvi import FitRecipe, predictive_score
from numpyro_pvi.objectives.svi_scan import svi_scan
from numpyro_pvi.selection import (
    StackedGuide,
    cross_validate,
    default_candidates,
    stacking_weights,
)
from numpyro_pvi.selection.stacking import STACKED_PARAMS

__all__ = ["RULES", "format_paired", "format_stacked", "run_cv_benchmark"]

#: Selection rules compared: each gets its own row (and so does stacking).
RULES = ("one_se", "best")
#: Candidates with a smaller stacking weight are not refitted.
MIN_WEIGHT = 0.01
_NAMES = {"log": "Log", "crps": "CRPS", "quadratic": "Quad"}


def _fit(model, guide, optim, loss: ELBO, num_steps: int) -> Callable:
    """``jit`` of one SVI run: ``fit(key, data) -> params``."""

    @jax.jit
    def fit(key: jax.Array, data: dict[str, Any]) -> Any:
        svi = SVI(model, guide, optim, loss=loss)
        state, _ = svi_scan(
            svi, svi.init(key, **data), num_steps=num_steps, kwargs=data
        )
        return svi.get_params(state)

    return fit


def _fitted(label: str, *, ctx: tuple, num_steps: int, fit_keys: Any) -> Any:
    """The parameters of candidate ``label`` refitted on split ``s``'s fitting
    part (cached in ``params``, its compiled fit in ``fits``)."""
    cv, score, s, split, guide, fits, params, model, optim = ctx
    # candidates of different scores share labels ("lam=0")
    key = label if label == cv.reference else (score, label)
    if key not in params:
        if key not in fits:
            fits[key] = _fit(model, guide, optim, cv.candidates[label], num_steps)
        params[key] = fits[key](fit_keys[s], split.train)
    return params[key]


def _test_sums(key, params, model, guide, data, scores, num_draws) -> dict:
    return {
        name: predictive_score(
            key, params, model, guide, score=name, num_draws=num_draws, **data
        ).total
        for name in scores
    }


def run_cv_benchmark(
    model: Callable,
    splits: Sequence[DataSplit],
    guides: Mapping[str, Callable[[Callable], Callable]],
    *,
    cv_scores: Sequence[str] = ("log",),
    test_scores: Sequence[str] = ("log",),
    num_steps: int = 2000,
    learning_rate: float = 3e-2,
    num_particles: int = 100,
    num_draws: int = 1000,
    num_folds: int = 5,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> list[BenchmarkResult]:
    """VI and, per score in ``cv_scores``, PVI with the candidate chosen by
    ``num_folds``-fold cross-validation under each rule of :data:`RULES`, on
    every split (``split.train`` is the fitting part; ``split.test`` scored).

    Keys: split ``s`` uses ``random.split(PRNGKey(seed), S)[s]`` for the
    cross-validation and every fit, and the matching key of ``seed + 2`` for
    the test scores (as :func:`benchmarks.harness.run_benchmark`).

    :return: one :class:`BenchmarkResult` per (guide, objective); its
        ``validation`` holds each candidate's CV mean per split.
    """
    num_seeds = len(splits)
    fit_keys = random.split(random.PRNGKey(seed), num_seeds)
    test_keys = random.split(random.PRNGKey(seed + 2), num_seeds)
    optim = decaying_adam(learning_rate, num_steps)
    results = []
    for guide_label, make_guide in guides.items():
        guide = make_guide(model)
        SVI(model, guide, optim, loss=Trace_ELBO()).init(fit_keys[0], **splits[0].train)
        vi = Trace_ELBO(num_particles=num_particles)
        fits = {"VI": _fit(model, guide, optim, vi, num_steps)}
        rows: dict[str, dict[str, Any]] = {}

        def row(label: str, rows: dict = rows) -> dict[str, Any]:
            return rows.setdefault(
                label, {"selected": [], "test": [], "validation": {}, "seconds": 0.0}
            )

        for s, split in enumerate(splits):
            start = time.perf_counter()
            params = {"VI": fits["VI"](fit_keys[s], split.train)}
            r = row("VI")
            r["selected"].append("-")
            r["test"].append(
                _test_sums(test_keys[s], params["VI"], model, guide, split.test,
                           test_scores, num_draws)
            )  # fmt: skip
            r["seconds"] += time.perf_counter() - start
            for score in cv_scores:
                start = time.perf_counter()
                cv = cross_validate(
                    fit_keys[s],
                    model,
                    guide,
                    optim,
                    fit=FitRecipe(
                        num_steps=num_steps, num_draws=num_draws, progress_bar=False
                    ),
                    candidates=default_candidates(
                        guide, score, num_particles=num_particles
                    ),
                    score=score,
                    num_folds=num_folds,
                    rule="best",
                    **split.train,
                )
                seconds = time.perf_counter() - start

                ctx = (cv, score, s, split, guide, fits, params, model, optim)
                fitted = functools.partial(
                    _fitted, ctx=ctx, num_steps=num_steps, fit_keys=fit_keys
                )

                for rule in RULES:
                    label = cv.select(rule)
                    r = row(f"PVI-{_NAMES.get(score, score)} (CV, {rule})")
                    r["selected"].append(label)
                    r["test"].append(
                        _test_sums(test_keys[s], fitted(label), model, guide,
                                   split.test, test_scores, num_draws)
                    )  # fmt: skip
                    r["seconds"] += seconds / len(RULES)
                    for c in cv.scores.candidate.values:
                        r["validation"].setdefault(str(c), []).append(
                            float(cv.scores["mean"].sel(candidate=c))
                        )
                stacking = stacking_weights(cv)
                labels = [
                    str(c)
                    for c, w in zip(
                        cv.scores.candidate.values, stacking.weights.values, strict=True
                    )
                    if w >= MIN_WEIGHT
                ]
                w = stacking.weights.sel(candidate=labels).values
                stacked = jax.tree.map(
                    lambda *p: jax.numpy.stack(p), *(fitted(c) for c in labels)
                )
                r = row(f"PVI-{_NAMES.get(score, score)} (CV, stacked)")
                w = w / w.sum()
                r["selected"].append(
                    ", ".join(f"{c} {v:.2f}" for c, v in zip(labels, w, strict=True))
                )
                r["test"].append(
                    _test_sums(test_keys[s], {STACKED_PARAMS: stacked}, model,
                               StackedGuide(guide, w), split.test,
                               test_scores, num_draws)
                )  # fmt: skip
                if progress is not None:
                    d = cv.scores
                    progress(
                        f"{guide_label:>6} seed {s} {score:<5} "
                        f"best {cv.best_label:<18} one-SE {cv.select('one_se'):<18}"
                        f" diff {float(d['diff'].sel(candidate=cv.best_label)):+.4f}"
                        f" ± {float(d['diff_se'].sel(candidate=cv.best_label)):.4f}"
                        f"  [{seconds:.0f}s]"
                    )
        for label, r in rows.items():
            results.append(
                BenchmarkResult(
                    guide=guide_label,
                    objective=label,
                    selected=r["selected"],
                    validation={k: np.asarray(v) for k, v in r["validation"].items()},
                    test={
                        n: np.asarray([t[n] for t in r["test"]]) for n in test_scores
                    },
                    final_loss={},
                    params={},
                    seconds=r["seconds"],
                )
            )
    return results


def format_paired(results: Sequence[BenchmarkResult], *, title: str = "") -> str:
    """Markdown table of PVI (CV) − VI on each PVI objective's own test score,
    paired by split: mean (standard error over splits), splits where PVI is
    better; the CRPS as VI's minus PVI's (positive: PVI better).

    :param results: the output of :func:`run_cv_benchmark` for one model.
    :param title: the model column's value.
    """
    lines = [
        "| model | guide | objective | selection | PVI − VI | PVI better |",
        "|---|---|---|---|---|---|",
    ]
    vi = {r.guide: r for r in results if r.objective == "VI"}
    for r in results:
        if r.objective == "VI":
            continue
        name = "crps" if "CRPS" in r.objective else "log"
        diff = r.test[name] - vi[r.guide].test[name]  # positively oriented
        se = diff.std(ddof=1) / np.sqrt(diff.size) if diff.size > 1 else np.nan
        objective, rule = r.objective.split(" (CV, ")
        lines.append(
            f"| {title} | {r.guide} | {objective} | {rule.rstrip(')')} | "
            f"{diff.mean():+.2f} ({se:.2f}) | {int((diff > 0).sum())}/{diff.size} |"
        )
    return "\n".join(lines)


def format_stacked(results: Sequence[BenchmarkResult], *, title: str = "") -> str:
    """Markdown table of the stacked predictive minus the candidate chosen by
    the one-standard-error rule, on each score's own test sum, paired by
    split: mean (standard error over splits), splits where stacking is at
    least as good.

    :param results: the output of :func:`run_cv_benchmark` for one model.
    :param title: the model column's value.
    """
    lines = [
        "| model | guide | score | stacked − chosen | stacked ≥ chosen |",
        "|---|---|---|---|---|",
    ]
    by = {(r.guide, r.objective): r for r in results}
    for (guide, objective), r in by.items():
        if not objective.endswith("(CV, stacked)"):
            continue
        chosen = by[(guide, objective.replace("stacked", "one_se"))]
        name = "crps" if "CRPS" in objective else "log"
        diff = r.test[name] - chosen.test[name]
        se = diff.std(ddof=1) / np.sqrt(diff.size) if diff.size > 1 else np.nan
        lines.append(
            f"| {title} | {guide} | {name} | {diff.mean():+.2f} ({se:.2f}) | "
            f"{int((diff >= 0).sum())}/{diff.size} |"
        )
    return "\n".join(lines)
