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
import jax.numpy as jnp
import numpy as np
import pandas as pd
import xarray as xr
from scipy.special import logsumexp

from numpyro_pvi._draws import check_fitted_call, structured_draws
from numpyro_pvi._particles import ParticleSpec
from numpyro_pvi._validation import check_int
from numpyro_pvi.diagnostics._containers import ADAPTER, Container, dataset
from numpyro_pvi.diagnostics._idata import draws_dataset, root_attrs, site_dims
from numpyro_pvi.particles import LATENTS, LOG_LIK, WHOLE_DATA, log_joint

__all__ = ["pareto_smooth", "plot_psis", "psis", "psis_summary"]

#: k̂ above which importance sampling is unreliable at any sample size.
K_THRESHOLD = 0.7
#: k̂ below which the variational approximation itself is reliable
#: (Yao et al. 2018, Algorithm 1).
K_RELIABLE = 0.5
CONSTANT_WEIGHTS = "constant weights"
#: Fewest tail draws a generalized Pareto fit takes (ArviZ's minimum).
MIN_TAIL = 5


class ParetoSmoothing(NamedTuple):
    """The result of Pareto smoothing one vector of ``S`` log ratios.

    :ivar log_weight: ``(S,)`` smoothed, normalised log weights.
    :ivar pareto_k: the shape estimate k̂ (``-inf`` for constant weights).
    :ivar good_k: ``min(1 - 1/log10(S), 0.7)``, the sample-size dependent
        threshold of Vehtari et al. (2024).
    :ivar ess_is: importance sampling effective sample size ``1/Σ w̃²``.
    :ivar min_ss: the minimum sample size for a reliable estimate at this k̂,
        ``10^(1/(1-max(0, k̂)))`` (``inf`` for k̂ ≥ 1).
    :ivar tail_length: number of draws in the fitted tail, ArviZ's:
        ``ceil(min(S/5, 3√S))`` on ArviZ 0.2x, ``floor(3√S)`` (``floor(S/5)``
        up to 225 draws) on ArviZ ≥ 1.0.
    :ivar note: ``"constant weights"`` when the ratios are constant (an exact
        guide), otherwise ``""``.
    :ivar num_zero_density: draws with log ratio ``-inf`` (zero model
        density): weight zero, counted in ``S``.
    """

    log_weight: np.ndarray
    pareto_k: float
    good_k: float
    ess_is: float
    min_ss: float
    tail_length: int
    note: str
    num_zero_density: int = 0


