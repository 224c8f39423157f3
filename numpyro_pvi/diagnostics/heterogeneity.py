r"""Which parameters vary in the population? (Lai & Yao 2024, §2.5)

Under a misspecified model, the VI (Bayesian) posterior of every parameter
concentrates at rate ``1/√n``, while the PVI posterior of a parameter that
actually varies across observations stays wide: PVI spreads it so that the
posterior predictive covers the spread of the data. Parameters whose PVI
posterior sd is much larger than the VI one point to where the model should be
expanded (e.g. a fixed effect that should be random).

The reading needs the predictive score to *identify* the spread: for single
binary or categorical outcomes the posterior predictive
:math:`E_q[p(y_i \mid \theta)]` depends on q only through the mean
probabilities :math:`E_q[\sigma(\eta_i)]`, so PVI's spread is set by the
regularizer, not by the data, and a wide PVI posterior says nothing about
heterogeneity. Such models, and parameters whose PVI sd stays near their
prior sd, are reported as ``"not identified"``, never as heterogeneous.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np
import xarray as xr
from numpyro.infer import Predictive

from numpyro_pvi._arviz.containers import ADAPTER, Container, dataset
from numpyro_pvi._arviz.idata import component_labels, guide_name, root_attrs
from numpyro_pvi._trace.data_plate import WHOLE_DATA, observed_sites
from numpyro_pvi._trace.particles import ParticleSpec
from numpyro_pvi._trace.structure import (
    check_full_data,
    feasible_improper,
    improper_latents,
    replay_trace,
)
from numpyro_pvi._trace.terms import LATENTS
from numpyro_pvi._trace.validation import check_int, check_real
from numpyro_pvi.evaluation.draws import check_fitted_call, guide_draws

__all__ = [
    "HETEROGENEOUS",
    "NOT_IDENTIFIED",
    "HeterogeneityArrays",
    "heterogeneity",
    "heterogeneity_arrays",
    "plot_heterogeneity",
]

HETEROGENEOUS = "heterogeneous"
NOT_IDENTIFIED = "not identified"
#: A PVI sd at least this fraction of the prior sd is the prior's spread,
#: not the data's.
PRIOR_FRACTION = 0.5
BINARY_OUTCOME = (
    "every observed site is a single binary or categorical outcome ({sites}): "
    "the posterior predictive depends on q only through the mean "
    "probabilities E_q[sigma(eta)], so no predictive score identifies the "
    "spread of q and the PVI/VI sd ratio cannot read heterogeneity. Compare "
    "predictive scores of an expanded model instead ("
    "numpyro_pvi.predictive_score on held-out data)."
)
PRIOR_DOMINATED = (
    "a parameter whose PVI sd is at least {fraction:g} of its prior sd keeps "
    "the prior's spread: the data do not identify it, and it is reported as "
    "'not identified' rather than heterogeneous."
)


def _component_sd(latents: dict[str, jax.Array]) -> tuple[list[str], np.ndarray]:
    labels, columns = [], []
    for name in sorted(latents):
        values = np.asarray(latents[name], dtype=float)
        shape = values.shape[1:]
        labels += component_labels(name, shape)
        columns.append(values.reshape(values.shape[0], -1))
    return labels, np.concatenate(columns, axis=1)


def _prior_sd(
    rng_key: jax.Array,
    model: Callable,
    params: dict[str, jax.Array],
    args: tuple,
    kwargs: dict,
    num_draws: int,
    names: list[str],
) -> np.ndarray:
    """The prior sd of every scalar component of the latent sites ``names``
    (infinite for a site with an improper prior, held at a feasible value
    while the others are drawn), the model's own ``numpyro.param`` sites at
    their values in ``params``."""
    improper = set(improper_latents(model, rng_key, args, kwargs))
    draws = Predictive(
        feasible_improper(model),
        params=params,
        num_samples=num_draws,
        return_sites=names,
    )(rng_key, *args, **kwargs)
    order = sorted(names)  # the order of _component_sd
    sizes = [int(np.prod(np.shape(draws[name])[1:])) for name in order]
    _, flat = _component_sd({name: draws[name] for name in order})
    sd = flat.std(axis=0, ddof=1)
    flat_improper = np.repeat([name in improper for name in order], sizes)
    return np.where(flat_improper, np.inf, sd)


def _ratio(sd: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """``sd / reference``, 1 where neither spreads (a component the model
    fixes, e.g. the first row of an ``LKJCholesky`` factor)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where((sd == 0) & (reference == 0), 1.0, sd / reference)


def _readings(
    ratio: np.ndarray, prior_ratio: np.ndarray, threshold: float, *, binary_only: bool
) -> np.ndarray:
    """``"heterogeneous"``, ``"not identified"`` or ``"ok"`` per component."""
    if binary_only:
        return np.full(ratio.shape, NOT_IDENTIFIED)
    wide = ratio > threshold
    prior_like = prior_ratio >= PRIOR_FRACTION
    return np.where(
        wide & ~prior_like, HETEROGENEOUS, np.where(wide, NOT_IDENTIFIED, "ok")
    )


