"""PSIS k̂ of a fitted guide in ArviZ's container (Yao et al. 2018).

The guide's draws θ_s ~ q, their log ratios log p(θ_s, y) − log q(θ_s), the
Pareto-smoothed importance weights and the k̂ diagnostic in one object that
ArviZ can summarise, plot and save.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np
import pandas as pd
import xarray as xr
from jax import random
from scipy.special import logsumexp

from numpyro_pvi._arviz.containers import ADAPTER, Container, dataset
from numpyro_pvi._arviz.idata import (
    component_labels,
    draws_dataset,
    objective_attrs,
    root_attrs,
    site_dims,
)
from numpyro_pvi._trace.data_plate import WHOLE_DATA
from numpyro_pvi._trace.particles import ParticleSpec
from numpyro_pvi._trace.reductions import log_joint
from numpyro_pvi._trace.terms import LATENTS, LOG_LIK, ParticleTerms, present
from numpyro_pvi._trace.validation import check_int, check_loss_target
from numpyro_pvi.diagnostics._pareto import (
    CONSTANT_WEIGHTS,
    K_RELIABLE,
    K_THRESHOLD,
    ParetoSmoothing,
    stable_smoothing,
)
from numpyro_pvi.evaluation.draws import (
    check_fitted_call,
    guide_draws,
    structured_draws,
)

__all__ = ["PsisArrays", "psis", "psis_arrays", "psis_groups"]


def psis(
    rng_key: jax.Array,
    params: dict[str, jax.Array],
    model: Callable,
    guide: Callable,
    *args: Any,
    loss: Any = None,
    num_draws: int = 4000,
    max_draws: int = 64_000,
    chunk_size: int | None = None,
    **kwargs: Any,
) -> Container:
    r"""PSIS k̂ diagnostic of a fitted guide, in ArviZ's container.

    Draws :math:`\theta_s \sim q`, evaluates :math:`\log r_s = \log p(\theta_s,
    y) - \log q(\theta_s)` in one vectorised pass and Pareto-smooths them
    (Yao et al. 2018). k̂ < 0.5: the guide is reliable; k̂ < ``good_k``: use the
    PSIS-adjusted estimates; otherwise neither. While the 95% interval of k̂
    (its standard error about :math:`(1 + \hat k)/\sqrt{M}` for a tail of
    :math:`M` draws) contains a threshold, more log ratios are drawn, four times
    as many a round, up to ``max_draws``. Pass the ``loss`` the guide was fitted
    with: for an objective that does not target the Bayesian posterior a large
    k̂ is the intended distance from it, and the verdict says so.

    Groups (dims ``(chain=1, draw=S)``): ``posterior`` (the draws);
    ``sample_stats`` (``lp``, ``log_q``, ``log_ratio``, ``log_weight``); ``psis``
    (``pareto_k``, ``pareto_k_se``, ``good_k``, ``ess_is``, ``min_ss``,
    ``tail_length``, ``num_zero_density``, ``num_ratio_draws``; attrs: method,
    thresholds, objective, ``note``; an exact guide reads k̂ = −inf).

    :param rng_key: random key.
    :param params: the fitted parameters (e.g. ``svi_result.params``).
    :param model: the NumPyro model.
    :param guide: the fitted guide.
    :param args: positional arguments of model and guide.
    :param loss: the objective the guide was fitted with (``None``: read k̂
        as for a Bayesian fit).
    :param num_draws: ``S``, the number of draws stored (at least 2).
    :param max_draws: the most log ratios drawn to make the verdict stable.
    :param chunk_size: evaluate the draws in chunks of this size with
        ``lax.map`` to bound memory; ``None`` evaluates all at once.
    :param kwargs: keyword arguments of model and guide.
    :return: ``arviz.InferenceData`` on ArviZ 0.2x, ``xarray.DataTree`` with
        the same groups on ArviZ ≥ 1.0.

    **References**

    1. Yao, Y., Vehtari, A., Simpson, D. & Gelman, A. (2018). *Yes, but did it
       work?: Evaluating variational inference*. ICML.
    2. Vehtari, A., Simpson, D., Gelman, A., Yao, Y. & Gabry, J. (2024).
       *Pareto smoothed importance sampling*. JMLR 25(72).
    """
    params, model, guide = check_fitted_call(
        "psis", params, model, guide, needs_density=True, args=args, kwargs=kwargs
    )
    num_draws = check_int(num_draws, "num_draws", "psis", minimum=2)
    max_draws = check_int(max_draws, "max_draws", "psis", minimum=2)
    targets = check_loss_target(loss, "psis")
    spec = ParticleSpec(
        num_draws,
        frozenset({LOG_LIK, LATENTS}),
        WHOLE_DATA,
        objective="psis",
        require_observed=False,
        fixed_observations=False,
        stratified=False,
    )
    fit = (rng_key, params, model, guide, args, kwargs)
    terms, tr = structured_draws(*fit, spec, chunk_size=chunk_size)
    arrays = psis_arrays(fit, terms, max_draws=max_draws, chunk_size=chunk_size)
    return ADAPTER.build(
        psis_groups(arrays, site_dims(tr), loss, targets),
        root_attrs(guide, diagnostic="psis", **objective_attrs(loss, targets)),
    )


class PsisArrays(NamedTuple):
    """The numbers of :func:`psis`, over the ``S`` stored draws: ``latents``
    (site → ``(S, ...)``), ``lp`` (:math:`\\log p(\theta, y)`), ``log_q``,
    ``log_ratio``, ``log_weight`` (smoothed, normalised), and the Pareto
    ``smoothing`` fitted to ``num_ratio_draws`` log ratios (the stored
    draws' and those drawn to settle k̂)."""

    latents: dict[str, np.ndarray]
    lp: np.ndarray
    log_q: np.ndarray
    log_ratio: np.ndarray
    log_weight: np.ndarray
    smoothing: ParetoSmoothing
    num_ratio_draws: int


def psis_arrays(
    fit: tuple, terms: ParticleTerms, *, max_draws: int, chunk_size: int | None = None
) -> PsisArrays:
    """The array core of :func:`psis`, from the stored draws ``terms`` (with
    ``log_lik`` and ``latents``, at any data plate: the log joint density is
    the same) of ``fit = (rng_key, params, model, guide, args, kwargs)``;
    more log ratios are drawn with keys folded from ``rng_key`` while k̂ is
    not settled."""
    rng_key, param_map, model, guide, args, kwargs = fit
    lp = np.asarray(log_joint(terms))  # every site with its own scale
    log_q = np.asarray(terms.log_q)
    log_ratio = np.asarray(lp - log_q, np.float64)
    more = ParticleSpec(
        log_ratio.size,
        frozenset({LOG_LIK}),
        WHOLE_DATA,
        objective="psis",
        require_observed=False,
        fixed_observations=False,
        stratified=False,
    )
    smooth, total = stable_smoothing(
        log_ratio,
        max_draws,
        lambda i: _more_log_ratios(
            random.fold_in(rng_key, i),
            param_map,
            model,
            guide,
            args,
            kwargs,
            more,
            chunk_size,
        ),
    )
    log_weight = smooth.log_weight[: log_ratio.size]
    log_weight = log_weight - logsumexp(log_weight)
    latents = {
        name: np.asarray(v) for name, v in present(terms.latents, "latents").items()
    }
    return PsisArrays(latents, lp, log_q, log_ratio, log_weight, smooth, total)


def psis_groups(
    arrays: PsisArrays, dims: dict[str, list[str]], loss: Any, targets: bool | None
) -> dict[str, xr.Dataset]:
    """The groups ``posterior``, ``sample_stats`` and ``psis`` of
    :func:`psis`; ``dims`` names the latent sites' dims."""
    smooth = arrays.smoothing
    posterior = draws_dataset(
        arrays.latents, dims={name: dims[name] for name in arrays.latents}
    )
    sample_stats = draws_dataset(
        {
            "lp": arrays.lp,
            "log_q": arrays.log_q,
            "log_ratio": arrays.log_ratio,
            "log_weight": arrays.log_weight,
        }
    )
    group = xr.Dataset(
        {
            "pareto_k": smooth.pareto_k,
            "pareto_k_se": smooth.pareto_k_se,
            "good_k": smooth.good_k,
            "ess_is": _ess(arrays.log_weight, smooth.note),
            "min_ss": smooth.min_ss,
            "tail_length": smooth.tail_length,
            "num_zero_density": smooth.num_zero_density,
            "num_ratio_draws": arrays.num_ratio_draws,
        },
        attrs={
            "method": "Pareto smoothed importance sampling (ArviZ psislw)",
            "reference": "Yao et al. (2018); Vehtari et al. (2024)",
            "good_k": smooth.good_k,
            "num_draws": arrays.log_ratio.size,
            "note": smooth.note,
            "k_threshold": K_THRESHOLD,
            "k_reliable": K_RELIABLE,
            **objective_attrs(loss, targets),
        },
    )
    return {"posterior": posterior, "sample_stats": sample_stats, "psis": group}


def _ess(log_weight: np.ndarray, note: str) -> float:
    """``1/Σ w̃²`` of the stored draws (exactly ``S`` for constant weights)."""
    if note == CONSTANT_WEIGHTS:
        return float(log_weight.size)
    return float(np.exp(-logsumexp(2 * log_weight)))


def _more_log_ratios(
    rng_key: jax.Array,
    param_map: dict[str, jax.Array],
    model: Callable,
    guide: Callable,
    args: tuple,
    kwargs: dict,
    spec: ParticleSpec,
    chunk_size: int | None,
) -> np.ndarray:
    """``spec.num_particles`` more log ratios (one compiled program, reused
    for every batch)."""
    terms = guide_draws(
        rng_key, param_map, model, guide, args, kwargs, spec, chunk_size=chunk_size
    )
    return np.asarray(log_joint(terms) - terms.log_q, np.float64)


#: ``z`` of a two-sided 95% interval.
_Z95 = 1.96


def _components(da: xr.DataArray) -> tuple[list[str], np.ndarray]:
    """Labels ``name[i, j]`` and a ``(chain*draw, C)`` matrix of one variable."""
    values = np.asarray(da.values, dtype=float)
    shape = values.shape[2:]
    flat = values.reshape(values.shape[0] * values.shape[1], -1)
    return component_labels(str(da.name), shape), flat


def _k_text(pareto_k: float, se: float | None) -> str:
    if se is None or not math.isfinite(pareto_k) or not se > 0:
        return f"k̂ = {pareto_k:.2f}"
    return f"k̂ = {pareto_k:.2f} ± {se:.2f}"


def _borderline(pareto_k: float, se: float | None, good_k: float) -> str:
    """A note when k̂'s 95% interval contains a threshold."""
    if se is None or not math.isfinite(pareto_k) or not se > 0:
        return ""
    near = [t for t in (K_RELIABLE, good_k) if abs(pareto_k - t) <= _Z95 * se]
    if not near:
        return ""
    return (
        f" Borderline: the 95% interval of k̂ contains {near[0]:.2f}, so another "
        "key may read differently; pass a larger num_draws/max_draws."
    )


def _zeros(num_zero_density: int, num_draws: int | None) -> str:
    if not num_zero_density:
        return ""
    of = "" if num_draws is None else f" of {num_draws}"
    return (
        f" {num_zero_density}{of} draws have zero density under the model: "
        "the guide puts mass where the posterior has none."
    )


def verdict(
    pareto_k: float,
    good_k: float,
    note: str = "",
    *,
    num_zero_density: int = 0,
    num_draws: int | None = None,
    pareto_k_se: float | None = None,
    targets_posterior: bool | None = None,
) -> str:
    """One line following Yao et al. (2018), Algorithm 1.

    For a Bayesian fit (``targets_posterior`` true or unknown):
    ``"reliable"`` for k̂ < 0.5 (use the guide as is), ``"usable with
    PSIS"`` for 0.5 ≤ k̂ < ``good_k`` (use the PSIS-adjusted estimates),
    ``"unreliable"`` otherwise (improve the guide or the model, or use MCMC).
    Draws with zero model density make the guide wrong as it is whatever k̂
    says: the verdict is then at best ``"usable with PSIS"`` (which gives
    them weight zero). With ``pareto_k_se`` the line gives k̂ ± its Monte
    Carlo standard error and says *borderline* when the 95% interval
    contains a threshold.

    For a fit whose objective does not target the Bayesian posterior
    (``targets_posterior`` false: PVI, PAC^m) the guide is not meant to be
    the posterior, so no k̂ makes it "reliable, use as is": the line starts
    ``"not a posterior fit"``, says whether PSIS recovers the Bayesian
    posterior from it (k̂ < ``good_k``) and points to held-out scores.
    """
    zeros = _zeros(num_zero_density, num_draws)
    k = _k_text(pareto_k, pareto_k_se)
    border = _borderline(pareto_k, pareto_k_se, good_k)
    if note == CONSTANT_WEIGHTS:
        return (
            "reliable: constant weights, the guide equals the posterior up to rounding."
        )
    if targets_posterior is False:
        recovers = (
            "PSIS recovers the Bayesian posterior from its draws (psis_* columns)"
            if pareto_k < good_k
            else "PSIS cannot recover the Bayesian posterior from its draws"
        )
        return (
            f"not a posterior fit: {k}; the objective is predictive, so the guide "
            f"differs from the Bayesian posterior by design and {recovers}. Judge "
            "the fit by held-out scores (predictive_score, cross_validate)."
            + zeros
            + border
        )
    if pareto_k < K_RELIABLE and not zeros:
        return f"reliable: {k} < {K_RELIABLE}, use the guide as is." + border
    if pareto_k < good_k:
        return (
            f"usable with PSIS: {k} < good_k = {good_k:.2f}, "
            "use the PSIS-adjusted estimates." + zeros + border
        )
    return (
        f"unreliable: {k} ≥ good_k = {good_k:.2f}; neither the guide nor PSIS "
        "can be trusted, improve the guide or use MCMC." + zeros + border
    )


def _targets(attrs: dict) -> bool | None:
    return {"true": True, "false": False}.get(str(attrs.get("targets_posterior")))


def psis_summary(idata: Container) -> pd.DataFrame:
    r"""Plain-VI and PSIS-adjusted posterior mean and sd of every component.

    The PSIS-adjusted moments weight the draws with the smoothed importance
    weights :math:`\tilde w_s`: mean :math:`\sum_s \tilde w_s \theta_s`, sd
    :math:`(\sum_s \tilde w_s (\theta_s - \bar\theta)^2)^{1/2}`.

    :param idata: the result of :func:`~numpyro_pvi.diagnostics.psis`.
    :return: a ``pandas.DataFrame`` indexed by component (``theta[0]``, ...)
        with columns ``vi_mean``, ``vi_sd``, ``psis_mean``, ``psis_sd``; its
        ``attrs`` hold ``pareto_k``, ``pareto_k_se``, ``good_k`` and the
        one-line ``verdict`` (``verdict``, read for the objective
        recorded by ``psis(..., loss=)``).
    """
    group = dataset(idata, "psis", "psis_summary", "psis")
    sample_stats = ADAPTER.dataset(idata, "sample_stats")
    posterior = ADAPTER.dataset(idata, "posterior")
    return summary_table(posterior, sample_stats, group)


def summary_table(
    posterior: xr.Dataset, sample_stats: xr.Dataset, group: xr.Dataset
) -> pd.DataFrame:
    """:func:`psis_summary` from the groups of a :func:`psis` result (or of
    :func:`~numpyro_pvi.diagnostics.psis.psis_groups`)."""
    weight = np.exp(np.asarray(sample_stats["log_weight"].values).reshape(-1))
    weight = weight / weight.sum()
    rows, labels = [], []
    for name in posterior.data_vars:
        names, flat = _components(posterior[name])
        psis_mean = weight @ flat
        moments = [flat.mean(axis=0), flat.std(axis=0), psis_mean]
        moments.append(np.sqrt(weight @ (flat - psis_mean) ** 2))
        rows.append(np.stack(moments, axis=1))
        labels += names
    table = pd.DataFrame(
        np.concatenate(rows) if rows else np.zeros((0, 4)),
        index=labels,
        columns=["vi_mean", "vi_sd", "psis_mean", "psis_sd"],
    )
    pareto_k, good_k = float(group["pareto_k"]), float(group["good_k"])
    se = float(group["pareto_k_se"]) if "pareto_k_se" in group else None
    zeros = int(group["num_zero_density"]) if "num_zero_density" in group else 0
    table.attrs.update(
        pareto_k=pareto_k,
        pareto_k_se=se,
        good_k=good_k,
        verdict=verdict(
            pareto_k,
            good_k,
            group.attrs.get("note", ""),
            num_zero_density=zeros,
            num_draws=int(group.attrs["num_draws"]),
            pareto_k_se=se,
            targets_posterior=_targets(group.attrs),
        ),
    )
    return table
