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
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import random

from numpyro_pvi._arviz.containers import ADAPTER, Container
from numpyro_pvi._arviz.idata import component_labels, draws_dataset, root_attrs
from numpyro_pvi._trace.data_plate import (
    DataPlate,
    check_same_plate,
    data_sites,
    per_observation,
    plate_of,
)
from numpyro_pvi._trace.enumeration import enumerates, marginalized, summed_out_loss
from numpyro_pvi._trace.particles import ParticleSpec, particle_terms
from numpyro_pvi._trace.recipes import Replications, check_recipe
from numpyro_pvi._trace.site_values import single_observation
from numpyro_pvi._trace.structure import check_full_data, model_structure
from numpyro_pvi._trace.terms import LIKELIHOOD
from numpyro_pvi.diagnostics._replications import (
    EagerRuns,
    check_fits_are_the_simulating_model,
    check_verdict,
    data_injector,
    eager_runs,
    fit_replication,
    fit_stats,
    generated_data,
    resolve_sites,
    run_replications,
    set_up_guide,
)
from numpyro_pvi.diagnostics.rank_tests import rank_datasets
from numpyro_pvi.objectives.predictive import PredictiveELBO
from numpyro_pvi.scores import simulations
from numpyro_pvi.selection import mask_observations

__all__ = [
    "CalibrationArrays",
    "calibration_arrays",
    "pit_ranks",
    "predictive_calibration",
]

_WHERE = "predictive_calibration"


def predictive_calibration(
    rng_key: jax.Array,
    model: Callable,
    guide: Callable,
    optim: Any,
    loss: Any,
    *args: Any,
    replications: Replications | None = None,
    data_plate: str | int | None = None,
    observed_sites: Sequence[str] | None = None,
    correction: str | None = "holm",
    alpha: float = 0.05,
    **kwargs: Any,
) -> Container:
    r"""Calibration of a method's posterior predictive on held-out data.

    For each of ``replications.num_simulations`` data sets :math:`y`: pick one
    observation :math:`j` of the data plate at random, fit a fresh guide with
    ``loss`` to :math:`y_{-j}` (masked, as
    :func:`~numpyro_pvi.selection.mask_observations` does), and rank :math:`y_j`
    among ``num_draws`` draws of the fitted posterior predictive (the PIT,
    randomised for discrete outcomes). Per scalar component the ranks are
    tested as VSBC's: ``direction``, ``dispersion`` (``"too narrow"``: a
    U-shaped PIT histogram) and ``p_value_uniformity``, corrected for
    multiplicity. The data sets come from the prior predictive (the Bayesian
    predictive is then calibrated by construction) or from
    ``replications.data_generator`` (``rng_key -> {site: value}``, called outside
    ``jit``), e.g. a misspecified process, where PVI's predictive can be
    calibrated and the Bayesian one too narrow (Lai & Yao 2024).

    **Example**::

        >>> result = predictive_calibration(
        ...     key, model, AutoNormal(model), optax.adam(1e-2),
        ...     PredictiveELBO("crps"), x, y,
        ...     replications=Replications(num_simulations=200, num_svi_steps=500))
        >>> plot_predictive_calibration(result)

    :param rng_key: PRNG key.
    :param model: NumPyro model; generative unless
        ``replications.data_generator`` simulates the data.
    :param guide: guide for ``model``, refitted in every replication.
    :param optim: NumPyro optimizer or optax ``GradientTransformation``.
    :param loss: the objective, e.g. ``Trace_ELBO()`` or
        ``PredictiveELBO("log")``.
    :param args: positional arguments of the model and guide.
    :param replications: a :class:`~numpyro_pvi.Replications`: data sets (≥ 2),
        SVI steps per fit, draws ``L`` per rank, dispatch, ``data_generator``.
    :param data_plate: the plate (or negative batch dimension) that indexes
        observations, as for :class:`~numpyro_pvi.PredictiveELBO`.
    :param observed_sites: names of the observed sites; default those
        observed in a trace of ``model(*args, **kwargs)``.
    :param correction: ``"holm"``, ``"bh"`` or ``None``.
    :param alpha: level of the verdicts.
    :param kwargs: keyword arguments of the model and guide.
    :return: ``arviz.InferenceData`` on ArviZ 0.2x, ``xarray.DataTree`` on
        ArviZ ≥ 1.0, with data sets along ``draw``: ``calibration`` (the tests'
        variables per ``component``, as VSBC's ``vsbc_symmetry``),
        ``calibration_pit`` (PIT values :math:`(r + 1/2)/(L + 1)` and the
        held-out index ``held_out``), ``calibration_histogram`` and
        ``calibration_fit_stats``.

    **References**

    - Dawid, A. P. (1984). *Statistical theory: the prequential approach.* JRSS A.
    - Czado, C., Gneiting, T. & Held, L. (2009). *Predictive model assessment
      for count data.* Biometrics.
    - Säilynoja, T., Bürkner, P.-C. & Vehtari, A. (2022). *Graphical test for
      discrete uniformity and its applications in goodness-of-fit evaluation
      and multiple sample comparison.* Statistics and Computing.
    - Lai, J. & Yao, Y. (2024). *Predictive variational inference: learn the
      predictively optimal posterior distribution.* arXiv:2410.14843.
    """
    replications = check_recipe(
        replications, Replications, "replications", _WHERE, kwargs
    )
    check_verdict(_WHERE, correction, alpha)
    arrays = calibration_arrays(
        rng_key,
        (model, guide, optim, loss),
        args,
        kwargs,
        replications=replications,
        data_plate=data_plate,
        observed_sites=observed_sites,
    )
    generator = replications.data_generator
    options = dict(
        num_svi_steps=replications.num_svi_steps,
        chain_method=getattr(
            replications.chain_method, "__name__", str(replications.chain_method)
        ),
        data_generator="prior predictive"
        if generator is None
        else getattr(generator, "__name__", type(generator).__name__),
    )
    return _result(
        arrays,
        guide=guide,
        loss=loss,
        num_draws=replications.num_draws,
        options=options,
        correction=correction,
        alpha=alpha,
    )


