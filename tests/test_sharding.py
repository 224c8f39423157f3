"""Objectives on data sharded across (host) devices: same numbers, no gathers."""

import jax.numpy as jnp
import numpy as np
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
    "pvi-crps-mixture",
    "pvi-quadratic",
    "pvi-quadratic-derangement",
    "pvi-quadratic-many-trials",
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
@pytest.mark.parametrize("name", EXPECTED)
def test_uneven_data_padded_and_masked_equals_the_unpadded(four_devices, name):
    """1001 observations on 4 devices: shard_data(pad=True) pads 3 and
    returns keep; masked by it, every objective's loss and gradient equal
    the unsharded ones on the 1001 (with a subsampled plate, those on the
    padded data unsharded), and so do the held-out log scores; the
    padding scores zero."""
    entry = four_devices[name]["padded"]
    assert entry["padded_size"] == 1004
    assert entry["sharded_inputs"] == 4
    assert entry["max_rel_diff"] < 1e-5
    assert entry["max_rel_diff_sub16"] < 1e-5
    if "score_max_rel_diff" in entry:
        assert entry["score_max_rel_diff"] < 1e-5
        assert entry["padding_scores"] == [0.0, 0.0, 0.0]


@on_four_devices
def test_gather_detector_sees_a_gather(four_devices):
    assert four_devices["control_full_gathers"]


def test_shard_data_rejects_sizes_it_would_have_to_pad():
    mesh = data_mesh()
    n = len(mesh.devices.ravel())
    x = jnp.ones((n, 2))
    assert shard_data(x, mesh=mesh).shape == (n, 2)
    if n > 1:
        with pytest.raises(ValueError, match="not a multiple.*pad=True"):
            shard_data(jnp.ones((n + 1, 2)), mesh=mesh)
    xs, keep = shard_data(jnp.arange(2.0 * (n + 1)).reshape(n + 1, 2), pad=True)
    padded = -(n + 1) % n
    assert xs.shape == (n + 1 + padded, 2) and keep.shape == (n + 1 + padded,)
    np.testing.assert_array_equal(keep, np.arange(n + 1 + padded) < n + 1)
    np.testing.assert_array_equal(xs[n:], np.repeat(xs[n : n + 1], 1 + padded, 0))
    with pytest.raises(ValueError, match="different sizes"):
        shard_data(jnp.ones((n, 2)), jnp.ones(2 * n), mesh=mesh)
    with pytest.raises(ValueError, match="no axis 3"):
        shard_data(x, axis=3, mesh=mesh)
    with pytest.raises(ValueError, match="not an axis"):
        shard_data(x, mesh=mesh, axis_name="batch")


@on_four_devices
@pytest.mark.parametrize(
    "name",
    [
        "trace_elbo",
        "pvi-crps",
        "pacm",
        "stratified-mixture",
        "pvi-crps-mixture",
        "pvi-quadratic-derangement",
    ],
)
@pytest.mark.parametrize("mesh", ["particles", "particles_x_data"])
def test_particles_sharded_across_devices_match_unsharded(four_devices, name, mesh):
    """shard_particles: the particles' keys split over 4 devices (and over 2
    with the data over the other 2): the loss and its gradient equal the
    unsharded objective's, and the step is partitioned (its sums cross
    devices). NumPyro's Trace_ELBO takes it as well."""
    entry = four_devices["particles"][name][mesh]
    assert entry["max_rel_diff"] < 1e-5
    assert entry["has_collectives"]


@on_four_devices
def test_shard_particles_refuses_what_it_cannot_place(four_devices):
    errors = four_devices["particles"]
    assert "6 particles" in errors["uneven_error"]
    assert "num_particles=8" in errors["uneven_error"]
    assert "AxisType.Auto" in errors["explicit_error"]


def test_shard_particles_on_one_device_is_the_vectorized_objective():
    import jax
    from numpyro.infer import Trace_ELBO

    from numpyro_pvi.sharding import shard_particles

    fn = shard_particles()
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    out = fn(lambda k: jax.random.normal(k), keys)
    np.testing.assert_array_equal(out, jax.vmap(lambda k: jax.random.normal(k))(keys))
    elbo = Trace_ELBO(num_particles=4, vectorize_particles=fn)
    assert elbo.vectorize_particles_fn is fn
    with pytest.raises(ValueError, match="not an axis"):
        shard_particles(data_mesh(), axis_name="particles")
