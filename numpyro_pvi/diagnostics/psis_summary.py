"""The reading of a :func:`~numpyro_pvi.diagnostics.psis` result: Yao et
al.'s verdict with k̂'s Monte Carlo error and the objective's meaning, and
the plain vs PSIS-adjusted moments."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import xarray as xr

from numpyro_pvi.diagnostics._containers import ADAPTER, Container, dataset
from numpyro_pvi.diagnostics._idata import component_labels
from numpyro_pvi.diagnostics._pareto import CONSTANT_WEIGHTS, K_RELIABLE

__all__ = ["psis_summary", "summary_table", "verdict"]

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