class CalibrationArrays(NamedTuple):
    """The numbers of :func:`predictive_calibration`: ``ranks`` ``(S, C)``
    of the held-out observation of each data set per scalar component
    ``columns`` (``(label, site)``), the held-out index ``held_out``
    ``(S,)``, and each fit's final loss, mean loss over its last tenth and
    loss drift ``(S,)``."""

    ranks: np.ndarray
    held_out: np.ndarray
    final_loss: np.ndarray
    tail_loss: np.ndarray
    drift: np.ndarray
    columns: list[tuple[str, str]]


def _observed_trace(
    model: Callable,
    key: jax.Array,
    args: tuple,
    kwargs: dict,
    observed_sites: Sequence[str] | None,
    prior_draws: bool,
) -> tuple[dict, list[str]]:
    """The model's abstract trace with the named sites observed, and their
    names; refuses masked observed sites."""
    model_trace = model_structure(model, key, args, kwargs)
    check_full_data(model_trace, _WHERE)
    observed, _ = resolve_sites(
        model_trace,
        observed_sites,
        function=_WHERE,
        model=model,
        args=args,
        kwargs=kwargs,
        prior_draws=prior_draws,
    )
    # the named sites are observed in every fit, whatever the model was called with
    model_trace = {
        name: {**site, "is_observed": True} if name in observed else site
        for name, site in model_trace.items()
    }
    return model_trace, observed


def _refuse_masked(
    model_trace: dict, observed: Sequence[str], runs: EagerRuns | None
) -> None:
    """Raise, naming the site, where the fits' model masks entries of an
    observed site: a held-out observation could be one it does not score.
    Read in the model run eagerly at a simulated data set (a mask computed
    from the data leaves nothing out there); where it did not run, any mask
    of the abstract trace counts."""
    masked = [
        name
        for name in observed
        if (name in runs.masked if runs is not None else model_trace[name]["fn"].masked)
    ]
    if masked:
        raise ValueError(
            f"{_WHERE}: the observed site '{masked[0]}' is masked (handlers.mask "
            "or Distribution.mask), so a held-out observation could be one the "
            "model does not score, and its rank would mean nothing. The data "
            f"sets {_WHERE} simulates are complete: call it with the model's "
            "arguments that leave every observation in (no mask)."
        )


