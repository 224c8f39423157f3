"""Variational simulation-based calibration (VSBC) in ArviZ's container.

Algorithm 2 of Yao, Vehtari, Simpson & Gelman (2018): draw ``θ*`` from the
prior and ``y`` from the model, fit the guide to ``y``, and record
:math:`p = \\Pr_q(θ < θ^*)` for every scalar component of every latent site.
For a method whose marginals are unbiased on average, ``p`` is distributed
symmetrically around 1/2; the asymmetry says in which direction it errs.

Site discovery follows :func:`numpyro.infer.calibration.vsbc_diagnostic`; the
replications are fitted inside ``jit`` with ``lax.scan`` over SVI steps and
dispatched sequentially (``lax.map``), vectorised (``vmap``) or sharded over
all local devices (``jax.sharding``), in chunks for progress reporting.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import xarray as xr
from jax import random
from numpyro.handlers import block, seed
from numpyro.infer import Predictive
from numpyro.infer.calibration import _resolve_observed_sites, _validate_latent_sites

from numpyro_pvi._structure import check_full_data, model_structure
from numpyro_pvi._validation import check_int, check_real
from numpyro_pvi.diagnostics._containers import ADAPTER, Container
from numpyro_pvi.diagnostics._idata import (
    component_labels,
    draws_dataset,
    root_attrs,
    site_dims,
)
from numpyro_pvi.diagnostics._replications import (
    DRIFT_THRESHOLD,
    UNCONVERGED_WARNING,
    loss_drift,
    replication_fn,
    run_replications,
)
from numpyro_pvi.diagnostics._simulated_data import data_injector, unobserve
from numpyro_pvi.diagnostics.symmetry import symmetry_test
from numpyro_pvi.diagnostics.vsbc_plot import plot_vsbc
from numpyro_pvi.distributions import simulators_without_density

__all__ = ["loss_drift", "plot_vsbc", "vsbc"]

_CHAIN_METHODS = ("sequential", "vectorized", "sharded")
_CORRECTIONS = ("holm", "bh", None)


def _num_bins(num: int) -> int:
    return int(np.clip(math.ceil(math.sqrt(num)), 5, 20))


def _setup(
    rng_key: jax.Array,
    model: Callable,
    guide: Callable,
    optim: Any,
    loss: Any,
    args: tuple,
    kwargs: dict,
    *,
    num_simulations: int,
    num_svi_steps: int,
    num_draws: int,
    observed_sites: Sequence[str] | None,
    simulated_data_to_args: Callable | None,
) -> tuple[Callable, tuple, dict, list[str]]:
    """Sites, prior predictive draws and the function of one replication.

    :return: ``one``, its batched inputs ``(keys, data, θ*)``, an abstract
        model trace and the latent site names.
    """
    key_trace, key_prior, key_warmup, key_fit = random.split(rng_key, 4)
    model_trace = model_structure(model, key_trace, args, kwargs)
    check_full_data(model_trace, "vsbc")
    try:
        observed, latent_names = _resolve_observed_sites(model_trace, observed_sites)
    except ValueError as err:
        raise ValueError(
            f"vsbc: {err} Pass the observed data as for SVI, or name the "
            "observed sites with `observed_sites=`."
        ) from None
    _validate_latent_sites(model_trace, latent_names)
    inject = data_injector(model, observed, args, kwargs, simulated_data_to_args)

    prior_predictive = Predictive(
        unobserve(model, observed),
        num_samples=num_simulations,
        return_sites=list(observed) + list(latent_names),
        parallel=True,
    )
    sims = jax.jit(lambda key: prior_predictive(key, *args, **kwargs))(key_prior)
    data = {n: sims[n] for n in observed}
    theta = {n: sims[n] for n in latent_names}

    # Autoguides set up their prototype on the first call; that must happen
    # outside of jit/vmap (it stores concrete initial values on the guide).
    data0 = {n: v[0] for n, v in data.items()}
    with simulators_without_density(), block():
        args0, kwargs0 = inject(data0)
        seed(guide, key_warmup)(*args0, **kwargs0)

    one = replication_fn(
        model, guide, optim, loss, inject, latent_names, num_svi_steps, num_draws
    )
    keys = random.split(key_fit, num_simulations)
    return one, (keys, data, theta), model_trace, latent_names


def _validate(
    num_simulations: int,
    num_svi_steps: int,
    num_draws: int,
    chain_method: Any,
    correction: Any,
    alpha: float,
    chunk_size: int | None,
) -> None:
    for arg, value, low in (
        ("num_simulations", num_simulations, 2),
        ("num_svi_steps", num_svi_steps, 1),
        ("num_draws", num_draws, 1),
    ):
        check_int(value, arg, "vsbc", minimum=low)
    if not callable(chain_method) and chain_method not in _CHAIN_METHODS:
        raise ValueError(
            f"vsbc: chain_method must be one of {_CHAIN_METHODS} or a callable "
            f"such as jax.vmap, got {chain_method!r}."
        )
    if correction not in _CORRECTIONS:
        raise ValueError(
            f"vsbc: correction must be 'holm', 'bh' or None, got {correction!r}."
        )
    check_real(alpha, "alpha", "vsbc", low=0.0, high=1.0, low_open=True, high_open=True)
    if chunk_size is not None:
        check_int(chunk_size, "chunk_size", "vsbc", minimum=1)


def vsbc(
    rng_key: jax.Array,
    model: Callable,
    guide: Callable,
    optim: Any,
    loss: Any,
    *args: Any,
    num_simulations: int = 100,
    num_svi_steps: int = 1000,
    num_draws: int = 1000,
    observed_sites: Sequence[str] | None = None,
    chain_method: str | Callable = "vectorized",
    correction: str | None = "holm",
    progress_bar: bool = True,
    alpha: float = 0.05,
    chunk_size: int | None = None,
    simulated_data_to_args: Callable | None = None,
    **kwargs: Any,
) -> Container:
    r"""Variational simulation-based calibration (Yao et al. 2018, Algorithm 2).

    For each of ``num_simulations`` replications: draw :math:`θ^*` and
    :math:`y` from the prior predictive, fit a fresh guide to :math:`y` with
    ``num_svi_steps`` SVI steps of ``loss`` (any NumPyro ELBO, the objectives
    of this package included), and estimate

    .. math::

        p = \Pr_q(θ < θ^*) \approx \frac{1}{L} \sum_{l=1}^{L}
        \mathbb{1}\{θ^{(l)} < θ^*\}, \qquad θ^{(l)} \sim q,

    per scalar component, with :math:`L` = ``num_draws``. If the method's
    marginals are unbiased on average, :math:`p` and :math:`1 - p` have the
    same distribution; each component is tested with a two-sample
    Kolmogorov–Smirnov statistic of :math:`p` against :math:`1 - p`, whose
    p-value is exact under the null that :math:`p` is symmetric about 1/2
    (a sign-flip null, conditional on :math:`|p - 1/2|`; the usual
    two-sample KS p-value treats :math:`p` and :math:`1 - p` as independent,
    which they are not), corrected for multiplicity over
    all components of all latent sites. The one-sided tests give the
    direction: ``"over"`` when :math:`p` piles up near 0 (q overestimates
    θ, the paper's right-skewed histogram), ``"under"`` when it piles up near
    1, ``"ok"`` when symmetry is not rejected at level ``alpha``. A symmetric
    but U-shaped histogram (too narrow but unbiased) or hump-shaped one (too
    wide) is not flagged: read the histograms (:func:`plot_vsbc`).

    The model must be generative: observed sites are sampled from the prior
    predictive whatever data the model is called with (only their shapes are
    used), and each fit conditions on the simulated values. An observed site
    whose name is an argument of the model also receives its simulated value
    through that argument, so guides that read the data see the simulated
    data; for data passed in another way use ``simulated_data_to_args``.
    Only continuous latent sites are supported.

    Every replication starts from the same initial guide parameters (those of
    the guide's initialisation strategy) and has its own key, so results do
    not depend on ``chain_method`` or on the chunking (up to floating-point
    reassociation between batch sizes).

    **Example**::

        >>> idata = vsbc(random.PRNGKey(0), model, AutoNormal(model),
        ...              optax.adam(1e-2), Trace_ELBO(), x, y,
        ...              num_simulations=200, num_svi_steps=2000)
        >>> idata.vsbc_symmetry.to_dataframe()
        >>> plot_vsbc(idata)

    :param rng_key: PRNG key.
    :param model: NumPyro model; generative (it samples its observed sites
        when they are not given).
    :param guide: guide for ``model`` (an autoguide or a hand-written guide);
        refitted from its initial parameters in every replication.
    :param optim: NumPyro optimizer or optax ``GradientTransformation``.
    :param loss: the objective, e.g. ``Trace_ELBO()`` or ``PACmELBO()``.
    :param args: positional arguments of the model and guide.
    :param num_simulations: number of replications (≥ 2).
    :param num_svi_steps: SVI steps per replication.
    :param num_draws: guide draws per replication to estimate :math:`p`.
    :param observed_sites: names of the observed sites; by default the sites
        observed in a trace of ``model(*args, **kwargs)``.
    :param chain_method: ``"sequential"`` (``lax.map``, least memory),
        ``"vectorized"`` (``vmap``), ``"sharded"`` (replications split over
        all local devices with :mod:`jax.sharding`, ``vmap`` within each;
        any number of replications) or a callable such as ``jax.vmap`` that
        maps a function of one replication over a batch (the result is
        jit-compiled).
    :param correction: ``"holm"`` (family-wise error), ``"bh"``
        (Benjamini–Hochberg false discovery rate) or ``None``.
    :param progress_bar: show a progress bar over chunks of replications.
    :param alpha: level at which a corrected p-value flags a direction.
    :param chunk_size: replications per compiled call; default all of them
        without a progress bar, a tenth of them with one. Rounded up to a
        multiple of the device count when sharded.
    :param simulated_data_to_args: optional ``f(data, *args, **kwargs) ->
        (args, kwargs)`` that passes the simulated data (a dict site →
        value) to the model and guide, when they take it in a container.
    :param kwargs: keyword arguments of the model and guide.
    :return: ``arviz.InferenceData`` on ArviZ 0.2x, ``xarray.DataTree`` with
        the same groups on ArviZ ≥ 1.0, with replications along ``draw``
        (one ``chain``): ``prior`` (:math:`θ^*`), ``vsbc`` (:math:`p`, same
        variables and dims), ``prior_sbc`` (the same :math:`p`, where ArviZ's
        calibration plots read them: ``arviz_plots.plot_ecdf_pit(result)``
        on ArviZ ≥ 1.0), ``vsbc_symmetry`` (per scalar ``component``:
        ``ks_statistic``, ``p_value``, ``p_value_adjusted``,
        ``p_value_over``, ``p_value_under``, ``direction``, and
        ``num_extreme``: replications with :math:`p` exactly 0 or 1, whose
        guide put no mass on the far side of :math:`θ^*`; attribute
        ``num_unconverged``), ``vsbc_fit_stats`` (``loss``: final loss;
        ``loss_tail``: mean loss over the last 10% of steps; ``loss_drift``:
        :func:`loss_drift`, the fall of the loss over the last tenth of the
        steps in standard errors; ``converged``: drift at most 3; a warning
        is raised when more than 10% of the replications have not converged)
        and ``vsbc_histogram`` (``count`` per
        ``component`` and ``bin``, with ``bin_left``/``bin_right`` coords).

    **References**

    - Yao, Y., Vehtari, A., Simpson, D. & Gelman, A. (2018). *Yes, but did
      it work?: Evaluating variational inference.* ICML.
    - Talts, S., Betancourt, M., Simpson, D., Vehtari, A. & Gelman, A.
      (2018). *Validating Bayesian inference algorithms with
      simulation-based calibration.* arXiv:1804.06788.
    - Holm, S. (1979). *A simple sequentially rejective multiple test
      procedure.* Scandinavian Journal of Statistics.
    - Benjamini, Y. & Hochberg, Y. (1995). *Controlling the false discovery
      rate.* JRSS B.
    """
    _validate(
        num_simulations,
        num_svi_steps,
        num_draws,
        chain_method,
        correction,
        alpha,
        chunk_size,
    )
    one, inputs, model_trace, latent_names = _setup(
        rng_key,
        model,
        guide,
        optim,
        loss,
        args,
        kwargs,
        num_simulations=num_simulations,
        num_svi_steps=num_svi_steps,
        num_draws=num_draws,
        observed_sites=observed_sites,
        simulated_data_to_args=simulated_data_to_args,
    )
    theta = inputs[2]
    below, final_loss, tail_loss, drift = run_replications(
        one,
        inputs,
        num_simulations,
        chain_method,
        chunk_size,
        progress_bar,
    )

    theta = {n: np.asarray(v) for n, v in theta.items()}
    shapes = {n: theta[n].shape[1:] for n in latent_names}
    dims = {n: d for n, d in site_dims(model_trace).items() if n in latent_names}
    labels = [lab for n in latent_names for lab in component_labels(n, shapes[n])]
    variable = [n for n in latent_names for _ in range(math.prod(shapes[n]))]
    p = {n: below[n] / num_draws for n in latent_names}
    below_flat = np.concatenate(
        [below[n].reshape(num_simulations, -1) for n in latent_names], axis=1
    )
    component = {"component": labels, "variable": ("component", variable)}
    sym_ds, hist_ds = _symmetry_datasets(
        below_flat, num_draws, component, correction=correction, alpha=alpha
    )

    attrs = {
        "num_svi_steps": num_svi_steps,
        "num_draws": num_draws,
        "chain_method": getattr(chain_method, "__name__", str(chain_method)),
    }
    prior_ds = draws_dataset(theta, dims=dims)
    vsbc_ds = draws_dataset(
        p, dims=dims, attrs={**attrs, "quantity": "p = Pr_q(theta < theta*)"}
    )
    fit_ds = _fit_stats(final_loss, tail_loss, drift, attrs)
    sym_ds.attrs["num_unconverged"] = fit_ds.attrs["num_unconverged"]
    groups = {
        "prior": prior_ds,
        "vsbc": vsbc_ds,
        "prior_sbc": vsbc_ds,
        "vsbc_symmetry": sym_ds,
        "vsbc_fit_stats": fit_ds,
        "vsbc_histogram": hist_ds,
    }
    attrs = root_attrs(guide, loss=type(loss).__name__, diagnostic="vsbc")
    return ADAPTER.build(groups, attrs)


def _symmetry_datasets(
    below: np.ndarray,
    num_draws: int,
    component: dict[str, Any],
    *,
    correction: str | None,
    alpha: float,
) -> tuple[xr.Dataset, xr.Dataset]:
    """The ``vsbc_symmetry`` and ``vsbc_histogram`` groups from the
    ``(replication, component)`` counts of draws below the true values."""
    num_simulations = below.shape[0]
    p = below / num_draws
    symmetry = symmetry_test(below, num_draws, correction, alpha)
    num_bins = _num_bins(num_simulations)
    edges = np.linspace(0.0, 1.0, num_bins + 1)
    counts = np.stack([np.histogram(p[:, j], bins=edges)[0] for j in range(p.shape[1])])
    extreme = np.sum((below == 0) | (below == num_draws), axis=0)
    sym_ds = xr.Dataset(
        {
            **{k: ("component", v) for k, v in symmetry.items()},
            "num_extreme": ("component", extreme),
        },
        coords=component,
        attrs={
            "test": "Kolmogorov-Smirnov statistic of p against 1 - p; exact "
            "p-values under symmetry of p about 1/2 (sign-flip null)",
            "correction": str(correction),
            "alpha": alpha,
            "num_simulations": num_simulations,
        },
    )
    hist_ds = xr.Dataset(
        {"count": (("component", "bin"), counts)},
        coords={
            **component,
            "bin": np.arange(num_bins),
            "bin_left": ("bin", edges[:-1]),
            "bin_right": ("bin", edges[1:]),
        },
    )
    return sym_ds, hist_ds


def _fit_stats(
    final_loss: np.ndarray, tail_loss: np.ndarray, drift: np.ndarray, attrs: dict
) -> xr.Dataset:
    """The ``vsbc_fit_stats`` group; warns when too many replications had not
    converged (attribute ``num_unconverged``)."""
    num_simulations = drift.shape[0]
    converged = ~(drift > DRIFT_THRESHOLD)  # nan (too few steps) counts as converged
    num_unconverged = int(np.sum(~converged))
    if num_unconverged > UNCONVERGED_WARNING * num_simulations:
        warnings.warn(
            f"vsbc: {num_unconverged} of {num_simulations} replications had not "
            f"converged after {attrs['num_svi_steps']} SVI steps (loss still "
            f"falling by more than {DRIFT_THRESHOLD:g} standard errors over the "
            "last tenth of the steps, vsbc_fit_stats.loss_drift): their p values "
            "measure an unfinished fit, not the method. Increase num_svi_steps "
            "or the step size.",
            UserWarning,
            stacklevel=3,
        )
    return draws_dataset(
        {
            "loss": final_loss,
            "loss_tail": tail_loss,
            "loss_drift": drift,
            "converged": converged,
        },
        attrs={
            **attrs,
            "drift_threshold": DRIFT_THRESHOLD,
            "num_unconverged": num_unconverged,
        },
    )