def pareto_smooth(
    log_ratio: Any, *, constant_rtol: float | None = None
) -> ParetoSmoothing:
    r"""Pareto-smooth importance log ratios with ArviZ's PSIS.

    ArviZ's Pareto fit does the smoothing (``arviz.psislw`` on ArviZ 0.2x,
    ``arviz_stats.base.array_stats.psislw`` on ArviZ ≥ 1.0), with relative
    efficiency 1: the guide's draws are independent.

    Draws whose log ratio is ``-inf`` (zero model density, e.g. a guide
    wider than the model's support, or a likelihood that underflows) get
    weight zero and are counted in ``num_zero_density``; they stay among the
    ``S`` draws, so the tail is the largest ``M`` of all ``S`` ratios, as in
    :func:`numpyro.infer.psis_diagnostic`, and k̂ is what the finite ratios
    of that tail imply. Ratios whose spread is below ``constant_rtol *
    max(1, max|log r|)`` are *constant* (the guide is exact up to rounding):
    the generalized Pareto fit is undefined there (it returns ``+inf``), so
    the outcome reported is k̂ = ``-inf``, uniform weights, ``ess_is = S``
    and the note ``"constant weights"``; finite ratios that are constant
    beside ``-inf`` ones are bounded weights, uniform over the draws of
    positive density (k̂ = ``-inf``, no note: the guide is not exact). With
    fewer than 5 draws in the tail (``S < 21`` on ArviZ 0.2x, ``S < 25`` on
    ArviZ ≥ 1.0, whose tail is a draw shorter) no tail can be fitted: k̂ =
    ``inf`` and the weights are the raw normalised ratios, as ArviZ 0.2x
    reports it; a fit that fails (NaN from arviz-stats on very short tails)
    is reported as k̂ = ``inf`` too.

    :param log_ratio: ``(S,)`` log importance ratios
        :math:`\log p(\theta_s, y) - \log q(\theta_s)`.
    :param constant_rtol: relative spread below which the ratios count as
        constant; default ``sqrt`` of the float64 machine epsilon.
    :return: :class:`ParetoSmoothing`.

    **References**

    1. *Pareto smoothed importance sampling*, Vehtari, Simpson, Gelman, Yao,
       Gabry (JMLR 2024).
    """
    lr = np.asarray(log_ratio, dtype=np.float64).reshape(-1)
    num = lr.size
    if num < 2 or not np.all(np.isfinite(lr) | (lr == -np.inf)):
        raise ValueError(
            "pareto_smooth: need at least 2 log ratios, none NaN or +inf; got "
            f"{num} with {int(np.sum(~np.isfinite(lr) & (lr != -np.inf)))} invalid."
        )
    if constant_rtol is None:
        constant_rtol = math.sqrt(np.finfo(np.float64).eps)
    tail_length = ADAPTER.tail_length(num)
    good_k = min(1 - 1 / math.log10(num), K_THRESHOLD)
    finite = lr[np.isfinite(lr)]
    if finite.size == 0:
        raise ValueError(
            "pareto_smooth: every log ratio is -inf: the model gives the guide's "
            "draws zero density; check the guide's support against the model's."
        )
    num_zero = num - finite.size
    constant = np.ptp(finite) <= constant_rtol * max(1.0, float(np.max(np.abs(finite))))
    if constant and num_zero:
        # bounded weights: uniform over the draws of positive density
        log_weight = np.where(np.isfinite(lr), -math.log(finite.size), -np.inf)
        return ParetoSmoothing(
            log_weight,
            -math.inf,
            good_k,
            float(finite.size),
            10.0,
            tail_length,
            "",
            num_zero,
        )
    if constant:
        log_weight = np.full(num, -math.log(num))
        return ParetoSmoothing(
            log_weight,
            -math.inf,
            good_k,
            float(num),
            10.0,
            tail_length,
            CONSTANT_WEIGHTS,
        )
    if tail_length < MIN_TAIL:
        # too few draws to fit a tail (ArviZ 0.2x's convention on both
        # generations; arviz-stats refuses): k̂ = inf, raw normalised weights
        log_weight, k = lr - logsumexp(lr), math.inf
    else:
        log_weight, k = ADAPTER.psislw(lr)
        # a failed fit: NaN from arviz-stats (e.g. 25 draws), inf from 0.2x
        k = math.inf if math.isnan(k) else float(k)
    ess_is = float(np.exp(-logsumexp(2 * log_weight)))
    min_ss = 10 ** (1 / (1 - max(0.0, k))) if k < 1 else math.inf
    return ParetoSmoothing(
        np.asarray(log_weight), k, good_k, ess_is, min_ss, tail_length, "", num_zero
    )


