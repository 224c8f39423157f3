"""ArviZ's native container, on either generation: the last layer.

The diagnostics compute NumPy arrays (the array core), build
``xarray.Dataset`` groups from them, and an adapter turns the groups into
ArviZ's native container and reads them back:

- :class:`InferenceDataAdapter` for ArviZ 0.2x (``arviz.InferenceData``);
- :class:`DataTreeAdapter` for ArviZ ≥ 1.0 (``xarray.DataTree``,
  arviz-base).

:data:`ADAPTER` is the instance for the installed ArviZ. The ArviZ numerics
the diagnostics reuse (Pareto smoothing, PSIS-LOO of an approximate
posterior) are apart, in :mod:`~numpyro_pvi._arviz.numerics`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import arviz as az
import numpy as np
import numpyro
import xarray as xr

#: The installed ArviZ's major version (0 or 1).
ARVIZ_MAJOR = int(az.__version__.split(".")[0])

#: What a diagnostic returns: ``arviz.InferenceData`` or ``xarray.DataTree``.
Container = Any

#: The sample dimensions of every group with draws.
SAMPLE_DIMS = ("chain", "draw")


class ContainerAdapter(Protocol):
    """What the diagnostics need from an ArviZ generation's container."""

    def dict_to_dataset(
        self,
        data: Mapping[str, np.ndarray],
        *,
        dims: Mapping[str, Sequence[str]] | None = None,
        attrs: Mapping[str, Any] | None = None,
        sample_dims: Sequence[str] = SAMPLE_DIMS,
    ) -> xr.Dataset:
        """Arrays with ``sample_dims`` leading as the dataset of a group."""

    def build(self, groups: Mapping[str, xr.Dataset], attrs: Mapping[str, Any]) -> Any:
        """The container holding ``groups`` with root ``attrs``."""

    def add_groups(
        self, data: Any, groups: Mapping[str, xr.Dataset], attrs: Mapping[str, Any]
    ) -> Any:
        """``data`` (built here) with more ``groups`` and root ``attrs``."""

    def groups(self, data: Any) -> list[str]:
        """Group names of a container (``[]`` for anything else)."""

    def dataset(self, data: Any, name: str) -> xr.Dataset:
        """The dataset of group ``name``."""


class InferenceDataAdapter:
    """ArviZ 0.2x: ``arviz.InferenceData``."""

    def dict_to_dataset(
        self,
        data: Mapping[str, np.ndarray],
        *,
        dims: Mapping[str, Sequence[str]] | None = None,
        attrs: Mapping[str, Any] | None = None,
        sample_dims: Sequence[str] = SAMPLE_DIMS,
    ) -> xr.Dataset:
        return az.dict_to_dataset(
            dict(data),
            dims=dict(dims or {}),
            attrs=dict(attrs or {}),
            library=numpyro,
            default_dims=list(sample_dims),
        )

    def build(self, groups: Mapping[str, xr.Dataset], attrs: Mapping[str, Any]) -> Any:
        datasets: dict[str, Any] = dict(groups)
        return az.InferenceData(**datasets, attrs=dict(attrs))

    def add_groups(
        self, data: Any, groups: Mapping[str, xr.Dataset], attrs: Mapping[str, Any]
    ) -> Any:
        data.add_groups(dict(groups))
        data.attrs.update(attrs)
        return data

    def groups(self, data: Any) -> list[str]:
        if isinstance(data, az.InferenceData):
            return list(data.groups())
        return []

    def dataset(self, data: Any, name: str) -> xr.Dataset:
        return data[name]


class DataTreeAdapter:
    """ArviZ ≥ 1.0: ``xarray.DataTree`` with arviz-base."""

    def dict_to_dataset(
        self,
        data: Mapping[str, np.ndarray],
        *,
        dims: Mapping[str, Sequence[str]] | None = None,
        attrs: Mapping[str, Any] | None = None,
        sample_dims: Sequence[str] = SAMPLE_DIMS,
    ) -> xr.Dataset:
        from arviz_base import dict_to_dataset

        return dict_to_dataset(
            dict(data),
            dims=dict(dims or {}),
            attrs=dict(attrs or {}),
            inference_library=numpyro,
            sample_dims=list(sample_dims),
        )

    def build(self, groups: Mapping[str, xr.Dataset], attrs: Mapping[str, Any]) -> Any:
        return xr.DataTree.from_dict(
            {"/": xr.Dataset(attrs=dict(attrs)), **dict(groups)}
        )

    def add_groups(
        self, data: Any, groups: Mapping[str, xr.Dataset], attrs: Mapping[str, Any]
    ) -> Any:
        for name, ds in groups.items():
            data[name] = xr.DataTree(ds)
        data.attrs.update(attrs)
        return data

    def groups(self, data: Any) -> list[str]:
        if isinstance(data, xr.DataTree):
            return list(data.children)
        return []

    def dataset(self, data: Any, name: str) -> xr.Dataset:
        return data[name].to_dataset()


#: The adapter of the installed ArviZ.
ADAPTER: ContainerAdapter = (
    InferenceDataAdapter() if ARVIZ_MAJOR == 0 else DataTreeAdapter()
)


def has_group(data: Any, name: str) -> bool:
    """Whether ``data`` is the installed ArviZ's container with group ``name``."""
    return name in ADAPTER.groups(data)


def get_group(data: Any, name: str) -> xr.Dataset:
    """One group of a diagnostic's result as an ``xarray.Dataset``, on either
    ArviZ generation (``data[name]`` of an ``InferenceData``,
    ``data[name].to_dataset()`` of a ``DataTree``).

    **Example**::

        >>> result = diagnostics.vsbc(...)
        >>> diagnostics.get_group(result, "vsbc_symmetry").to_dataframe()

    :param data: the result of a diagnostic.
    :param name: the group's name.
    :return: the group's variables, coordinates and attributes.
    """
    if not has_group(data, name):
        raise KeyError(
            f"get_group: no group {name!r}; the groups are {ADAPTER.groups(data)}."
        )
    return ADAPTER.dataset(data, name)


def dataset(data: Any, name: str, function: str, producer: str) -> xr.Dataset:
    """The dataset of group ``name``, or a ``TypeError`` naming ``function``
    and the diagnostic (``producer``) whose result it expects."""
    if not has_group(data, name):
        kind = "InferenceData" if ARVIZ_MAJOR == 0 else "DataTree"
        raise TypeError(
            f"{function}: expected the {kind} returned by numpyro_pvi.diagnostics."
            f"{producer} (with a {name!r} group), got {type(data).__name__}"
            + (f" with groups {ADAPTER.groups(data)}." if ADAPTER.groups(data) else ".")
        )
    return ADAPTER.dataset(data, name)
