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
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
import xarray as xr
from jax import random
from numpyro.infer import Predictive

from numpyro_pvi._arviz.containers import ADAPTER, Container
from numpyro_pvi._arviz.idata import (
    component_labels,
    draws_dataset,
    root_attrs,
    site_dims,
)
from numpyro_pvi._trace.data_plate import joint_log_likelihood
from numpyro_pvi._trace.enumeration import enumerated_sites
from numpyro_pvi._trace.numpyro_private import validate_latent_sites
from numpyro_pvi._trace.recipes import Replications, check_recipe
from numpyro_pvi._trace.structure import check_full_data, model_structure
from numpyro_pvi.diagnostics._replications import (
    TRACER_ERRORS,
    check_fits_are_the_simulating_model,
    check_verdict,
    data_injector,
    eager_runs,
    fit_stats,
    loss_drift,
    replication_fn,
    resolve_sites,
    run_replications,
    set_up_guide,
    traced_argument_error,
    unobserve,
)
from numpyro_pvi.diagnostics.plots import plot_vsbc
from numpyro_pvi.diagnostics.rank_tests import rank_datasets

__all__ = [
    "VSBCArrays",
    "loss_drift",
    "plot_vsbc",
    "vsbc",
    "vsbc_arrays",
    "vsbc_groups",
]


def _setup(
    rng_key: jax.Array,
    procedure: tuple[Callable, Callable, Any, Any],
    args: tuple,
    kwargs: dict,
    replications: Replications,
    observed_sites: Sequence[str] | None,
    test_quantities: Mapping[str, Callable | None] | None,
) -> tuple[Callable, tuple, dict, list[str], dict[str, np.ndarray]]:
    """Sites, prior predictive draws and the function of one replication.

    :return: ``one``, its batched inputs ``(keys, data, θ*)``, an abstract
        model trace, the latent site names and the test quantities at the
        true values (``f(θ*, y)`` per replication).
    """
    model, guide, optim, loss = procedure
    r = replications
    key_trace, key_prior, key_warmup, key_fit = random.split(rng_key, 4)
    model_trace = model_structure(model, key_trace, args, kwargs)
    check_full_data(model_trace, "vsbc")
    observed, latent_names = resolve_sites(
        model_trace,
        observed_sites,
        function="vsbc",
        model=model,
        args=args,
        kwargs=kwargs,
    )
    summed_out = enumerated_sites(model_trace)  # not drawn by the guide
    latent_names = [n for n in latent_names if n not in summed_out]
    validate_latent_sites(model_trace, latent_names)
    inject = data_injector(
        model, observed, args, kwargs, r.simulated_data_to_args, model_trace, "vsbc"
    )
    quantities = resolve_quantities(
        test_quantities,
        latent_names=latent_names,
        model=model,
        inject=inject,
        function="vsbc",
    )
    prior_predictive = Predictive(
        unobserve(model, observed),
        num_samples=r.num_simulations,
        return_sites=list(observed) + list(latent_names),
        parallel=True,
    )
    sims = jax.jit(lambda key: prior_predictive(key, *args, **kwargs))(key_prior)
    data = {n: sims[n] for n in observed}
    theta = {n: sims[n] for n in latent_names}
    check_fits_are_the_simulating_model(
        eager_runs(key_warmup, model, args, kwargs, inject, _first(data)),
        function="vsbc",
    )
    drawn = set_up_guide(guide, key_warmup, inject, data, "vsbc")
    one = replication_fn(
        model,
        guide,
        optim,
        loss,
        inject,
        latent_names,
        r.num_svi_steps,
        r.num_draws,
        quantities,
        drawn,
        r.stop_early,
    )
    keys = random.split(key_fit, r.num_simulations)
    true_values = {
        name: _at_true_values(name, f, theta, data) for name, f in quantities.items()
    }
    return one, (keys, data, theta), model_trace, latent_names, true_values