def psis(
    rng_key: jax.Array,
    param_map: dict[str, jax.Array],
    model: Callable,
    guide: Callable,
    *args: Any,
    num_draws: int = 4000,
    chunk_size: int | None = None,
    **kwargs: Any,
) -> Container:
    r"""PSIS k̂ diagnostic of a fitted guide, in ArviZ's container.

    Draws :math:`\theta_s \sim q` (:math:`s = 1..S`), evaluates the log ratios
    :math:`\log r_s = \log p(\theta_s, y) - \log q(\theta_s)` in one
    vectorised pass and Pareto-smooths them with ArviZ (:func:`pareto_smooth`)
    (Yao et al. 2018). k̂ < 0.5: the guide is reliable; k̂ < ``good_k``: use
    the PSIS-adjusted estimates; otherwise neither can be trusted.

    Groups (dims ``(chain=1, draw=S)``):

    - ``posterior``: the guide draws of every latent site (constrained), the
      same draws whose weights are reported;
    - ``sample_stats``: ``lp`` (:math:`\log p(\theta, y)`, every site with
      its handler scale, as :func:`numpyro.infer.util.log_density`), ``log_q``,
      ``log_ratio`` and ``log_weight`` (smoothed, normalised);
    - ``psis``: scalars ``pareto_k``, ``good_k``, ``ess_is``, ``min_ss``,
      ``tail_length``, ``num_zero_density`` (draws the model gives zero
      density: weight zero; the guide puts mass outside the posterior's
      support); attrs name the method, the thresholds and a ``note``
      (``"constant weights"`` for an exact guide, reported as k̂ = −inf with
      ``ess_is = S``).

    :param rng_key: random key.
    :param param_map: the fitted parameters (e.g. ``svi_result.params``).
    :param model: the NumPyro model.
    :param guide: the fitted guide.
    :param args: positional arguments of model and guide.
    :param num_draws: ``S``, the number of draws (at least 2).
    :param chunk_size: evaluate the draws in chunks of this size with
        ``lax.map`` to bound memory; ``None`` evaluates all at once.
    :param kwargs: keyword arguments of model and guide.
    :return: ``arviz.InferenceData`` on ArviZ 0.2x, ``xarray.DataTree`` with
        the same groups on ArviZ ≥ 1.0.

    **References**

    1. *Yes, but Did It Work?: Evaluating Variational Inference*, Yuling Yao,
       Aki Vehtari, Daniel Simpson, Andrew Gelman (ICML 2018).
    2. *Pareto smoothed importance sampling*, Vehtari, Simpson, Gelman, Yao,
       Gabry (JMLR 2024).
    """
    param_map, model, guide = check_fitted_call("psis", param_map, model, guide)
    num_draws = check_int(num_draws, "num_draws", "psis", minimum=2)
    # log p(θ, y) is the joint density: every site with its own scale
    terms, tr = structured_draws(
        rng_key,
        param_map,
        model,
        guide,
        args,
        kwargs,
        ParticleSpec(
            num_draws,
            (LOG_LIK, LATENTS),
            WHOLE_DATA,
            objective="psis",
            require_observed=False,
            stratified=False,
        ),
        chunk_size=chunk_size,
    )
    dims = site_dims(tr)
    lp = log_joint(terms)
    log_ratio = lp - terms.log_q
    eps = jnp.finfo(jnp.result_type(log_ratio)).eps
    smooth = pareto_smooth(log_ratio, constant_rtol=math.sqrt(float(eps)))

    posterior = draws_dataset(
        terms.latents, dims={name: dims[name] for name in terms.latents}
    )
    sample_stats = draws_dataset(
        {
            "lp": lp,
            "log_q": terms.log_q,
            "log_ratio": log_ratio,
            "log_weight": smooth.log_weight,
        }
    )
    thresholds = {"k_threshold": K_THRESHOLD, "k_reliable": K_RELIABLE}
    group = xr.Dataset(
        {
            "pareto_k": smooth.pareto_k,
            "good_k": smooth.good_k,
            "ess_is": smooth.ess_is,
            "min_ss": smooth.min_ss,
            "tail_length": smooth.tail_length,
            "num_zero_density": smooth.num_zero_density,
        },
        attrs={
            "method": "Pareto smoothed importance sampling (ArviZ psislw)",
            "reference": "Yao et al. (2018); Vehtari et al. (2024)",
            "good_k": smooth.good_k,
            "num_draws": num_draws,
            "note": smooth.note,
            **thresholds,
        },
    )
    return ADAPTER.build(
        {"posterior": posterior, "sample_stats": sample_stats, "psis": group},
        root_attrs(guide, diagnostic="psis"),
    )


