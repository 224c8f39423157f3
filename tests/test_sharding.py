"""Objectives on data sharded across (host) devices: same numbers, no gathers."""

import jax.numpy as jnp
import pytest

from numpyro_pvi.sharding import data_mesh, shard_data

# the tests below read the results of sharding_worker.py, which runs with
# four host devices (conftest.py: four_devices)


def on_four_devices(test):
    """One worker runs the four-device subprocess (about 40 s): slow tier."""
    return pytest.mark.slow(pytest.mark.xdist_group("four_devices")(test))


EXPECTED = [
    "pvi-log",
    "pvi-log-posterior",
    "pacm",
    "pvi-crps",
    "pvi-quadratic",
    "softcvi",
    "snis",
]


@on_four_devices
@pytest.mark.parametrize("name", EXPECTED)
def test_sharded_objective_matches_unsharded(four_devices, name):
    entry = four_devices[name]
    assert entry is not None, f"objective {name} is missing"
    assert entry["sharded_inputs"] == 4
    assert entry["max_rel_diff_subNone"] < 1e-5
    assert entry["max_rel_diff_sub16"] < 1e-5
    if "svi_max_rel_diff" in entry:
        assert entry["svi_max_rel_diff"] < 1e-4
    # the compiled step never gathers a whole data array onto one device
    assert entry["full_gathers"] == []
    # ... and it is really partitioned: sums over observations cross devices
    assert entry["has_collectives"]


@on_four_devices
def test_gather_detector_sees_a_gather(four_devices):
    assert four_devices["control_full_gathers"]


def test_shard_data_rejects_sizes_it_would_have_to_pad():
    mesh = data_mesh()
    n = len(mesh.devices.ravel())
    x = jnp.ones((n, 2))
    assert shard_data(x, mesh=mesh).shape == (n, 2)
    if n > 1:
        with pytest.raises(ValueError, match="not a multiple"):
            shard_data(jnp.ones((n + 1, 2)), mesh=mesh)
    with pytest.raises(ValueError, match="different sizes"):
        shard_data(jnp.ones((n, 2)), jnp.ones(2 * n), mesh=mesh)
    with pytest.raises(ValueError, match="no axis 3"):
        shard_data(x, axis=3, mesh=mesh)
    with pytest.raises(ValueError, match="not an axis"):
        shard_data(x, mesh=mesh, axis_name="batch")