def _first(data: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """The first of the simulated data sets."""
    return {name: value[0] for name, value in data.items()}


def _at_true_values(name: str, f: Callable, theta: dict, data: dict) -> np.ndarray:
    """``f(θ*, y)`` of every replication, or an error naming the quantity."""
    try:
        return np.asarray(jax.jit(jax.vmap(f))(theta, data))
    except TRACER_ERRORS as err:  # the model (log_likelihood runs it) or f
        raise traced_argument_error(
            f"vsbc (test quantity '{name}', which must be written with jax.numpy)", err
        ) from err
    except Exception as err:  # a user function: say which one failed
        raise ValueError(
            f"vsbc: test quantity '{name}' failed on the simulated data: "
            f"{type(err).__name__}: {err}. A test quantity is f(theta, data) with "
            "theta and data dicts site name -> value, returning an array of "
            "fixed shape, written with jax.numpy."
        ) from err


def vsbc(
    rng_key: jax.Array,
    model: Callable,
    guide: Callable,
    optim: Any,
    loss: Any,
    *args: Any,
    replications: Replications | None = None,
    observed_sites: Sequence[str] | None = None,
    test_quantities: Mapping[str, Callable | None] | None = None,
    correction: str | None = "holm",
    alpha: float = 0.05,
    **kwargs: Any,
) -> Container:
    r"""Variational simulation-based calibration (Yao et al. 2018, Algorithm 2).

    For each of ``replications.num_simulations`` replications: draw
    :math:`θ^*` and :math:`y` from the prior predictive, fit a fresh guide to
    :math:`y` with ``loss`` (any NumPyro ELBO), and estimate

    .. math::

        p = \Pr_q(θ < θ^*) \approx \frac{1}{L} \sum_{l=1}^{L}
        \mathbb{1}\{θ^{(l)} < θ^*\}, \qquad θ^{(l)} \sim q,

    per scalar component. Each component is tested three ways, corrected for
    multiplicity: **symmetry** (``direction``: ``"over"`` when :math:`p` piles
    up near 0, ``"under"`` near 1; a Kolmogorov–Smirnov statistic of :math:`p`
    against :math:`1 - p`, exact under a sign-flip null), **dispersion**
    (``"too narrow"`` or ``"too wide"``, from the spread of the ranks' normal
    scores) and **uniformity** (the simultaneous ECDF band of Säilynoja et al.
    2022). ``test_quantities`` (name → ``f(theta, data)``) are calibrated the same
    way; the joint log-likelihood is one unless mapped to ``None`` (Modrák et al.
    2023). The model must be generative, with continuous latents; terms of the
    joint density the prior draws do not see (``numpyro.factor``, tempered or
    improper priors) are refused, naming the site.

    **Example**::

        >>> idata = vsbc(random.PRNGKey(0), model, AutoNormal(model),
        ...              optax.adam(1e-2), Trace_ELBO(), x, y,
        ...              replications=Replications(num_simulations=200,
        ...                                        num_svi_steps=2000))
        >>> plot_vsbc(idata)

    :param rng_key: PRNG key.
    :param model: NumPyro model; generative (it samples its observed sites
        when they are not given).
    :param guide: guide for ``model``; refitted from its initial parameters in
        every replication.
    :param optim: NumPyro optimizer or optax ``GradientTransformation``.
    :param loss: the objective, e.g. ``Trace_ELBO()`` or ``PACmELBO()``.
    :param args: positional arguments of the model and guide.
    :param replications: a :class:`~numpyro_pvi.Replications` (replications
        ≥ 2, SVI steps, guide draws ``L``, dispatch, ``simulated_data_to_args``).
    :param observed_sites: names of the observed sites; by default those
        observed in a trace of ``model(*args, **kwargs)``.
    :param test_quantities: optional mapping name → ``f(theta, data)``;
        ``{"log_likelihood": None}`` leaves the joint log-likelihood out.
    :param correction: ``"holm"`` (family-wise error), ``"bh"``
        (Benjamini–Hochberg) or ``None``.
    :param alpha: level at which a corrected p-value flags a direction.
    :param kwargs: keyword arguments of the model and guide.
    :return: ``arviz.InferenceData`` on ArviZ 0.2x, ``xarray.DataTree`` on
        ArviZ ≥ 1.0, replications along ``draw``: ``prior`` (:math:`θ^*`),
        ``vsbc`` (:math:`p`), ``prior_sbc`` (the same :math:`p`, where
        ``arviz_plots.plot_ecdf_pit`` reads them), ``vsbc_symmetry`` (per
        ``component``: ``ks_statistic``, ``p_value``, ``p_value_adjusted``,
        ``p_value_over``, ``p_value_under``, ``direction``, ``dispersion``,
        ``p_value_dispersion``, ``spread_ratio``, ``p_value_uniformity``,
        ``p_value_uniformity_unadjusted``, ``num_extreme``; attribute
        ``num_unconverged``), ``vsbc_fit_stats`` (``loss``, ``loss_tail``,
        ``loss_drift``, ``converged``) and ``vsbc_histogram``.

    **References**

    - Yao, Y., Vehtari, A., Simpson, D. & Gelman, A. (2018). *Yes, but did
      it work?: Evaluating variational inference.* ICML.
    - Talts, S., Betancourt, M., Simpson, D., Vehtari, A. & Gelman, A.
      (2018). *Validating Bayesian inference algorithms with
      simulation-based calibration.* arXiv:1804.06788.
    - Säilynoja, T., Bürkner, P.-C. & Vehtari, A. (2022). *Graphical test
      for discrete uniformity and its applications in goodness-of-fit
      evaluation and multiple sample comparison.* Statistics and Computing.
    - Modrák, M. et al. (2023). *Simulation-based calibration checking for
      Bayesian computation: the choice of test quantities shapes
      sensitivity.* Bayesian Analysis.
    - Holm, S. (1979). *A simple sequentially rejective multiple test
      procedure.* Scandinavian Journal of Statistics.
    - Benjamini, Y. & Hochberg, Y. (1995). *Controlling the false discovery
      rate.* JRSS B.
    """
    replications = check_recipe(
        replications, Replications, "replications", "vsbc", kwargs
    )
    if replications.data_generator is not None:
        raise ValueError(
            "vsbc: replications.data_generator is set, but VSBC ranks the prior's "
            "own draws theta*, so its data sets come from the model's prior "
            "predictive; leave data_generator out (it is for "
            "predictive_calibration)."
        )
    check_verdict("vsbc", correction, alpha)
    arrays = vsbc_arrays(
        rng_key,
        (model, guide, optim, loss),
        args,
        kwargs,
        replications=replications,
        observed_sites=observed_sites,
        test_quantities=test_quantities,
    )
    groups = vsbc_groups(arrays, replications, correction=correction, alpha=alpha)
    attrs = root_attrs(guide, loss=type(loss).__name__, diagnostic="vsbc")
    return ADAPTER.build(groups, attrs)


def vsbc_arrays(
    rng_key: jax.Array,
    procedure: tuple[Callable, Callable, Any, Any],
    args: tuple,
    kwargs: dict,
    *,
    replications: Replications,
    observed_sites: Sequence[str] | None,
    test_quantities: Mapping[str, Callable | None] | None,
) -> VSBCArrays:
    """The array core of :func:`vsbc`: ``procedure`` is ``(model, guide,
    optim, loss)``."""
    one, inputs, model_trace, latent_names, true_values = _setup(
        rng_key, procedure, args, kwargs, replications, observed_sites, test_quantities
    )
    below, final_loss, tail_loss, drift = run_replications(one, inputs, replications)
    truth = {n: np.asarray(v) for n, v in {**inputs[2], **true_values}.items()}
    dims = {n: d for n, d in site_dims(model_trace).items() if n in latent_names}
    return VSBCArrays(
        truth,
        {n: np.asarray(v) for n, v in below.items()},
        np.asarray(final_loss),
        np.asarray(tail_loss),
        np.asarray(drift),
        list(latent_names),
        dims,
    )


#: The name of the joint log-likelihood test quantity.
LOG_LIKELIHOOD = "log_likelihood"


def resolve_quantities(
    test_quantities: Mapping[str, Callable | None] | None,
    *,
    latent_names: Sequence[str],
    model: Callable,
    inject: Callable[[dict], tuple[tuple, dict]],
    function: str,
) -> dict[str, Callable]:
    """The test quantities to calibrate, checked: the joint log-likelihood
    as ``"log_likelihood"`` unless ``test_quantities`` maps that name to
    ``None`` (leave it out) or to a function of one's own, then every other
    entry name → callable, whose names differ from the latent sites'."""
    if test_quantities is None:
        test_quantities = {}
    if not isinstance(test_quantities, Mapping):
        raise TypeError(
            f"{function}: test_quantities must be a mapping name -> f(theta, "
            f"data), got {type(test_quantities).__name__}."
        )
    quantities: dict[str, Any] = {LOG_LIKELIHOOD: joint_log_likelihood(model, inject)}
    quantities.update(test_quantities)
    if quantities[LOG_LIKELIHOOD] is None:
        del quantities[LOG_LIKELIHOOD]
    for name, f in quantities.items():
        if not isinstance(name, str) or not callable(f):
            raise TypeError(
                f"{function}: test_quantities must map names (str) to callables "
                f"f(theta, data) (or '{LOG_LIKELIHOOD}' to None, to leave the "
                f"joint log-likelihood out); got {name!r}: {type(f).__name__}."
            )
        if name in latent_names:
            raise ValueError(
                f"{function}: test quantity '{name}' has the name of a latent "
                "site; give it another name."
            )
    return quantities


class VSBCArrays(NamedTuple):
    """The numbers of :func:`vsbc`, per replication (leading axis ``S``):
    ``truth`` (:math:`θ^*` of each latent site, then each test quantity at
    :math:`θ^*`), ``below`` (the count of guide draws below it, same keys
    and shapes), each fit's ``final_loss``, ``tail_loss`` and ``drift``;
    ``latent_names`` (the keys of ``truth`` that are latent sites) and
    ``dims`` (their named dims)."""

    truth: dict[str, np.ndarray]
    below: dict[str, np.ndarray]
    final_loss: np.ndarray
    tail_loss: np.ndarray
    drift: np.ndarray
    latent_names: list[str]
    dims: dict[str, list[str]]


def _components(arrays: VSBCArrays) -> tuple[dict, np.ndarray]:
    """The ``component`` coords (label, variable, kind) and the ``(S, C)``
    ranks of every scalar component of every site and test quantity."""
    names = list(arrays.truth)
    shapes = {n: arrays.truth[n].shape[1:] for n in names}
    labels = [lab for n in names for lab in component_labels(n, shapes[n])]
    variable = [n for n in names for _ in range(math.prod(shapes[n]))]
    num_latent = sum(math.prod(shapes[n]) for n in arrays.latent_names)
    kind = ["parameter"] * num_latent + ["test quantity"] * (len(labels) - num_latent)
    num = arrays.final_loss.shape[0]
    ranks = np.concatenate([arrays.below[n].reshape(num, -1) for n in names], axis=1)
    component = {
        "component": labels,
        "variable": ("component", variable),
        "kind": ("component", kind),
    }
    return component, ranks


def vsbc_groups(
    arrays: VSBCArrays,
    replications: Replications,
    *,
    correction: str | None,
    alpha: float,
) -> dict[str, xr.Dataset]:
    """The groups of :func:`vsbc`'s container."""
    num_draws = replications.num_draws
    component, ranks = _components(arrays)
    sym_ds, hist_ds = rank_datasets(
        ranks, num_draws, component, correction=correction, alpha=alpha
    )
    chain_method = replications.chain_method
    attrs = {
        "num_svi_steps": replications.num_svi_steps,
        "num_draws": num_draws,
        "chain_method": getattr(chain_method, "__name__", str(chain_method)),
    }
    p = {n: v / num_draws for n, v in arrays.below.items()}
    vsbc_ds = draws_dataset(
        p, dims=arrays.dims, attrs={**attrs, "quantity": "p = Pr_q(theta < theta*)"}
    )
    fit_ds = fit_stats(
        arrays.final_loss,
        arrays.tail_loss,
        arrays.drift,
        attrs,
        function="vsbc",
        group="vsbc_fit_stats",
        stacklevel=4,  # the user's call: fit_stats, vsbc_groups, vsbc
    )
    sym_ds.attrs["num_unconverged"] = fit_ds.attrs["num_unconverged"]
    return {
        "prior": draws_dataset(arrays.truth, dims=arrays.dims),
        "vsbc": vsbc_ds,
        "prior_sbc": vsbc_ds,
        "vsbc_symmetry": sym_ds,
        "vsbc_fit_stats": fit_ds,
        "vsbc_histogram": hist_ds,
    }