def calibration_arrays(
    rng_key: jax.Array,
    procedure: tuple[Callable, Callable, Any, Any],
    args: tuple,
    kwargs: dict,
    *,
    replications: Replications,
    data_plate: str | int | None,
    observed_sites: Sequence[str] | None,
) -> CalibrationArrays:
    """The array core of :func:`predictive_calibration`: ``procedure`` is
    ``(model, guide, optim, loss)``."""
    model, guide, optim, loss = procedure
    r = replications
    key_trace, key_data, key_index, key_warmup, key_fit = random.split(rng_key, 5)
    model_trace, observed = _observed_trace(
        model, key_trace, args, kwargs, observed_sites, r.data_generator is None
    )
    # the fits' observations: with enumerated sites, one summed-out site per
    # element (its masked entries rank uniformly: draws equal the data there)
    enumerated = enumerates(model, args, kwargs)
    structure, scored = model_trace, observed
    if enumerated:
        structure = model_structure(marginalized(model), key_trace, args, kwargs)
        scored = [n for n, s in structure.items() if s.get("is_observed")]
    plate = plate_of(structure, data_plate)
    if plate.name is None:
        raise ValueError(single_observation(model_trace, _WHERE, "held out"))
    if isinstance(loss, PredictiveELBO):
        check_same_plate(model_trace, plate, loss.data_plate, f"{_WHERE}: {loss!r}")
    inject = data_injector(
        model, observed, args, kwargs, r.simulated_data_to_args, model_trace, _WHERE
    )
    data = generated_data(
        key_data,
        r.num_simulations,
        model,
        observed,
        model_trace,
        r.data_generator,
        args,
        kwargs,
        function=_WHERE,
    )
    runs = eager_runs(
        key_warmup,
        model,
        args,
        kwargs,
        inject,
        {name: value[0] for name, value in data.items()},
    )
    if r.data_generator is None:
        check_fits_are_the_simulating_model(
            runs,
            function=_WHERE,
            alternative=", or check the fits on data sets of your own "
            "(Replications(data_generator=...))",
        )
    if not enumerated:
        _refuse_masked(model_trace, observed, runs)
    index = random.randint(key_index, (r.num_simulations,), 0, plate.size)
    drawn = set_up_guide(guide, key_warmup, inject, data, _WHERE)
    one = pit_replication(
        model,
        guide,
        optim,
        loss,
        inject,
        plate,
        r.num_svi_steps,
        r.num_draws,
        drawn,
        r.stop_early,
    )
    keys = random.split(key_fit, r.num_simulations)
    ranks, final_loss, tail_loss, drift = run_replications(
        one,
        (keys, data, index),
        r,
        desc="predictive calibration",
        function="predictive_calibration",
    )
    columns = pit_columns(structure, in_plate(structure, scored, plate), plate)
    return CalibrationArrays(
        ranks=np.asarray(ranks),
        held_out=np.asarray(index),
        final_loss=np.asarray(final_loss),
        tail_loss=np.asarray(tail_loss),
        drift=np.asarray(drift),
        columns=columns,
    )


def _result(
    arrays: CalibrationArrays,
    *,
    guide: Callable,
    loss: Any,
    num_draws: int,
    options: dict,
    correction: str | None,
    alpha: float,
) -> Container:
    """The ArviZ container of :func:`predictive_calibration`."""
    ranks, index, columns = arrays.ranks, arrays.held_out, arrays.columns
    fits = (arrays.final_loss, arrays.tail_loss, arrays.drift)
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
        frozenset({LIKELIHOOD}),
        plate.selector,
        objective="predictive_calibration",
        require_reparam=False,
        stratified=False,
    )
    terms = particle_terms(key_draw, params, model, guide, args, kwargs, spec)
    y_sim, y_obs = simulations(terms)
    y_sim, y_obs = jax.lax.stop_gradient(y_sim[:, index]), y_obs[index]  # (L, d), (d,)
    below = jnp.sum(y_sim < y_obs, axis=0)
    ties = jnp.sum(y_sim == y_obs, axis=0)
    return below + random.randint(key_tie, below.shape, 0, ties + 1)


def in_plate(model_trace: dict, observed: Sequence[str], plate: DataPlate) -> list:
    """The observed sites of the data plate (the ones ranked)."""
    sites = data_sites([model_trace[name] for name in observed], plate)[0]
    return [site["name"] for site in sites]


def pit_columns(model_trace: dict, observed: Sequence[str], plate: DataPlate) -> list:
    """``(label, site)`` of every scalar component of one observation."""
    out = []
    for name in observed:
        site = model_trace[name]
        rows = per_observation(
            np.zeros(np.shape(site["value"])), plate, site["fn"].event_dim, xp=np
        )
        width = rows.shape[1]
        labels = component_labels(name, () if width == 1 else (width,))
        out += [(label, name) for label in labels]
    return out


def pit_replication(
    model: Callable,
    guide: Callable,
    optim: Any,
    loss: Any,
    inject: Callable,
    plate: DataPlate,
    num_svi_steps: int,
    num_draws: int,
    drawn: frozenset[str] = frozenset(),
    stop_early: bool = False,
) -> Callable:
    """``(key, data, index) -> (ranks, final loss, tail loss, drift)``: fit
    to the data without observation ``index``, rank that observation (the
    enumerated sites not ``drawn`` by the guide summed out)."""

    def one(inputs: tuple) -> tuple:
        key, data, index = inputs
        key_svi, key_pit = random.split(key)
        args, kwargs = inject(data)
        keep = jnp.ones(plate.size).at[index].set(0.0)
        # enumerated sites summed out before masking: TraceEnum_ELBO, the
        # VI of such models, takes no per-observation scale
        conditioned = marginalized(model, drawn, data=data)
        assert plate.selector is not None  # one observation is held out of a plate
        masked = mask_observations(conditioned, keep=keep, data_plate=plate.selector)
        params, fit = fit_replication(
            key_svi,
            masked,
            guide,
            optim,
            summed_out_loss(loss),
            args,
            kwargs,
            num_svi_steps=num_svi_steps,
            stop_early=stop_early,
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