def heterogeneity(
    rng_key: jax.Array,
    params: dict[str, jax.Array],
    model: Callable,
    guide: Callable,
    *args: Any,
    reference_params: dict[str, jax.Array],
    reference_guide: Callable | None = None,
    num_draws: int = 2000,
    threshold: float = 5.0,
    **kwargs: Any,
) -> Container:
    r"""Flag the parameters whose PVI posterior stays wider than the VI one.

    For every scalar component :math:`\theta_k` of every latent site,
    :math:`\rho_k = \mathrm{sd}_{PVI}(\theta_k) / \mathrm{sd}_{VI}(\theta_k)`
    from ``num_draws`` draws of each guide; :math:`\rho_k >` ``threshold`` flags
    :math:`\theta_k` as varying in the population (Lai & Yao 2024, §2.5). A
    spread the predictive score does not identify is read ``"not identified"``,
    not flagged: every observed site a single binary or categorical outcome, or
    a PVI sd at least half the prior sd.

    **Example**::

        >>> data = heterogeneity(key, pvi_result.params, model, guide, x, y,
        ...                      reference_params=vi_result.params)
        >>> plot_heterogeneity(data)

    :param rng_key: random key.
    :param params: the parameters fitted with a predictive objective.
    :param model: the NumPyro model both guides were fitted to.
    :param guide: the guide of ``params``.
    :param args: positional arguments of model and guides.
    :param reference_params: the parameters fitted with the ELBO.
    :param reference_guide: the guide of ``reference_params``; ``guide``
        when ``None``.
    :param num_draws: draws per guide (at least 2).
    :param threshold: sd ratio above which a component is flagged (> 1); a
        varying parameter's ratio grows like :math:`\sqrt{n}`, a fixed one's
        stays of order one, hence the default 5.
    :param kwargs: keyword arguments of model and guides.
    :return: ``arviz.InferenceData`` on ArviZ 0.2x, ``xarray.DataTree`` on
        ArviZ ≥ 1.0, with group ``heterogeneity`` over dim ``parameter``:
        ``vi_mean``, ``pvi_mean``, ``vi_sd``, ``pvi_sd``, ``prior_sd``,
        ``ratio``, ``reading`` and ``flagged``; attrs ``threshold``,
        ``identified`` and ``identification``.

    **References**

    1. Lai, J. & Yao, Y. (2024). *Predictive variational inference: Learn the
       predictively optimal posterior distribution*. arXiv:2410.14843.
    """
    reference_guide = guide if reference_guide is None else reference_guide
    params, model, guide = check_fitted_call(
        "heterogeneity (PVI fit)", params, model, guide, args=args, kwargs=kwargs
    )
    reference_params, model, reference_guide = check_fitted_call(
        "heterogeneity (VI fit: reference_params, reference_guide)",
        reference_params,
        model,
        reference_guide,
        args=args,
        kwargs=kwargs,
    )
    num_draws = check_int(num_draws, "num_draws", "heterogeneity", minimum=2)
    threshold = check_real(
        threshold, "threshold", "heterogeneity", low=1.0, low_open=True
    )
    arrays = heterogeneity_arrays(
        rng_key,
        (params, guide),
        (reference_params, reference_guide),
        model,
        args,
        kwargs,
        num_draws=num_draws,
        threshold=threshold,
    )
    group = heterogeneity_group(arrays, threshold, num_draws)
    group.attrs.update(
        pvi_guide=guide_name(guide), vi_guide=guide_name(reference_guide)
    )
    attrs = root_attrs(guide, diagnostic="heterogeneity")
    return ADAPTER.build({"heterogeneity": group}, attrs)


class HeterogeneityArrays(NamedTuple):
    """The numbers of :func:`heterogeneity`, one entry per scalar latent
    component (``labels``); ``binary`` names the observed sites when every
    one is a single binary or categorical outcome (nothing is identified),
    and is empty otherwise."""

    labels: list[str]
    pvi_mean: np.ndarray
    vi_mean: np.ndarray
    pvi_sd: np.ndarray
    vi_sd: np.ndarray
    prior_sd: np.ndarray
    ratio: np.ndarray
    reading: np.ndarray
    binary: list[str]


def _draw_stats(
    key: jax.Array,
    fit: tuple[dict, Callable],
    model: Callable,
    args: tuple,
    kwargs: dict,
    num_draws: int,
) -> tuple[list[str], list[str], np.ndarray, np.ndarray, list[dict]]:
    """Labels, site names, means and sds of the latent components under one
    fitted guide, and the observed sites of the model traced with it."""
    params, guide = fit
    # the structure is traced abstractly: the key draws nothing
    tr = replay_trace(key, params, model, guide, args, kwargs, "heterogeneity")
    check_full_data(tr, "heterogeneity")
    spec = ParticleSpec(
        num_draws,
        frozenset({LATENTS}),
        WHOLE_DATA,  # only the latents are needed
        objective="heterogeneity",
        require_observed=False,
        fixed_observations=False,
        stratified=False,
    )
    terms = guide_draws(key, params, model, guide, args, kwargs, spec)
    labels, flat = _component_sd(terms.latents)
    mean, sd = flat.mean(axis=0), flat.std(axis=0, ddof=1)
    return labels, sorted(terms.latents), mean, sd, observed_sites(tr)


