r"""Stacking of cross-validated candidates (Yao, Vehtari, Simpson & Gelman 2018).

Weights on the simplex maximise the held-out score of the mixture of the
candidates' posterior predictives, :math:`\hat w = \arg\max_{w \in
\Delta_C} \sum_{i} S(\sum_c w_c\, p_c(\cdot \mid y_{-k(i)}), y_i)`. The log
score's objective is concave in :math:`w`. The CRPS, energy and quadratic
scores of a mixture are quadratic in its weights,

.. math::

    S\Bigl(\sum_c w_c F_c, y\Bigr) = \sum_c w_c S(F_c, y)
    + \tfrac12 \sum_{c \ne d} w_c w_d\, G_{cd}(y),

with :math:`G_{cd} \ge 0` (half the energy distance of :math:`F_c` and
:math:`F_d` for the kernel scores, :math:`\lVert f_c - f_d \rVert^2` for the
quadratic score), estimated from the same draws as the candidates' scores: a
concave quadratic programme. Both are solved on softmax logits by L-BFGS.
"""

from __future__ import annotations

import dataclasses
import functools
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

from numpyro_pvi._trace.recipes import FitRecipe, check_recipe
from numpyro_pvi._trace.tracing import guide_latent_log_density, is_sample_draw
from numpyro_pvi.objectives.svi_scan import run_until_flat
from numpyro_pvi.selection.cross_validation import CrossValidation

