r"""K-fold cross-validation of candidate objectives over the data plate."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import xarray as xr
from jax import random
from numpyro.infer import TraceEnum_ELBO
from numpyro.infer.elbo import ELBO

from numpyro_pvi._trace.autoguide_setup import needs_prototype
from numpyro_pvi._trace.data_plate import DataPlate, check_same_plate, plate_of
from numpyro_pvi._trace.enumeration import drawn_by, enumerates, marginalized
from numpyro_pvi._trace.recipes import FitRecipe, check_recipe
from numpyro_pvi._trace.site_values import single_observation
from numpyro_pvi._trace.structure import replay_trace
from numpyro_pvi._trace.validation import check_int, warn_laplace_held_out
from numpyro_pvi.evaluation.psis import good_k
from numpyro_pvi.objectives.predictive import PredictiveELBO
from numpyro_pvi.scores import Score, get_score
from numpyro_pvi.selection._candidates import (
    default_candidates,
    labelled,
    reference_label,
)
from numpyro_pvi.selection._held_out_scores import (
    held_out_scores,
    scores_dataset,
    warn_unreliable,
)
from numpyro_pvi.selection._programs import ModelData, initial_params, model_data
from numpyro_pvi.selection.fold_ids import fold_ids

__all__ = ["CrossValidation", "cross_validate"]

_RULES = ("one_se", "best")


@dataclasses.dataclass(frozen=True)
class CrossValidation:
    """The result of :func:`cross_validate`.

    :ivar scores: ``xarray.Dataset`` over ``candidate``, ``fold`` and
        ``observation``: ``pointwise`` (each observation's score when held
        out) with its Monte Carlo ``pointwise_se``, ``pareto_k`` (log score:
        k̂ of its importance weights, NaN otherwise) and ``adapted``
        (re-estimated by moment matching, see
        :func:`~numpyro_pvi.predictive_score`), ``fold_score`` (mean held-out
        score of each fold), ``mean`` and ``se`` per candidate, ``diff`` and
        ``diff_se`` (paired difference to the reference, VI),
        ``final_loss`` (mean training loss over the last 5% of the steps of
        each fit); coordinates ``regularizer``, ``lam``, ``fold_of`` and
        ``observed`` (``False`` for an observation that masks remove: left
        out of every mean). Scores are positively oriented (higher is
        better; the CRPS is negated); attrs ``good_k`` and ``num_draws``.
    :ivar best: the selected loss object, for ``SVI(..., loss=cv.best)``.
    :ivar best_label: its label.
    :ivar candidates: label -> loss, every candidate.
    :ivar folds: ``(N,)`` fold of each observation of the data plate.
    :ivar rule: the selection rule, ``"one_se"`` or ``"best"``.
    :ivar reference: the label of the VI candidate (``None``: none).
    """

    scores: xr.Dataset
    best: ELBO
    best_label: str
    candidates: dict[str, ELBO] = dataclasses.field(repr=False)
    folds: np.ndarray = dataclasses.field(repr=False)
    rule: str = "one_se"
    reference: str | None = None

    def select(self, rule: str) -> str:
        """The label another rule selects from the same scores.

        :param str rule: ``"one_se"`` (needs a VI candidate) or ``"best"``.
        """
        if rule not in _RULES or (rule == "one_se" and self.reference is None):
            raise ValueError(
                f"CrossValidation.select: rule must be one of {_RULES} "
                f"('one_se' needs a VI candidate), got {rule!r}."
            )
        return _select(self.scores, rule, self.reference)

    def to_elpd(self) -> dict[str, Any]:
        """Every candidate's cross-validated held-out log score as ArviZ's
        ``ELPDData``: ``arviz.compare(cv.to_elpd())`` ranks the candidates
        (VI and PVI fits alike) by held-out score, with the paired standard
        error of each difference (``dse``) from the pointwise scores.

        On ArviZ ≥ 1.0 these are arviz-stats' ``ELPDDataLOOKFold`` (what
        ``arviz_stats.loo_kfold`` returns); on ArviZ 0.2x, whose ``compare``
        takes only ``"loo"`` and ``"waic"`` results, ``ELPDData`` of the kind
        ``"loo"`` (its ``elpd_loo`` is the K-fold estimate). Observations
        that masks remove are left out. Only the log score is an ELPD.

        :return: label -> ``ELPDData``, in the candidates' order.
        """
        from numpyro_pvi._arviz.numerics import NUMERICS

        s = self.scores
        if s.attrs["score"] != "log":
            raise ValueError(
                f"CrossValidation.to_elpd: ArviZ's ELPDData holds log scores, but "
                f"this cross-validation scored {s.attrs['score']!r}; compare its "
                "scores directly (cv.scores['mean'], cv.scores['diff'] with "
                "'diff_se'), or cross-validate with score='log'."
            )
        observed = s["observed"].values
        out = {}
        for label in s.candidate.values:
            values = s["pointwise"].sel(candidate=label).values[observed]
            elpd_i = xr.DataArray(values, dims=["observation"])
            se = np.sqrt(values.size) * values.std()
            out[str(label)] = NUMERICS.kfold_elpd(
                elpd_i,
                se,
                num_draws=int(s.attrs["num_draws"]),
                num_folds=int(s.attrs["num_folds"]),
            )
        return out

    def __str__(self) -> str:
        s = self.scores
        lines = [
            f"{s.attrs['num_folds']}-fold cross-validation, {s.attrs['score']} "
            f"score (per observation, higher is better), rule {self.rule!r}:"
        ]
        for label in s.candidate.values:
            c = s.sel(candidate=label)
            row = f"  {label:<22} {float(c['mean']):10.4f} ± {float(c['se']):.4f}"
            if "diff" in s and self.reference is not None:
                row += f"   vs VI {float(c['diff']):+.4f} ± {float(c['diff_se']):.4f}"
            lines.append(row + ("   <- selected" if label == self.best_label else ""))
        return "\n".join(lines)


_WHERE = "cross_validate"


def cross_validate(
    rng_key: jax.Array,
    model: Callable,
    guide: Callable,
    optim: Any,
    *args: Any,
    fit: FitRecipe,
    candidates: Mapping[str, ELBO] | Sequence[ELBO] | None = None,
    num_folds: int = 5,
    score: str | Score = "log",
    data_plate: str | int | None = None,
    rule: str = "one_se",
    **kwargs: Any,
) -> CrossValidation:
    r"""Choose among objectives, e.g. the regularizer and λ of PVI, by K-fold
    cross-validation of the held-out predictive score.

    The observations of the data plate are dealt at random into ``num_folds``
    folds. Every candidate is fitted once per fold without that fold (its
    observations masked, :class:`mask_observations`) and the fold is scored
    with :func:`~numpyro_pvi.predictive_score`. The CV estimate is
    :math:`\bar s_c = \frac1N\sum_i s_{ci}` with standard error
    :math:`\mathrm{sd}_i(s_{ci})/\sqrt N`; the paired difference to VI has
    standard error :math:`\mathrm{sd}_i(s_{ci} - s_{{\rm VI},i})/\sqrt N` [1]
    (all fits and scores share their keys).

    The default candidates are VI (``Trace_ELBO``; :class:`~numpyro_pvi.StratifiedELBO`
    for a mixture guide) and :class:`~numpyro_pvi.PredictiveELBO` with ``score``
    at λ = 0, the prior regularizer with λ ∈ {0.01, 0.1, 1} and the posterior
    regularizer with λ ∈ {0.1, 1, 10}, 32 particles each
    (:func:`default_candidates`). ``rule="one_se"`` takes the best mean unless VI
    is within one paired standard error of it, and then VI [3]; ``rule="best"``
    the best mean. Candidates that differ only in λ share one compiled program
    (λ traced); an error or Ctrl-C stops every fit after its current block.

    **Example**

    .. code-block:: python

        cv = cross_validate(key, model, guide, optax.adam(1e-2), x, y=y,
                            fit=FitRecipe(num_steps=2000))
        print(cv)
        svi = SVI(model, guide, optax.adam(1e-2), loss=cv.best)

    :param rng_key: random key (folds, fits and scores).
    :param model: the NumPyro model.
    :param guide: the guide (e.g. an autoguide of ``model``).
    :param optim: the optimizer, as for :class:`~numpyro.infer.SVI`.
    :param args: model arguments (the full data).
    :param fit: a :class:`~numpyro_pvi.FitRecipe`: SVI steps of each fit,
        draws of each held-out score, progress bar.
    :param candidates: label -> loss, or a sequence of losses; ``None``: the
        default grid above.
    :param int num_folds: the number :math:`K \ge 2` of folds.
    :param score: the held-out score, a name or a
        :class:`~numpyro_pvi.scores.Score`; also the default PVI candidates'.
    :param data_plate: the plate (or negative batch dimension) that indexes
        observations, as for :class:`~numpyro_pvi.PredictiveELBO`; a PVI
        candidate with another data plate is refused.
    :param str rule: ``"one_se"`` or ``"best"``.
    :param kwargs: model keyword arguments.
    :return: a :class:`CrossValidation`.

    **References**

    1. Vehtari, A., Gelman, A. & Gabry, J. (2017). *Practical Bayesian model
       evaluation using leave-one-out cross-validation and WAIC*. Statistics
       and Computing 27, 1413–1432.
    2. Lai, J. & Yao, Y. (2024). *Predictive variational inference: Learn the
       predictively optimal posterior distribution*. arXiv:2410.14843.
    3. Hastie, T., Tibshirani, R. & Friedman, J. (2009). *The Elements of
       Statistical Learning*, 2nd ed., §7.10.
    """
    fit = check_recipe(fit, FitRecipe, "fit", _WHERE, kwargs)
    score, num_folds = _check_options(fit, num_folds, score, rule)
    warn_laplace_held_out(guide, _WHERE)
    vi = None
    if enumerates(model, args, kwargs):  # fits and scores with them summed out
        vi, model = TraceEnum_ELBO, marginalized(model, drawn_by(guide, args, kwargs))
    candidates = labelled(
        default_candidates(guide, score, data_plate=data_plate, vi=vi)
        if candidates is None
        else candidates
    )
    reference = reference_label(candidates)
    if rule == "one_se" and reference is None:
        raise ValueError(
            "cross_validate: rule='one_se' moves toward VI, but no candidate is "
            "plain VI (Trace_ELBO, TraceEnum_ELBO, or StratifiedELBO for a "
            "mixture guide); add one, or pass rule='best'."
        )
    fold_key, fit_key, score_key = random.split(rng_key, 3)
    data = model_data(model, args, kwargs, fit_key)
    params = initial_params(model, guide, optim, args, kwargs, fit_key)
    plate = _data_plate(
        fit_key, params, model, guide, data, data_plate, num_folds, candidates
    )
    folds = np.asarray(fold_ids(fold_key, plate.size, num_folds))
    procedure = (model, guide, optim, plate, data, params)
    held_out, final_loss, gains = held_out_scores(
        procedure, candidates, folds, score, fit, (fit_key, score_key)
    )
    if needs_prototype(guide) and not all(
        np.isfinite(loss).all() for loss in final_loss.values()
    ):  # invalid initial values raise NumPyro's error there
        initial_params(model, guide, optim, args, kwargs, fit_key, eager=True)
    dataset = scores_dataset(candidates, held_out, final_loss, folds, reference)
    if gains is not None:
        dataset["pair_gain"] = (("candidate", "other", "observation"), gains)
        dataset = dataset.assign_coords(other=list(candidates))
    dataset.attrs.update(
        score=score.name,
        num_folds=num_folds,
        rule=rule,
        good_k=good_k(fit.num_draws),
        num_draws=fit.num_draws,
    )
    warn_unreliable(dataset, plate.name)
    if not np.isfinite(dataset["mean"]).any():
        raise FloatingPointError(
            "cross_validate: every candidate's held-out score is NaN or "
            "infinite; check the fits' final_loss in the scores (a smaller step "
            "size, or more particles)."
        )
    best = _select(dataset, rule, reference)
    dataset.attrs["best"] = best
    return CrossValidation(
        dataset, candidates[best], best, candidates, folds, rule, reference
    )


def _check_options(
    fit: FitRecipe, num_folds: Any, score: str | Score, rule: Any
) -> tuple[Score, int]:
    """The score, and the number of folds, checked."""
    if isinstance(num_folds, int) and not isinstance(num_folds, bool) and num_folds < 2:
        raise ValueError(
            f"cross_validate: num_folds={num_folds}: cross-validation needs at "
            "least 2 folds (each fit leaves one fold out)."
        )
    num_folds = check_int(num_folds, "num_folds", _WHERE, minimum=2)
    score = get_score(score)
    check_int(fit.num_draws, "fit.num_draws", _WHERE, minimum=score.min_particles)
    if rule not in _RULES:
        raise ValueError(f"cross_validate: rule must be one of {_RULES}, got {rule!r}.")
    return score, num_folds


def _select(dataset: xr.Dataset, rule: str, reference: str | None) -> str:
    """The label ``rule`` selects (non-finite scores never win): the best
    mean, or with ``"one_se"`` VI when it is within one paired standard
    error of the best."""
    mean = np.asarray(dataset["mean"])
    labels = list(dataset.candidate.values)
    best = labels[int(np.argmax(np.where(np.isfinite(mean), mean, -np.inf)))]
    if rule == "one_se" and best != reference:
        diff = float(dataset["diff"].sel(candidate=best))
        if reference is not None and diff <= float(
            dataset["diff_se"].sel(candidate=best)
        ):
            return reference
    return best


def _data_plate(
    rng_key: jax.Array,
    params: dict[str, jax.Array],
    model: Callable,
    guide: Callable,
    data: ModelData,
    data_plate: str | int | None,
    num_folds: int,
    candidates: dict[str, ELBO],
) -> DataPlate:
    """The data plate, checked to hold at least ``num_folds`` observations
    and to be the one every PVI candidate scores."""
    tr = replay_trace(
        rng_key,
        params,
        model,
        guide,
        data.args,
        data.kwargs,
        "cross_validate",
        eager_prototype=False,  # params may be shapes only: initial_params
    )
    plate = plate_of(tr, data_plate)
    for label, loss in candidates.items():
        if isinstance(loss, PredictiveELBO):
            what = f"cross_validate: candidate {label!r} ({loss!r})"
            check_same_plate(tr, plate, loss.data_plate, what)
    if plate.name is None:
        raise ValueError(single_observation(tr, "cross_validate", "folded"))
    if num_folds > plate.size:
        raise ValueError(
            f"cross_validate: num_folds={num_folds} is larger than the "
            f"{plate.size} observations of data_plate='{plate.name}'; every fold "
            "needs an observation."
        )
    return plate
