"""Data- and particle-parallel objectives across devices.

Every per-observation quantity is an array along the data plate, so with the
data sharded along it XLA's SPMD partitioner computes loss and gradient where
the data live; only sums cross devices::

    x, y = shard_data(x, y)          # one mesh axis "data" over all devices
    svi = SVI(model, guide, optax.adam(1e-2), loss=PredictiveELBO("crps"))

:func:`shard_particles` returns a ``vectorize_particles`` for any ELBO that
splits the particles over a mesh axis; on a two-axis mesh both are split.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

__all__ = ["data_mesh", "shard_data", "shard_particles"]


def data_mesh(devices: list | None = None, axis_name: str = "data") -> Mesh:
    """A one-axis mesh over ``devices`` (default: all devices).

    :param devices: devices to use; all of :func:`jax.devices` by default.
    :param str axis_name: name of the mesh axis.
    :return: a :class:`jax.sharding.Mesh`.
    """
    devices = jax.devices() if devices is None else list(devices)
    return Mesh(np.array(devices), (axis_name,))


def shard_data(
    *arrays: jax.Array,
    axis: int = 0,
    mesh: Mesh | None = None,
    axis_name: str | None = None,
    pad: bool = False,
) -> tuple[jax.Array, ...] | jax.Array:
    """Split arrays along their data-plate axis across the devices of a mesh.

    The number of observations must be a multiple of the number of devices,
    unless ``pad=True``: then every array is padded to the next multiple by
    repeating its last observation, and a last array ``keep`` (``True`` at
    the observations, ``False`` at the padding) is returned with them. Mask
    the padding out of the model, and every objective and diagnostic equals
    the one on the unpadded data::

        x, y, keep = shard_data(x, y, pad=True)
        model = mask_observations(model, keep=keep, data_plate="data")

    (:class:`~numpyro_pvi.selection.mask_observations`, or
    ``numpyro.handlers.mask(mask=keep)`` inside the model's data plate).
    Local latent sites of the padding keep their prior terms, which do not
    involve the other sites.

    :param arrays: arrays whose ``axis`` indexes the observations (all of the
        same size along it).
    :param int axis: the data-plate axis of every array.
    :param mesh: a one-axis mesh; :func:`~numpyro_pvi.sharding.data_mesh`
        over all devices by default.
    :param axis_name: the mesh axis to shard over; the mesh's only axis by
        default.
    :param bool pad: pad to a multiple of the devices and return ``keep``.
    :return: the sharded arrays (a single array when one was given and
        ``pad`` is off), then ``keep`` when ``pad`` is on.
    """
    mesh = data_mesh() if mesh is None else mesh
    axis_name = _mesh_axis(mesh, axis_name, "shard_data", "the observations")
    num_devices = mesh.shape[axis_name]
    if not arrays:
        raise ValueError("shard_data: pass at least one array.")
    sizes = {np.shape(a)[axis] for a in arrays if -np.ndim(a) <= axis < np.ndim(a)}
    if len(sizes) > 1:
        raise ValueError(
            f"shard_data: the arrays have different sizes {sorted(sizes)} along "
            f"axis {axis}; they must all be indexed by the same data plate."
        )
    out = []
    for k, array in enumerate(arrays):
        ndim = np.ndim(array)
        if not -ndim <= axis < ndim:
            raise ValueError(
                f"shard_data: array {k} has shape {np.shape(array)}, which has no "
                f"axis {axis}."
            )
        size = np.shape(array)[axis]
        extra = -size % num_devices
        if extra and not pad:
            raise ValueError(
                f"shard_data: array {k} has {size} observations along axis {axis}, "
                f"not a multiple of the {num_devices} devices of mesh axis "
                f"'{axis_name}'. Pass pad=True (padded observations, masked "
                "out of the model by the keep array it returns), or use the "
                f"first {size - size % num_devices} observations."
            )
        if extra:  # the last observation again: finite terms, masked out
            widths = [(0, 0)] * ndim
            widths[axis % ndim] = (0, extra)
            array = jnp.pad(array, widths, mode="edge")
        spec: list[str | None] = [None] * ndim
        spec[axis % ndim] = axis_name
        out.append(jax.device_put(array, NamedSharding(mesh, PartitionSpec(*spec))))
    if pad:
        size = sizes.pop()
        keep = jnp.arange(size + -size % num_devices) < size
        out.append(jax.device_put(keep, NamedSharding(mesh, PartitionSpec(axis_name))))
    return out[0] if len(out) == 1 else tuple(out)


def shard_particles(
    mesh: Mesh | None = None, axis_name: str | None = None
) -> Callable[[Callable, Any], Any]:
    """A ``vectorize_particles`` that splits the particles across devices.

    Pass it to any objective, ``PredictiveELBO(..., vectorize_particles=
    shard_particles(mesh))`` or NumPyro's ``Trace_ELBO(num_particles=...,
    vectorize_particles=...)``: the particles' keys are placed along the mesh
    axis (:func:`jax.lax.with_sharding_constraint`) and the particles
    ``vmap``-ed, so XLA's partitioner draws and evaluates each device's
    particles there; the objective's value and gradient are those of the
    unsharded objective (up to the order of floating-point sums). The number
    of particles (times the strata of a mixture guide) must be a multiple of
    the axis's device count.

    :param mesh: the device mesh (its particle axis of automatic sharding
        type); default a one-axis mesh ``"particles"`` over all devices.
    :param axis_name: the mesh axis the particles are split over; the mesh's
        only axis by default.
    :return: a ``(fn, keys) -> jax.vmap(fn)(keys)`` with the keys sharded.
    """
    mesh = data_mesh(axis_name="particles") if mesh is None else mesh
    axis_name = _mesh_axis(mesh, axis_name, "shard_particles", "the particles")
    if axis_name in _explicit_axes(mesh):
        raise ValueError(
            f"shard_particles: mesh axis '{axis_name}' has explicit sharding "
            "(jax.make_mesh's default); the particles are placed by XLA's "
            "partitioner, which needs an automatic axis: build the mesh with "
            "jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Auto,) "
            "* len(names)) or jax.sharding.Mesh(devices, names)."
        )
    return functools.partial(
        _sharded_vmap,
        sharding=NamedSharding(mesh, PartitionSpec(axis_name)),
        axis=(axis_name, int(mesh.shape[axis_name])),
    )


def _sharded_vmap(
    fn: Callable, keys: Any, *, sharding: NamedSharding, axis: tuple[str, int]
) -> Any:
    name, num_devices = axis
    num = jax.tree.leaves(keys)[0].shape[0]
    if num % num_devices:
        raise ValueError(
            f"shard_particles: {num} particles (times the strata of a mixture "
            f"guide) are not a multiple of the {num_devices} devices of mesh axis "
            f"'{name}'; use num_particles={num_devices * -(-num // num_devices)} "
            "or a mesh axis whose size divides it."
        )
    return jax.vmap(fn)(jax.lax.with_sharding_constraint(keys, sharding))


def _explicit_axes(mesh: Any) -> set[str]:
    """The mesh axes of explicit sharding type (``jax.make_mesh``'s default
    in recent JAX)."""
    types = getattr(mesh, "axis_types", None) or ()
    return {
        str(n)
        for n, t in zip(mesh.axis_names, types, strict=False)
        if "Explicit" in str(t)
    }


def _mesh_axis(mesh: Mesh, axis_name: str | None, where: str, what: str) -> str:
    """``axis_name``, checked to be an axis of ``mesh`` (default its only
    axis)."""
    if axis_name is None:
        if len(mesh.axis_names) != 1:
            raise ValueError(
                f"{where}: the mesh has axes {mesh.axis_names}; pass "
                f"axis_name=... to say which one splits {what}."
            )
        (axis_name,) = mesh.axis_names
    elif axis_name not in mesh.axis_names:
        raise ValueError(
            f"{where}: axis_name={axis_name!r} is not an axis of the mesh "
            f"{mesh.axis_names}."
        )
    return str(axis_name)