__all__ = [
    "StackedFit",
    "StackedGuide",
    "Stacking",
    "stack",
    "stacked_pointwise",
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
    :ivar pointwise: ``(n,)`` the stacked predictive's held-out score at
        each scored observation (the weights are fitted to these scores, so
        their sum is optimistic by about the number of free weights).
    :ivar single: the candidate with the best mean held-out score alone.
    :ivar mean: the stacked predictive's mean held-out score per
        observation; ``single_mean`` the best single candidate's.
    :ivar se: the standard error of ``mean - single_mean`` (paired over
        observations).
    :ivar score: the score's name (positively oriented: the CRPS negated).
    """

    weights: xr.DataArray
    pointwise: np.ndarray
    single: str
    mean: float
    single_mean: float
    se: float
    score: str = "log"

    def __repr__(self) -> str:
        lines = [
            "Stacking of the cross-validated candidates' posterior predictives "
            f"(weights maximise the held-out {self.score} score of their mixture)",
            f"  {'candidate':<24s} weight",
        ]
        for label, w in zip(
            self.weights["candidate"].values, self.weights.values, strict=True
        ):
            lines.append(f"  {str(label):<24s} {w:6.3f}")
        lines.append(
            f"  held-out {self.score} score per observation: stacked {self.mean:.4f}, "
            f"best single ({self.single}) {self.single_mean:.4f}, "
            f"difference {self.mean - self.single_mean:+.4f} ± {self.se:.4f}"
        )
        return "\n".join(lines)


def stacking_weights_arrays(
    scores: np.ndarray, pair_gains: np.ndarray | None = None
) -> np.ndarray:
    r"""The stacking weights of ``C`` candidates from their pointwise held-out
    scores.

    Without ``pair_gains``, ``scores`` are log densities :math:`s_{ci}` and
    the weights maximise :math:`\sum_i \log \sum_c w_c e^{s_{ci}}`; with
    them, the weights maximise :math:`\sum_i [\sum_c w_c s_{ci} +
    \tfrac12 \sum_{c \ne d} w_c w_d G_{cdi}]`, the score of the mixture for
    a score that is quadratic in it (module docstring).

    :param scores: ``(C, n)`` held-out scores (finite).
    :param pair_gains: ``(C, C, n)`` the pairwise gains :math:`G_{cdi}`
        (symmetric; the diagonal is ignored), or ``None`` for log scores.
    :return: ``(C,)`` weights on the simplex.
    """
    s = _checked(scores, "held-out score", ndim=2)
    if s.shape[0] == 1:
        return np.ones(1)
    if pair_gains is None:
        objective = _log_mixture(s - s.max(axis=0, keepdims=True))
    else:
        g = _checked(pair_gains, "pairwise gain", ndim=3)
        if g.shape != (s.shape[0],) * 2 + s.shape[1:]:
            raise ValueError(
                f"stacking: pair gains of shape {g.shape} do not match scores of "
                f"shape {s.shape}; expected {(s.shape[0],) * 2 + s.shape[1:]}."
            )
        g = g.mean(axis=2)
        objective = _quadratic(s.mean(axis=1), g - np.diag(np.diag(g)))

    def negative(z: np.ndarray) -> tuple[float, np.ndarray]:
        w = softmax(z)
        value, grad_w = objective(w)
        return -value, -w * (grad_w - w @ grad_w)  # through the softmax

    start = np.zeros(s.shape[0])
    result = optimize.minimize(
        negative, start, jac=True, method="L-BFGS-B", options={"maxiter": 10_000}
    )
    return softmax(result.x)


def _checked(values: np.ndarray, what: str, ndim: int) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != ndim or min(x.shape, default=0) < 1:
        raise ValueError(
            f"stacking: expected {ndim}-dimensional {what}s "
            "((candidates, observations) scores; (candidates, candidates, "
            f"observations) gains), got shape {x.shape}."
        )
    if not np.all(np.isfinite(x)):
        raise ValueError(
            f"stacking: a {what} is not finite (NaN or -inf); stacking needs "
            "every candidate's score at every observation."
        )
    return x


def _log_mixture(s: np.ndarray) -> Callable:
    """``w -> (Σ_i log Σ_c w_c e^{s_ci}, gradient in w)``."""

    def objective(w: np.ndarray) -> tuple[float, np.ndarray]:
        with np.errstate(divide="ignore"):
            mix = logsumexp(np.log(w)[:, None] + s, axis=0)  # (n,)
        return float(mix.sum()), np.exp(s - mix).sum(axis=1)

    return objective


def _quadratic(mean: np.ndarray, gains: np.ndarray) -> Callable:
    """``w -> (w·mean + w·G w / 2, gradient in w)``."""

    def objective(w: np.ndarray) -> tuple[float, np.ndarray]:
        gw = gains @ w
        return float(w @ mean + 0.5 * w @ gw), mean + gw

    return objective


def stacked_pointwise(
    weights: np.ndarray, scores: np.ndarray, pair_gains: np.ndarray | None = None
) -> np.ndarray:
    """``(n,)`` the stacked predictive's score at each observation, from the
    candidates' ``(C, n)`` scores (and ``(C, C, n)`` pairwise gains), as in
    :func:`stacking_weights_arrays`."""
    w = np.asarray(weights, dtype=np.float64)
    if pair_gains is None:
        with np.errstate(divide="ignore"):  # a weight of exactly 0
            return logsumexp(np.log(w)[:, None] + scores, axis=0)
    off = pair_gains * (1 - np.eye(w.size))[:, :, None]
    return w @ scores + 0.5 * np.einsum("c,d,cdn->n", w, w, off)


def stacking_weights(cv: CrossValidation) -> Stacking:
    """Stacking weights of the candidates of a cross-validation (Yao,
    Vehtari, Simpson & Gelman 2018): with the log score, or a score whose
    mixture score is quadratic in the weights (CRPS, energy, quadratic; see
    the module docstring for the objective and its solver).

    :param cv: the result of :func:`~numpyro_pvi.selection.cross_validate`.
    :return: a :class:`Stacking`: the weights, the stacked predictive's
        pointwise held-out scores and the comparison with the best single
        candidate.

    **References**

    1. *Using stacking to average Bayesian predictive distributions*,
       Yuling Yao, Aki Vehtari, Daniel Simpson, Andrew Gelman (Bayesian
       Analysis 2018).
    2. Gneiting, T. & Raftery, A. E. (2007). *Strictly proper scoring rules,
       prediction, and estimation*. JASA 102(477), 359-378 (kernel scores).
    """
    if not isinstance(cv, CrossValidation):
        raise TypeError(
            "stacking_weights: expected the result of cross_validate, got "
            f"{type(cv).__name__}."
        )
    scores: Any = cv.scores
    name = scores.attrs["score"]
    quadratic = "pair_gain" in scores
    if name != "log" and not quadratic:
        raise ValueError(
            f"stacking_weights: this cross-validation scored {name!r}, a score "
            "whose value for a mixture of predictives is neither the log score "
            "nor quadratic in the weights (Score.mixture_is_quadratic), so "
            "stacking cannot solve for its weights from the candidates' "
            "held-out scores: cross-validate with score='log', 'crps', "
            "'energy' or 'quadratic'."
        )
    observed = np.asarray(scores["observed"].values, bool)
    labels = [str(c) for c in scores["candidate"].values]
    pointwise_c = np.asarray(scores["pointwise"].values)[:, observed]
    gains = np.asarray(scores["pair_gain"].values)[..., observed] if quadratic else None
    weights = stacking_weights_arrays(pointwise_c, gains)
    pointwise = stacked_pointwise(weights, pointwise_c, gains)
    means = pointwise_c.mean(axis=1)
    best = int(np.argmax(means))
    diff = pointwise - pointwise_c[best]
    return Stacking(
        xr.DataArray(weights, dims=["candidate"], coords={"candidate": labels}),
        pointwise,
        labels[best],
        float(pointwise.mean()),
        float(means[best]),
        float(diff.std(ddof=1) / np.sqrt(diff.size)) if diff.size > 1 else np.nan,
        name,
    )


class StackedGuide:
    r"""The stacked posterior :math:`q(\theta) = \sum_c w_c\, q_c(\theta)`, a
    mixture of the candidates' fitted guides, with the mixture's density.

    Each call draws a candidate :math:`c` with probability :math:`w_c`, then
    that candidate's guide with its fitted parameters; a factor
    ``"_stacked_density"``, :math:`\log q(\theta) - \log q_c(\theta)`, makes the
    trace's density the mixture's, so every function that reads a guide's
    density reads the mixture's. Its parameter ``"stacked_params"`` holds every
    candidate's parameters along a leading axis; those of the model (e.g. a
    ``numpyro.module`` network) are registered at the drawn candidate's values.
    NumPyro's :class:`~numpyro.infer.Predictive` reads a model's parameters from
    ``params`` alone: read a stacked predictive through this package's
    functions. ``targets_posterior`` is false.

    :param guide: the candidates' guide (one guide, fitted once per candidate).
    :param weights: ``(C,)`` the stacking weights.
    """

    #: a mixture of fits chosen for prediction, not the Bayesian posterior
    targets_posterior = False

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
        with handlers.trace() as tr:
            out = handlers.substitute(self.guide, data=params)(*args, **kwargs)
        draws = {n: s["value"] for n, s in tr.items() if is_sample_draw(s)}
        log_q = jax.vmap(lambda p: self._log_density(p, draws, args, kwargs))(stacked)
        mixture = jax.nn.logsumexp(self.log_weights + log_q)
        numpyro.factor("_stacked_density", mixture - log_q[component])
        for name, value in params.items():  # the model's own parameters
            if name not in tr:
                numpyro.param(name, value)
        return out

    def _log_density(
        self, params: dict, draws: dict, args: tuple, kwargs: dict
    ) -> jax.Array:
        """One candidate's log density at the draws of the guide's sites."""
        fixed = handlers.substitute(self.guide, data={**params, **draws})
        with handlers.block():
            tr = handlers.trace(handlers.seed(fixed, 0)).get_trace(*args, **kwargs)
        return guide_latent_log_density(tr)


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
        (a score :func:`stacking_weights` accepts).
    :param fit: how each fit runs (:class:`~numpyro_pvi.FitRecipe`).
    :param min_weight: candidates with a smaller weight are left out.
    :param kwargs: the model's keyword arguments.
    :return: a :class:`StackedFit`; ``predictive_score(key, stacked.params,
        model, stacked.guide, x_new, y_new)`` scores the stacked predictive.
    """
    check_recipe(fit, FitRecipe, "fit", "stack", kwargs)
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
        run = functools.partial(run_until_flat, svi) if fit.stop_early else svi.run
        result = run(key, fit.num_steps, *args, progress_bar=fit.progress_bar, **kwargs)
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
