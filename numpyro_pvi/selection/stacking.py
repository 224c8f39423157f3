r"""Stacking of cross-validated candidates (Yao, Vehtari, Simpson & Gelman 2018).

Choosing one candidate of :func:`~numpyro_pvi.selection.cross_validate`
throws the others away. Stacking keeps them all: it chooses weights on the
simplex that maximise the held-out log score of the *mixture* of the
candidates' posterior predictives,

.. math::

    \hat w = \arg\max_{w \in \Delta_C} \sum_{i=1}^n
    \log \sum_{c=1}^C w_c\, p_c(y_i \mid y_{-k(i)}),

where :math:`p_c(y_i \mid y_{-k(i)})` is candidate :math:`c`'s predictive
density at :math:`y_i` fitted without the fold :math:`k(i)` holding it. The
objective is concave in :math:`w`; it is solved on the softmax logits by
L-BFGS (SciPy) with its analytic gradient. Its value at :math:`\hat w` is
at least that of every single candidate (a vertex of the simplex), and more
when the candidates err at different observations.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import xarray as xr
from jax import random
from numpyro import handlers
from numpyro.infer import SVI
from scipy import optimize
from scipy.special import logsumexp, softmax

from numpyro_pvi._core import FitRecipe, check_recipe
from numpyro_pvi.selection.cross_validation import CrossValidation

__all__ = [
    "StackedFit",
    "StackedGuide",
    "Stacking",
    "stack",
    "stacking_weights",
    "stacking_weights_arrays",
]

#: the name of the stacked guide's one parameter: every candidate's fitted
#: parameters, stacked along a leading axis
STACKED_PARAMS = "stacked_params"


@dataclasses.dataclass(frozen=True)
class Stacking:
    """Stacking weights of cross-validated candidates.

    :ivar weights: ``xarray.DataArray`` over ``candidate``: the weight of each
        candidate's posterior predictive in the stacked predictive (on the
        simplex).
    :ivar pointwise: ``(n,)`` the stacked predictive's held-out log score at
        each scored observation (the weights are fitted to these scores, so
        their sum is optimistic by about the number of free weights).
    :ivar single: the candidate with the best mean held-out score alone.
    :ivar mean: the stacked predictive's mean held-out log score per
        observation; ``single_mean`` the best single candidate's.
    :ivar se: the standard error of ``mean - single_mean`` (paired over
        observations).
    """

    weights: xr.DataArray
    pointwise: np.ndarray
    single: str
    mean: float
    single_mean: float
    se: float

    def __repr__(self) -> str:
        lines = [
            "Stacking of the cross-validated candidates' posterior predictives "
            "(weights maximise the held-out log score of their mixture)",
            f"  {'candidate':<24s} weight",
        ]
        for label, w in zip(
            self.weights["candidate"].values, self.weights.values, strict=True
        ):
            lines.append(f"  {str(label):<24s} {w:6.3f}")
        lines.append(
            f"  held-out log score per observation: stacked {self.mean:.4f}, "
            f"best single ({self.single}) {self.single_mean:.4f}, "
            f"difference {self.mean - self.single_mean:+.4f} ± {self.se:.4f}"
        )
        return "\n".join(lines)


def stacking_weights_arrays(log_scores: np.ndarray) -> np.ndarray:
    r"""The stacking weights of ``C`` candidates from their pointwise held-out
    log scores: the :math:`w \in \Delta_C` that maximises
    :math:`\sum_i \log \sum_c w_c e^{s_{ci}}`.

    :param log_scores: ``(C, n)`` held-out log predictive densities
        :math:`s_{ci}` (finite).
    :return: ``(C,)`` weights on the simplex.
    """
    s = np.asarray(log_scores, dtype=np.float64)
    if s.ndim != 2 or s.shape[0] < 1 or s.shape[1] < 1:
        raise ValueError(
            f"stacking: expected (candidates, observations) log scores, got shape "
            f"{s.shape}."
        )
    if not np.all(np.isfinite(s)):
        raise ValueError(
            "stacking: a held-out log score is not finite (NaN or -inf); "
            "stacking needs every candidate's score at every observation."
        )
    if s.shape[0] == 1:
        return np.ones(1)
    s = s - s.max(axis=0, keepdims=True)  # per observation: the same optimum

    def negative(z: np.ndarray) -> tuple[float, np.ndarray]:
        log_w = z - logsumexp(z)
        mix = logsumexp(log_w[:, None] + s, axis=0)  # (n,)
        resp = np.exp(log_w[:, None] + s - mix)  # (C, n) responsibilities
        grad = -(resp.sum(axis=1) - s.shape[1] * np.exp(log_w))
        return -float(mix.sum()), grad

    start = np.zeros(s.shape[0])
    result = optimize.minimize(
        negative, start, jac=True, method="L-BFGS-B", options={"maxiter": 10_000}
    )
    return softmax(result.x)


def stacking_weights(cv: CrossValidation) -> Stacking:
    """Stacking weights of the candidates of a cross-validation with the
    log score (Yao, Vehtari, Simpson & Gelman 2018).

    :param cv: the result of :func:`~numpyro_pvi.selection.cross_validate`
        with ``score="log"``.
    :return: a :class:`Stacking`: the weights, the stacked predictive's
        pointwise held-out log scores and the comparison with the best single
        candidate.

    **References**

    1. *Using stacking to average Bayesian predictive distributions*,
       Yuling Yao, Aki Vehtari, Daniel Simpson, Andrew Gelman (Bayesian
       Analysis 2018).
    """
    if not isinstance(cv, CrossValidation):
        raise TypeError(
            "stacking_weights: expected the result of cross_validate, got "
            f"{type(cv).__name__}."
        )
    scores: Any = cv.scores
    if scores.attrs["score"] != "log":
        raise ValueError(
            f"stacking_weights: this cross-validation scored "
            f"{scores.attrs['score']!r}; stacking weights are fitted to held-out "
            "log scores (the score of a mixture of predictives is not a "
            "function of the candidates' scores for other rules): "
            "cross-validate with score='log'."
        )
    observed = np.asarray(scores["observed"].values, bool)
    labels = [str(c) for c in scores["candidate"].values]
    log_scores = np.asarray(scores["pointwise"].values)[:, observed]
    weights = stacking_weights_arrays(log_scores)
    with np.errstate(divide="ignore"):  # a weight of exactly 0
        pointwise = logsumexp(np.log(weights)[:, None] + log_scores, axis=0)
    means = log_scores.mean(axis=1)
    best = int(np.argmax(means))
    diff = pointwise - log_scores[best]
    return Stacking(
        xr.DataArray(weights, dims=["candidate"], coords={"candidate": labels}),
        pointwise,
        labels[best],
        float(pointwise.mean()),
        float(means[best]),
        float(diff.std(ddof=1) / np.sqrt(diff.size)) if diff.size > 1 else np.nan,
    )


class StackedGuide:
    r"""The stacked posterior: a mixture of the candidates' fitted guides.

    Each call draws a candidate :math:`c` with probability :math:`w_c` and
    then the candidate's guide with its own fitted parameters, so the
    posterior predictive of its draws is the stacked predictive
    :math:`\sum_c w_c\, p_c(\tilde y \mid y)`. Its one parameter,
    ``"stacked_params"``, holds every candidate's parameters stacked along a
    leading axis (``StackedFit.params``). Use it wherever a fitted
    guide's predictive is read (:func:`~numpyro_pvi.predictive_score`,
    ``numpyro.infer.Predictive``); it has no density of its own (the
    component's density is not the mixture's), so the functions that read a
    guide's density (``psis``, ``psis_resample``, ``report``,
    ``to_inference_data``) refuse it with an error that says so.

    :param guide: the candidates' guide (one guide, fitted once per
        candidate).
    :param weights: ``(C,)`` the stacking weights.
    """

    #: its log density at its draws is not the mixture's: the functions that
    #: read a guide's density (psis, psis_resample, report,
    #: to_inference_data) refuse it
    has_density = False

    def __init__(self, guide: Callable, weights: Any) -> None:
        self.guide = guide
        self.log_weights = jnp.log(jnp.asarray(weights))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        stacked = numpyro.param(STACKED_PARAMS, None)
        if stacked is None:
            raise ValueError(
                "StackedGuide: call it with its fitted parameters (e.g. "
                "predictive_score(key, stacked.params, model, stacked.guide, ...))."
            )
        key = numpyro.prng_key()
        if key is None:
            key = random.PRNGKey(0)
        component = random.categorical(key, self.log_weights)
        params = jax.tree.map(lambda p: p[component], stacked)
        return handlers.substitute(self.guide, data=params)(*args, **kwargs)


@dataclasses.dataclass(frozen=True)
class StackedFit:
    """The candidates refitted to all the data, stacked.

    :ivar guide: the :class:`StackedGuide`.
    :ivar params: its parameters, ``{"stacked_params": ...}``: pass both where
        a fitted guide and its parameters go.
    :ivar stacking: the :class:`Stacking` weights the fit uses.
    :ivar labels: the candidates refitted (weight above ``min_weight``), in
        the order of the stacked parameters.
    :ivar weights: ``(len(labels),)`` their weights, renormalised.
    :ivar candidate_params: label -> the candidate's own fitted parameters.
    """

    guide: StackedGuide
    params: dict[str, Any]
    stacking: Stacking
    labels: tuple[str, ...]
    weights: np.ndarray
    candidate_params: dict[str, dict[str, jax.Array]] = dataclasses.field(repr=False)


def stack(
    rng_key: jax.Array,
    model: Callable,
    guide: Callable,
    optim: Any,
    *args: Any,
    cv: CrossValidation,
    fit: FitRecipe,
    min_weight: float = 0.01,
    **kwargs: Any,
) -> StackedFit:
    """Refit the cross-validated candidates to all the data and stack them.

    The weights are :func:`stacking_weights` of ``cv``; every candidate with
    weight at least ``min_weight`` is fitted with ``SVI`` for
    ``fit.num_steps`` steps, and the weights of those kept are renormalised.

    :param rng_key: random key.
    :param model: the model of ``cv``.
    :param guide: its guide.
    :param optim: the optimiser of each fit.
    :param args: the model's positional arguments (all the data).
    :param cv: the result of :func:`~numpyro_pvi.selection.cross_validate`
        with ``score="log"``.
    :param fit: how each fit runs (:class:`~numpyro_pvi.FitRecipe`).
    :param min_weight: candidates with a smaller weight are left out.
    :param kwargs: the model's keyword arguments.
    :return: a :class:`StackedFit`; ``predictive_score(key, stacked.params,
        model, stacked.guide, x_new, y_new)`` scores the stacked predictive.
    """
    check_recipe(fit, FitRecipe, "fit", "stack")
    stacking = stacking_weights(cv)
    weights = np.asarray(stacking.weights.values)
    keep = weights >= min(min_weight, weights.max())
    labels = tuple(
        str(c)
        for c, k in zip(stacking.weights["candidate"].values, keep, strict=True)
        if k
    )
    kept = weights[keep] / weights[keep].sum()
    fitted = {}
    for label, key in zip(labels, random.split(rng_key, len(labels)), strict=True):
        svi = SVI(model, guide, optim, loss=cv.candidates[label])
        result = svi.run(
            key, fit.num_steps, *args, progress_bar=fit.progress_bar, **kwargs
        )
        fitted[label] = result.params
    stacked = jax.tree.map(lambda *p: jnp.stack(p), *(fitted[c] for c in labels))
    return StackedFit(
        StackedGuide(guide, kept),
        {STACKED_PARAMS: stacked},
        stacking,
        labels,
        kept,
        fitted,
    )
