"""Data-parallel objectives: place data arrays along the data plate across devices.

The objectives keep every per-observation quantity as an array along the data
plate, so when the model's data arguments are sharded along that axis XLA's
SPMD partitioner computes the loss and its gradient where the data live: each
device evaluates its observations for all particles and only scalars (sums over
observations) cross devices. Nothing in the objectives changes; only the data
placement does::

    x, y = shard_data(x, y)          # one mesh axis "data" over all devices
    svi = SVI(model, guide, optax.adam(1e-2), loss=PredictiveELBO("crps"))
    result = svi.run(key, 1000, x, y)

Across hosts, call :func:`jax.distributed.initialize` first and build each
array from the process-local shards (for example with
:func:`jax.make_array_from_process_local_data`) on a mesh over
:func:`jax.devices`; the same call then runs data-parallel over all hosts.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

__all__ = ["data_mesh", "shard_data"]


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
) -> tuple[jax.Array, ...] | jax.Array:
    """Split arrays along their data-plate axis across the devices of a mesh.

    Observations are never padded: padding would add observations to the sum
    that every objective computes. The data-plate size must therefore be a
    multiple of the number of devices; drop or hold out the remainder (for
    example use it as validation data) when it is not.

    :param arrays: arrays whose ``axis`` indexes the observations (all of the
        same size along it).
    :param int axis: the data-plate axis of every array.
    :param mesh: a one-axis mesh; :func:`~numpyro_pvi.sharding.data_mesh`
        over all devices by default.
    :param axis_name: the mesh axis to shard over; the mesh's only axis by
        default.
    :return: the sharded arrays (a single array when one was given).
    """
    mesh = data_mesh() if mesh is None else mesh
    if axis_name is None:
        if len(mesh.axis_names) != 1:
            raise ValueError(
                f"shard_data: the mesh has axes {mesh.axis_names}; pass "
                "axis_name=... to say which one splits the observations."
            )
        (axis_name,) = mesh.axis_names
    elif axis_name not in mesh.axis_names:
        raise ValueError(
            f"shard_data: axis_name={axis_name!r} is not an axis of the mesh "
            f"{mesh.axis_names}."
        )
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
        if size % num_devices:
            raise ValueError(
                f"shard_data: array {k} has {size} observations along axis {axis}, "
                f"not a multiple of the {num_devices} devices of mesh axis "
                f"'{axis_name}'. Padding would change every objective's sum over "
                f"observations; use the first {size - size % num_devices} "
                "observations (or a multiple of the device count) instead."
            )
        spec: list[str | None] = [None] * ndim
        spec[axis % ndim] = axis_name
        out.append(jax.device_put(array, NamedSharding(mesh, PartitionSpec(*spec))))
    return out[0] if len(out) == 1 else tuple(out)
