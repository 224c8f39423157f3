"""The container of :func:`~numpyro_pvi.diagnostics.vsbc` from its numbers
(:class:`VSBCArrays`, the NumPy core's output): the ranks' symmetry tests
and histogram, the draws of ``p``, the prior draws and the fits'
statistics, as ArviZ groups."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import xarray as xr

from numpyro_pvi._core import Replications
from numpyro_pvi.diagnostics._idata import component_labels, draws_dataset
from numpyro_pvi.diagnostics._replications import fit_stats
from numpyro_pvi.diagnostics.rank_tests import rank_datasets

__all__ = ["VSBCArrays", "vsbc_groups"]


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
        stacklevel=5,  # the user's call: fit_stats, vsbc_groups, vsbc, shim
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
