r"""Is the fitted posterior *predictive* calibrated? PIT of held-out
observations over simulated data sets.

VSBC asks whether a method recovers the Bayesian posterior of the
parameters; predictive objectives (PVI, PAC^m) do not target it, and the
question their users ask is whether new observations fall where the fitted
posterior predictive says they will. :func:`predictive_calibration` answers
it over data sets from a data-generating process (the model's own prior
predictive by default, any simulator for the misspecified case): in each,
one observation of the data plate is held out, the guide is fitted to the
rest, and the held-out value is ranked among ``L`` draws from the fitted
posterior predictive — the probability integral transform (PIT), on the
rank scale, randomised for discrete outcomes (ties drawn uniformly), so
that it is exactly discrete uniform when the predictive is calibrated. The
ranks are read like VSBC's: ``direction`` (bias), ``dispersion`` (too
narrow / too wide) and ``p_value_uniformity``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import random
from numpyro.handlers import condition

from numpyro_pvi._core import (
    DataPlate,
    ParticleSpec,
    check_full_data,
    data_sites,
    model_structure,
    particle_terms,
    per_observation,
    plate_of,
)
from numpyro_pvi.diagnostics._containers import ADAPTER, Container
from numpyro_pvi.diagnostics._idata import draws_dataset, root_attrs
from numpyro_pvi.diagnostics._rank_tests import rank_datasets
from numpyro_pvi.diagnostics._replications import (
    fit_replication,
    fit_stats,
    run_replications,
    validate_options,
)
from numpyro_pvi.diagnostics._simulated_data import (
    data_injector,
    generated_data,
    resolve_sites,
    set_up_guide,
)
from numpyro_pvi.particles import Y_SIM
from numpyro_pvi.selection import mask_observations

__all__ = ["pit_ranks", "predictive_calibration"]

_WHERE = "predictive_calibration"


def pit_ranks(
    rng_key: jax.Array,
    params: dict[str, jax.Array],
    model: Callable,
    guide: Callable,
    args: tuple,
    kwargs: dict,
    *,
    index: jax.Array,
    plate: DataPlate,
    num_draws: int,
) -> jax.Array:
    r"""Randomised PIT ranks of observation ``index`` of the data plate.

    With :math:`\tilde y_l \sim p(\tilde y \mid \theta_l)`,
    :math:`\theta_l \sim q` (:math:`l = 1..L`), the rank of the observed
    :math:`y` is :math:`\#\{\tilde y_l < y\} + U`, :math:`U` uniform on
    :math:`0, \dots, \#\{\tilde y_l = y\}`: discrete uniform on
    :math:`0..L` when :math:`y` is a draw from the same predictive, for
    continuous and discrete outcomes alike. One rank per scalar component
    of the observation (observed sites in trace order).

    :return: ``(d,)`` integer ranks in ``0..num_draws``.

    **References**

    - Czado, C., Gneiting, T. & Held, L. (2009). *Predictive model
      assessment for count data.* Biometrics (the randomised PIT).
    """
    key_draw, key_tie = random.split(rng_key)
    spec = ParticleSpec(
        num_draws,
        frozenset({Y_SIM}),
        plate.selector,
        objective=_WHERE,
        require_reparam=False,
        stratified=False,
    )
    terms = particle_terms(key_draw, params, model, guide, args, kwargs, spec)
    y_sim = jax.lax.stop_gradient(terms.y_sim[:, index])  # (L, d)
    y_obs = terms.y_obs[index]
    below = jnp.sum(y_sim < y_obs, axis=0)
    ties = jnp.sum(y_sim == y_obs, axis=0)
    return below + random.randint(key_tie, below.shape, 0, ties + 1)


def _in_plate(model_trace: dict, observed: Sequence[str], plate: DataPlate) -> list:
    """The observed sites of the data plate (the ones ranked)."""
    sites = data_sites([model_trace[name] for name in observed], plate)[0]
    return [site["name"] for site in sites]


def _columns(model_trace: dict, observed: Sequence[str], plate: DataPlate) -> list:
    """``(label, site)`` of every scalar component of one observation."""
    out = []
    for name in observed:
        site = model_trace[name]
        rows = per_observation(
            np.zeros(np.shape(site["value"])), plate, site["fn"].event_dim, xp=np
        )
        width = rows.shape[1]
        labels = [name] if width == 1 else [f"{name}[{i}]" for i in range(width)]
        out += [(label, name) for label in labels]
    return out


def _replication(
    model: Callable,
    guide: Callable,
    optim: Any,
    loss: Any,
    inject: Callable,
    plate: DataPlate,
    num_svi_steps: int,
    num_draws: int,
) -> Callable:
    """``(key, data, index) -> (ranks, final loss, tail loss, drift)``: fit
    to the data without observation ``index``, rank that observation."""

    def one(inputs: tuple) -> tuple:
        key, data, index = inputs
        key_svi, key_pit = random.split(key)
        args, kwargs = inject(data)
        keep = jnp.ones(plate.size).at[index].set(0.0)
        conditioned = condition(model, data)
        masked = mask_observations(conditioned, keep=keep, data_plate=plate.selector)
        params, fit = fit_replication(
            key_svi,
            masked,
            guide,
            optim,
            loss,
            args,
            kwargs,
            num_svi_steps=num_svi_steps,
        )
        ranks = pit_ranks(
            key_pit,
            params,
            conditioned,
            guide,
            args,
            kwargs,
            index=index,
            plate=plate,
            num_draws=num_draws,
        )
        return (ranks, *fit)

    return one


def predictive_calibration(
    rng_key: jax.Array,
    model: Callable,
    guide: Callable,
    optim: Any,
    loss: Any,
    *args: Any,
    num_simulations: int = 100,
    num_svi_steps: int = 1000,
    data_generator: Callable | None = None,
    num_draws: int = 1000,
    data_plate: str | int | None = None,
    observed_sites: Sequence[str] | None = None,
    chain_method: str | Callable = "vectorized",
    correction: str | None = "holm",
    alpha: float = 0.05,
    progress_bar: bool = True,
    chunk_size: int | None = None,
    simulated_data_to_args: Callable | None = None,
    **kwargs: Any,
) -> Container:
    r"""Calibration of a method's posterior predictive on held-out data.

    For each of ``num_simulations`` data sets :math:`y` from the
    data-generating process: pick one observation :math:`j` of the data
    plate at random, fit a fresh guide with ``num_svi_steps`` steps of
    ``loss`` to :math:`y_{-j}` (the observation masked out of every observed
    site, as :func:`~numpyro_pvi.selection.mask_observations` does), and
    rank :math:`y_j` among ``num_draws`` draws of the fitted posterior
    predictive (:func:`pit_ranks`: the PIT, randomised for discrete
    outcomes). Per scalar component of an observation (per observed site),
    the ranks of all data sets are tested as VSBC's are: ``direction``
    (symmetry: the predictive is shifted), ``dispersion`` (``"too
    narrow"``: the predictive intervals under-cover, a U-shaped PIT
    histogram; ``"too wide"``) and ``p_value_uniformity`` (the simultaneous
    ECDF band), corrected for multiplicity over the components.

    The data sets come from the model's prior predictive (the Bayesian
    posterior predictive is then calibrated by construction, so any flag is
    the approximation's or the objective's) or from ``data_generator`` — a
    function ``rng_key -> {observed site: value}`` called once per data set
    outside ``jit`` (it may use NumPy), e.g. a distribution the model does
    not contain, which makes the misspecified case: there PVI's predictive
    can be calibrated where the Bayesian one is too narrow (Lai & Yao 2024).

    Each replication has one held-out observation, so the ranks of
    different data sets are independent, as the tests assume. A held-out
    observation's local latent (if any) keeps only its prior term in the
    fit: it is predicted as a new group would be.

    :param rng_key: PRNG key.
    :param model: NumPyro model; generative when ``data_generator`` is
        ``None``.
    :param guide: guide for ``model``, refitted in every replication.
    :param optim: NumPyro optimizer or optax ``GradientTransformation``.
    :param loss: the objective, e.g. ``Trace_ELBO()`` or
        ``PredictiveELBO("log")``.
    :param args: positional arguments of the model and guide.
    :param num_simulations: number of data sets (≥ 2).
    :param num_svi_steps: SVI steps per fit.
    :param data_generator: ``rng_key -> dict`` of observed values, shaped as
        the model observes them; default the model's prior predictive.
    :param num_draws: posterior-predictive draws ``L`` per rank.
    :param data_plate: the plate (or negative batch dimension) that indexes
        observations, as for :class:`~numpyro_pvi.PredictiveELBO`.
    :param observed_sites: names of the observed sites; default those
        observed in a trace of ``model(*args, **kwargs)``.
    :param chain_method: ``"sequential"``, ``"vectorized"``, ``"sharded"``
        or a callable such as ``jax.vmap``, as in
        :func:`~numpyro_pvi.diagnostics.vsbc`.
    :param correction: ``"holm"``, ``"bh"`` or ``None``.
    :param alpha: level of the verdicts.
    :param progress_bar: show a progress bar over chunks of data sets.
    :param chunk_size: data sets per compiled call.
    :param simulated_data_to_args: optional ``f(data, *args, **kwargs) ->
        (args, kwargs)`` passing a data set to model and guide.
    :param kwargs: keyword arguments of the model and guide.
    :return: ``arviz.InferenceData`` on ArviZ 0.2x, ``xarray.DataTree`` on
        ArviZ ≥ 1.0, with data sets along ``draw``: ``calibration`` (per
        ``component`` of an observation, coord ``variable`` = observed site:
        ``direction``, ``p_value_adjusted`` and the symmetry test's other
        variables, ``dispersion``, ``p_value_dispersion``,
        ``spread_ratio``, ``p_value_uniformity``,
        ``p_value_uniformity_unadjusted``, ``num_extreme``),
        ``calibration_pit`` (the PIT values :math:`(r + 1/2)/(L + 1)` per
        component, and the held-out index ``held_out``),
        ``calibration_histogram`` and ``calibration_fit_stats`` (as VSBC's).

    **References**

    - Dawid, A. P. (1984). *Statistical theory: the prequential approach.*
      JRSS A (the probability integral transform).
    - Czado, C., Gneiting, T. & Held, L. (2009). *Predictive model
      assessment for count data.* Biometrics (the randomised PIT).
    - Säilynoja, T., Bürkner, P.-C. & Vehtari, A. (2022). *Graphical test for
      discrete uniformity ...* Statistics and Computing.
    - Lai, J. & Yao, Y. (2024). *Predictive variational inference: learn the
      predictively optimal posterior distribution.*
    """
    validate_options(
        _WHERE,
        num_simulations,
        num_svi_steps,
        num_draws,
        chain_method,
        correction,
        alpha,
        chunk_size,
    )
    key_trace, key_data, key_index, key_warmup, key_fit = random.split(rng_key, 5)
    model_trace = model_structure(model, key_trace, args, kwargs)
    check_full_data(model_trace, _WHERE)
    observed, _ = resolve_sites(
        model_trace,
        observed_sites,
        function=_WHERE,
        model=model,
        args=args,
        kwargs=kwargs,
        prior_draws=data_generator is None,
    )
    masked = [name for name in observed if model_trace[name]["fn"].masked]
    if masked:
        raise ValueError(
            f"{_WHERE}: the observed site '{masked[0]}' is masked (handlers.mask "
            "or Distribution.mask), so a held-out observation could be one the "
            "model does not score, and its rank would mean nothing. The data "
            f"sets {_WHERE} simulates are complete: call it with the model's "
            "arguments that leave every observation in (no mask)."
        )
    # the named sites are observed in every fit, whatever the model was called with
    model_trace = {
        name: {**site, "is_observed": True} if name in observed else site
        for name, site in model_trace.items()
    }
    plate = plate_of(model_trace, data_plate)
    if plate.name is None:
        raise ValueError(
            f"{_WHERE}: the observed values are scalars, one observation in all, "
            "so none can be held out; observe the data as an array (in a "
            "numpyro.plate, or along a batch dimension)."
        )
    inject = data_injector(model, observed, args, kwargs, simulated_data_to_args)
    data = generated_data(
        key_data,
        num_simulations,
        model,
        observed,
        model_trace,
        data_generator,
        args,
        kwargs,
        function=_WHERE,
    )
    index = random.randint(key_index, (num_simulations,), 0, plate.size)
    set_up_guide(guide, key_warmup, inject, data)
    one = _replication(
        model, guide, optim, loss, inject, plate, num_svi_steps, num_draws
    )
    keys = random.split(key_fit, num_simulations)
    ranks, final_loss, tail_loss, drift = run_replications(
        one,
        (keys, data, index),
        num_simulations,
        chain_method,
        chunk_size,
        progress_bar,
        desc="predictive calibration",
    )
    return _result(
        np.asarray(ranks),
        np.asarray(index),
        (final_loss, tail_loss, drift),
        _columns(model_trace, _in_plate(model_trace, observed, plate), plate),
        guide=guide,
        loss=loss,
        num_draws=num_draws,
        options=dict(
            num_svi_steps=num_svi_steps,
            chain_method=getattr(chain_method, "__name__", str(chain_method)),
            data_generator="prior predictive"
            if data_generator is None
            else getattr(data_generator, "__name__", type(data_generator).__name__),
        ),
        correction=correction,
        alpha=alpha,
    )


def _result(
    ranks: np.ndarray,
    index: np.ndarray,
    fits: tuple,
    columns: list,
    *,
    guide: Callable,
    loss: Any,
    num_draws: int,
    options: dict,
    correction: str | None,
    alpha: float,
) -> Container:
    """The ArviZ container of :func:`predictive_calibration`."""
    labels = [label for label, _ in columns]
    component = {
        "component": labels,
        "variable": ("component", [site for _, site in columns]),
    }
    tests, histogram = rank_datasets(
        ranks, num_draws, component, correction=correction, alpha=alpha
    )
    tests.attrs["data_generator"] = options["data_generator"]
    pit = (ranks + 0.5) / (num_draws + 1)
    pit_ds = draws_dataset(
        {"pit": pit, "held_out": index},
        dims={"pit": ["component"]},
        attrs={"num_draws": num_draws, "quantity": "(rank + 1/2) / (L + 1)"},
    ).assign_coords(component=labels)
    fit_ds = fit_stats(
        *fits, options, function=_WHERE, group="calibration_fit_stats", stacklevel=4
    )
    tests.attrs["num_unconverged"] = fit_ds.attrs["num_unconverged"]
    groups = {
        "calibration": tests,
        "calibration_pit": pit_ds,
        "calibration_histogram": histogram,
        "calibration_fit_stats": fit_ds,
    }
    attrs = root_attrs(guide, loss=type(loss).__name__, diagnostic=_WHERE)
    return ADAPTER.build(groups, attrs)
