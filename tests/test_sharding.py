"""Objectives on data sharded across (host) devices: same numbers, no gathers."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import pytest

from numpyro_pvi.sharding import data_mesh, shard_data

WORKER = Path(__file__).with_name("sharding_worker.py")


@pytest.fixture(scope="module")
def four_devices():
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    env["JAX_PLATFORMS"] = "cpu"
    out = subprocess.run(
        [sys.executable, str(WORKER), "4"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if out.returncode:
        raise AssertionError(out.stderr[-4000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


EXPECTED = [
    "pvi-log",
    "pvi-log-posterior",
    "pacm",
    "pvi-crps",
    "pvi-quadratic",
    "softcvi",
    "snis",
]


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