def heterogeneity_arrays(
    rng_key: jax.Array,
    fit: tuple[dict, Callable],
    reference: tuple[dict, Callable],
    model: Callable,
    args: tuple,
    kwargs: dict,
    *,
    num_draws: int,
    threshold: float,
) -> HeterogeneityArrays:
    """The array core of :func:`heterogeneity`: ``fit`` and ``reference``
    are ``(params, guide)`` of the PVI and the VI fit."""
    pvi_key, vi_key, prior_key = jax.random.split(rng_key, 3)
    labels_pvi, _, pvi_mean, pvi_sd, _ = _draw_stats(
        pvi_key, fit, model, args, kwargs, num_draws
    )
    labels, names, vi_mean, vi_sd, observed = _draw_stats(
        vi_key, reference, model, args, kwargs, num_draws
    )
    if labels_pvi != labels:
        raise ValueError(
            "heterogeneity: the two guides give different latent components "
            f"({labels_pvi} vs {labels}); fit both to the same model."
        )
    # the prior at the reference fit's values of the model's own parameters
    prior_sd = _prior_sd(prior_key, model, reference[0], args, kwargs, num_draws, names)
    ratio = _ratio(pvi_sd, vi_sd)
    binary = [site["name"] for site in observed if site["fn"].single_draw]
    binary = binary if len(binary) == len(observed) else []
    reading = _readings(
        ratio, _ratio(pvi_sd, prior_sd), threshold, binary_only=bool(binary)
    )
    return HeterogeneityArrays(
        labels, pvi_mean, vi_mean, pvi_sd, vi_sd, prior_sd, ratio, reading, binary
    )


def heterogeneity_group(
    arrays: HeterogeneityArrays, threshold: float, num_draws: int
) -> xr.Dataset:
    """The ``heterogeneity`` group over dim ``parameter``."""
    identification = (
        BINARY_OUTCOME.format(sites=", ".join(arrays.binary))
        if arrays.binary
        else PRIOR_DOMINATED.format(fraction=PRIOR_FRACTION)
    )
    dim = ("parameter",)
    return xr.Dataset(
        {
            "vi_mean": (dim, arrays.vi_mean),
            "pvi_mean": (dim, arrays.pvi_mean),
            "vi_sd": (dim, arrays.vi_sd),
            "pvi_sd": (dim, arrays.pvi_sd),
            "prior_sd": (dim, arrays.prior_sd),
            "ratio": (dim, arrays.ratio),
            "reading": (dim, arrays.reading),
            "flagged": (dim, arrays.reading == HETEROGENEOUS),
        },
        coords={"parameter": arrays.labels},
        attrs={
            "threshold": float(threshold),
            "prior_fraction": PRIOR_FRACTION,
            "identified": int(not arrays.binary),
            "identification": identification,
            "num_draws": num_draws,
            "reference": "Lai & Yao (2024), section 2.5",
        },
    )


def plot_heterogeneity(data: Container, *, ax: Any = None) -> Any:
    """Bar chart of the PVI/VI sd ratio per parameter: flagged ones red, those
    whose spread is not identified grey.

    :param data: the result of :func:`heterogeneity`.
    :param ax: a matplotlib axis; a new one when ``None``.
    :return: the axis.
    """
    import matplotlib.pyplot as plt

    ds = dataset(data, "heterogeneity", "plot_heterogeneity", "heterogeneity")
    if ax is None:
        _, ax = plt.subplots(
            figsize=(6, 0.35 * ds.sizes["parameter"] + 1.5), layout="constrained"
        )
    labels = [str(p) for p in ds["parameter"].values]
    ratio = np.asarray(ds["ratio"].values)
    flagged = np.asarray(ds["flagged"].values)
    unidentified = np.asarray(ds["reading"].values) == NOT_IDENTIFIED
    colors = np.where(flagged, "tab:red", np.where(unidentified, "0.6", "tab:blue"))
    ax.barh(np.arange(len(labels)), ratio, color=colors)
    ax.axvline(1.0, color="0.4", lw=1, ls=":")
    ax.axvline(ds.attrs["threshold"], color="tab:red", lw=1, ls="--")
    ax.set_yticks(np.arange(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("posterior sd ratio PVI / VI")
    title = f"flagged (ratio > {ds.attrs['threshold']:g}): {int(flagged.sum())}"
    if not ds.attrs.get("identified", 1):
        title = "spread not identified by single binary outcomes: nothing flagged"
    elif unidentified.any():
        title += f"; not identified (grey): {int(unidentified.sum())}"
    ax.set_title(title)
    return ax
