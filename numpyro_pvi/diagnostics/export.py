"""ArviZ ``InferenceData`` of any fitted guide (VI or PVI)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import arviz as az
import jax
import numpy as np

from numpyro_pvi._particles import LATENTS, LOG_LIK, _find_data_plate
from numpyro_pvi.diagnostics._idata import (
    check_full_data,
    check_num_draws,
    draws_dataset,
    guide_draws,
    replay_trace,
    root_attrs,
    site_dims,
)

__all__ = ["to_inference_data"]


def to_inference_data(
    rng_key: jax.Array,
    param_map: dict[str, jax.Array],
    model: Callable,
    guide: Callable,
    *args: Any,
    num_draws: int = 1000,
    data_plate: str | None = None,
    chunk_size: int | None = None,
    **kwargs: Any,
) -> az.InferenceData:
    r"""Draws of a fitted guide with the pointwise log-likelihood, for ArviZ.

    The ``log_likelihood`` group holds :math:`\log p(y_i \mid \theta_s)` for
    every observation :math:`y_i` of the data plate (several observed sites
    at index :math:`i` form one observation, their log-likelihoods summed),
    so :func:`arviz.loo`, :func:`arviz.waic`, :func:`arviz.compare` and
    :func:`arviz.plot_posterior` work on any fitted guide. The draws are
    independent, so pass ``reff=1`` where ArviZ asks for it (it is the value
    ArviZ estimates for one chain of independent draws).

    Groups (dims ``(chain=1, draw=S, ...)``; axes indexed by a plate are named
    after the plate):

    - ``posterior``: the guide draws of every latent site (constrained);
    - ``log_likelihood``: one variable, named after the observed site (the
      names joined by ``"__"`` for several), with dims ``(chain, draw,
      <data plate>)``;
    - ``observed_data``: the observed values of every observed site.

    :param rng_key: random key.
    :param param_map: the fitted parameters (e.g. ``svi_result.params``).
    :param model: the NumPyro model.
    :param guide: the fitted guide.
    :param args: positional arguments of model and guide.
    :param num_draws: ``S``, the number of draws.
    :param data_plate: name of the plate indexing the observations; ``None``
        uses the plate shared by every observed site.
    :param chunk_size: evaluate the draws in chunks of this size to bound
        memory; ``None`` evaluates all at once.
    :param kwargs: keyword arguments of model and guide.
    :return: ``arviz.InferenceData``.
    """
    num_draws = check_num_draws(num_draws, 1, "to_inference_data")
    draw_key, trace_key = jax.random.split(rng_key)
    tr = replay_trace(trace_key, param_map, model, guide, args, kwargs)
    check_full_data(tr, "to_inference_data")
    terms = guide_draws(
        draw_key,
        param_map,
        model,
        guide,
        args,
        kwargs,
        num_draws=num_draws,
        requests=(LOG_LIK, LATENTS),
        chunk_size=chunk_size,
        data_plate=data_plate,
        function="to_inference_data",
    )
    with warnings.catch_warnings():  # particle_terms has warned already
        warnings.simplefilter("ignore")
        plate = _find_data_plate(tr, data_plate)
    dims = site_dims(tr)
    observed = [
        name
        for name, site in tr.items()
        if site["type"] == "sample" and site["is_observed"]
    ]
    obs_dim = plate.name if plate.name is not None else "observation"
    log_lik_name = "__".join(observed)
    attrs = root_attrs(guide, diagnostic="to_inference_data")
    return az.InferenceData(
        posterior=draws_dataset(
            terms.latents, dims={name: dims[name] for name in terms.latents}
        ),
        log_likelihood=draws_dataset(
            {log_lik_name: terms.log_lik}, dims={log_lik_name: [obs_dim]}
        ),
        observed_data=az.dict_to_dataset(
            {name: np.asarray(tr[name]["value"]) for name in observed},
            dims={name: dims[name] for name in observed},
            default_dims=[],
        ),
        attrs=attrs,
    )