def _components(da: xr.DataArray) -> tuple[list[str], np.ndarray]:
    """Labels ``name[i, j]`` and a ``(chain*draw, K)`` matrix of one variable."""
    values = np.asarray(da.values, dtype=float)
    shape = values.shape[2:]
    flat = values.reshape(values.shape[0] * values.shape[1], -1)
    if not shape:
        return [str(da.name)], flat
    labels = [f"{da.name}[{', '.join(map(str, idx))}]" for idx in np.ndindex(*shape)]
    return labels, flat


def verdict(
    pareto_k: float,
    good_k: float,
    note: str = "",
    *,
    num_zero_density: int = 0,
    num_draws: int | None = None,
) -> str:
    """One line following Yao et al. (2018), Algorithm 1.

    ``"reliable"`` for k̂ < 0.5 (use the guide as is), ``"usable with PSIS"``
    for 0.5 ≤ k̂ < ``good_k`` (use the PSIS-adjusted estimates),
    ``"unreliable"`` otherwise (improve the guide or the model, or use MCMC).
    Draws with zero model density make the guide wrong as it is whatever
    k̂ says: the verdict is then at best ``"usable with PSIS"`` (which gives
    them weight zero).
    """
    zeros = ""
    if num_zero_density:
        of = "" if num_draws is None else f" of {num_draws}"
        zeros = (
            f" {num_zero_density}{of} draws have zero density under the model: "
            "the guide puts mass where the posterior has none."
        )
    if note == CONSTANT_WEIGHTS:
        return (
            "reliable: constant weights, the guide equals the posterior up to rounding."
        )
    if pareto_k < K_RELIABLE and not zeros:
        return f"reliable: k̂ = {pareto_k:.2f} < {K_RELIABLE}, use the guide as is."
    if pareto_k < good_k:
        return (
            f"usable with PSIS: k̂ = {pareto_k:.2f} < good_k = {good_k:.2f}, "
            "use the PSIS-adjusted estimates." + zeros
        )
    return (
        f"unreliable: k̂ = {pareto_k:.2f} ≥ good_k = {good_k:.2f}; neither the "
        "guide nor PSIS can be trusted, improve the guide or use MCMC." + zeros
    )


def psis_summary(idata: Container) -> pd.DataFrame:
    r"""Plain-VI and PSIS-adjusted posterior mean and sd of every component.

    The PSIS-adjusted moments weight the draws with the smoothed importance
    weights :math:`\tilde w_s`: mean :math:`\sum_s \tilde w_s \theta_s`, sd
    :math:`(\sum_s \tilde w_s (\theta_s - \bar\theta)^2)^{1/2}`.

    :param idata: the result of :func:`psis`.
    :return: a ``pandas.DataFrame`` indexed by component (``theta[0]``, ...)
        with columns ``vi_mean``, ``vi_sd``, ``psis_mean``, ``psis_sd``; its
        ``attrs`` hold ``pareto_k``, ``good_k`` and the one-line ``verdict``
        (Yao et al. 2018, Algorithm 1).
    """
    group = dataset(idata, "psis", "psis_summary", "psis")
    sample_stats = ADAPTER.dataset(idata, "sample_stats")
    posterior = ADAPTER.dataset(idata, "posterior")
    weight = np.exp(np.asarray(sample_stats["log_weight"].values).reshape(-1))
    weight = weight / weight.sum()
    rows, labels = [], []
    for name in posterior.data_vars:
        names, flat = _components(posterior[name])
        vi_mean = flat.mean(axis=0)
        psis_mean = weight @ flat
        rows.append(
            np.stack(
                [
                    vi_mean,
                    flat.std(axis=0),
                    psis_mean,
                    np.sqrt(weight @ (flat - psis_mean) ** 2),
                ],
                axis=1,
            )
        )
        labels += names
    table = pd.DataFrame(
        np.concatenate(rows) if rows else np.zeros((0, 4)),
        index=labels,
        columns=["vi_mean", "vi_sd", "psis_mean", "psis_sd"],
    )
    pareto_k, good_k = float(group["pareto_k"]), float(group["good_k"])
    zeros = int(group["num_zero_density"]) if "num_zero_density" in group else 0
    table.attrs.update(
        pareto_k=pareto_k,
        good_k=good_k,
        verdict=verdict(
            pareto_k,
            good_k,
            group.attrs.get("note", ""),
            num_zero_density=zeros,
            num_draws=int(group.attrs["num_draws"]),
        ),
    )
    return table


