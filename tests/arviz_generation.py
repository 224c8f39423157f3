"""ArviZ's own API on either generation, for the tests.

Written against ArviZ's public functions (not the package's adapter), so the
tests read the diagnostics the way a user of the installed ArviZ does:
``arviz.InferenceData`` on 0.2x, ``xarray.DataTree`` on ≥ 1.0.
"""

from __future__ import annotations

from typing import Any

import arviz as az
import numpy as np
import xarray as xr

ARVIZ_1 = int(az.__version__.split(".")[0]) >= 1

#: The container every diagnostic must return on the installed ArviZ.
CONTAINER = xr.DataTree if ARVIZ_1 else az.InferenceData


def group_names(data: Any) -> set[str]:
    """The groups of a container."""
    return set(data.children) if ARVIZ_1 else set(data.groups())


def group(data: Any, name: str) -> xr.Dataset:
    """One group as an ``xarray.Dataset``."""
    return data[name].to_dataset() if ARVIZ_1 else data[name]


def netcdf_round_trip(data: Any, path: str) -> Any:
    """Write a container to netCDF and read it back with ArviZ's reader."""
    data.to_netcdf(path, engine="h5netcdf")
    if ARVIZ_1:
        return xr.open_datatree(path, engine="h5netcdf")
    return az.from_netcdf(path, engine="h5netcdf")


def assert_same_groups(data: Any, back: Any) -> None:
    """Every group and variable of ``data`` is in ``back`` unchanged."""
    assert group_names(back) == group_names(data)
    for name in group_names(data):
        a, b = group(data, name), group(back, name)
        for var in a.data_vars:
            np.testing.assert_array_equal(a[var].values, b[var].values)


def elpd(result: Any) -> float:
    """The ELPD of ArviZ's ``ELPDData`` (``elpd_loo`` on 0.2x)."""
    return float(result.elpd if ARVIZ_1 else result.elpd_loo)


def posterior_only(values: np.ndarray) -> Any:
    """A container with a ``posterior`` group only (a foreign result)."""
    if ARVIZ_1:
        return az.from_dict({"posterior": {"a": values}})
    return az.from_dict(posterior={"a": values})
