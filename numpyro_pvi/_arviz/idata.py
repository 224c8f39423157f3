"""Small helpers shared by the diagnostics that build ArviZ containers.

- :func:`root_attrs`: the root attributes (library versions, guide class);
- :func:`site_dims`: dimension names of sample sites (plates name their axes);
- :func:`draws_dataset`: an ``xarray.Dataset`` with ``(chain=1, draw=S)`` dims.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib.metadata import version
from typing import Any

import arviz as az
import jax
import numpy as np
import numpyro
import xarray as xr
from numpyro.infer.autoguide import AutoGuide

from numpyro_pvi._arviz.containers import ADAPTER


def guide_name(guide: Callable) -> str:
    """The class name of an autoguide (``fitted_name`` where it stands for
    the fitted form of another), or the name of a guide function."""
    if isinstance(guide, AutoGuide):
        return getattr(guide, "fitted_name", type(guide).__name__)
    return getattr(guide, "__name__", type(guide).__name__)


def root_attrs(guide: Callable | None = None, **extra: Any) -> dict[str, Any]:
    """Root attributes of a diagnostic's container: library versions, guide.

    :param guide: the guide whose class (or function name) is recorded.
    :param extra: further attributes (strings or numbers).
    :return: a dict serialisable to netCDF.
    """
    attrs: dict[str, Any] = {
        "inference_library": "numpyro",
        "inference_library_version": numpyro.__version__,
        "numpyro_pvi_version": version("numpyro-pvi"),
        "jax_version": jax.__version__,
        "arviz_version": az.__version__,
    }
    if guide is not None:
        attrs["guide"] = guide_name(guide)
    attrs.update(extra)
    return attrs


def site_dims(tr: Mapping[str, dict[str, Any]]) -> dict[str, list[str]]:
    """Dimension names of every sample and deterministic site of a trace
    (without chain/draw).

    An axis indexed by a plate is named after the plate; the other axes are
    ``<site>_dim_<i>`` as ArviZ names them.
    """
    dims = {}
    for name, site in tr.items():
        if site["type"] not in ("sample", "deterministic"):
            continue
        shape = np.shape(site["value"])
        names = [f"{name}_dim_{i}" for i in range(len(shape))]
        event_dim = site["fn"].event_dim if site["type"] == "sample" else 0
        batch_ndim = len(shape) - event_dim
        for frame in site["cond_indep_stack"]:
            axis = batch_ndim + frame.dim
            if 0 <= axis < batch_ndim and shape[axis] == frame.size:
                names[axis] = frame.name
        dims[name] = names
    return dims


def draws_dataset(
    draws: Mapping[str, Any],
    *,
    dims: Mapping[str, list[str]] | None = None,
    attrs: Mapping[str, Any] | None = None,
) -> xr.Dataset:
    """A dataset of draws ``(S, ...)`` with dims ``(chain=1, draw=S, ...)``.

    :param draws: arrays with the draw axis first.
    :param dims: per variable, the names of the axes after the draw axis.
    :param attrs: dataset attributes.
    """
    return ADAPTER.dict_to_dataset(
        {name: np.asarray(value)[None] for name, value in draws.items()},
        dims=dims,
        attrs=attrs,
    )


def component_labels(name: str, shape: tuple[int, ...]) -> list[str]:
    """``name`` or ``name[i, j]`` for every scalar component of a site."""
    if not shape:
        return [name]
    return [f"{name}[{', '.join(map(str, idx))}]" for idx in np.ndindex(*shape)]


def objective_attrs(loss: Any, targets: bool | None) -> dict[str, str]:
    """The attributes that record the objective a guide was fitted with."""
    return {
        "objective": "unspecified" if loss is None else type(loss).__name__,
        "targets_posterior": {True: "true", False: "false", None: "unspecified"}[
            targets
        ],
    }