def plot_psis(idata: Container, *, axes: Any = None) -> np.ndarray:
    """Plot the Pareto tail fit and k̂ against its thresholds.

    Left: the largest log ratios (the fitted tail, points) with the fitted
    generalized Pareto quantiles (line, the smoothed values ArviZ's PSIS put
    in their place) and the tail cutoff. Right: k̂ on the k scale with
    0.5, ``good_k`` and 0.7 marked.

    :param idata: the result of :func:`psis`.
    :param axes: two matplotlib axes to draw on; new ones when ``None``.
    :return: the array of the two axes.
    """
    import matplotlib.pyplot as plt

    group = dataset(idata, "psis", "plot_psis", "psis")
    sample_stats = ADAPTER.dataset(idata, "sample_stats")
    if axes is None:
        _, axes = plt.subplots(
            1, 2, figsize=(10, 3.5), width_ratios=(2, 1), layout="constrained"
        )
    axes = np.asarray(axes).reshape(-1)
    if axes.size != 2:
        raise ValueError(f"plot_psis: axes must hold 2 axes, got {axes.size}.")
    k = float(group["pareto_k"])
    good_k = float(group["good_k"])
    note = group.attrs.get("note", "")
    log_ratio = np.asarray(sample_stats["log_ratio"].values).reshape(-1)
    log_weight = np.asarray(sample_stats["log_weight"].values).reshape(-1)
    order = np.argsort(log_ratio)
    tail = int(group["tail_length"])
    ax = axes[0]
    if note == CONSTANT_WEIGHTS:
        ax.plot(np.arange(log_ratio.size), log_ratio[order], ".", ms=2)
        ax.set_title("log ratios: constant weights (no tail to fit)")
        ax.set_xlabel("draw (sorted)")
    else:
        # body draws are not smoothed: their offset maps weights to log ratios
        # (the smallest finite ratio: zero-density draws are -inf in both)
        body = order[np.isfinite(log_ratio[order])][0]
        offset = log_ratio[body] - log_weight[body]
        rank = np.arange(log_ratio.size - tail, log_ratio.size)
        tail_idx = order[-tail:]
        cutoff = log_ratio[order[-tail - 1]]
        ax.plot(rank, log_ratio[tail_idx], ".", ms=3, label="log ratio (tail)")
        fitted = np.sort(log_weight[tail_idx]) + offset
        ax.plot(rank, fitted, "-", lw=1.5, label=f"generalized Pareto, k̂ = {k:.2f}")
        ax.axhline(cutoff, color="0.5", ls=":", lw=1, label="tail cutoff")
        ax.set_title("Pareto tail of the importance ratios")
        ax.set_xlabel("draw rank (sorted log ratio)")
        ax.legend(loc="upper left", fontsize="small")
    ax.set_ylabel("log p(θ, y) − log q(θ)")

    ax = axes[1]
    lo, hi = (min(-0.5, k - 0.1), max(1.2, k + 0.1)) if np.isfinite(k) else (-0.5, 1.2)
    ax.axvline(K_RELIABLE, color="tab:green", ls="--", lw=1, label="0.5")
    ax.axvline(
        good_k, color="tab:orange", ls="--", lw=1, label=f"good_k = {good_k:.2f}"
    )
    ax.axvline(K_THRESHOLD, color="tab:red", ls="-", lw=1, label="0.7")
    shown = k if np.isfinite(k) else lo
    ax.plot([shown], [0.0], "ko", ms=8, label=f"k̂ = {k:.2f}")
    ax.set_xlim(lo, hi)
    ax.set_yticks([])
    ax.set_xlabel("Pareto k")
    ax.set_title(note or "k̂")
    ax.legend(loc="upper right", fontsize="small")
    return axes
