"""The SLCP benchmark's pieces: the model against its closed form and its
symmetry, the mode masses, C2ST's known answers, the data reader and the
clean skip without data."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro.infer.util import log_density
from scipy import stats

from benchmarks.slcp import c2st, load_observation, main, mode_masses, slcp

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "sbibm" / "slcp"
X = np.array([[2.37, 0.50], [9.93, 1.71], [-10.44, -1.91], [-1.23, -0.10]])


def _log_joint(theta):
    return log_density(slcp, (jnp.asarray(X),), {}, {"theta": theta})[0]


def test_model_is_the_closed_form():
    theta = np.array([0.5, -0.3, 1.7, -1.2, 0.4])
    s1, s2, rho = theta[2] ** 2, theta[3] ** 2, np.tanh(theta[4])
    cov = np.array([[s1**2, rho * s1 * s2], [rho * s1 * s2, s2**2]]) + 1e-6 * np.eye(2)
    expected = stats.multivariate_normal(theta[:2], cov).logpdf(X).sum() + 5 * np.log(
        1 / 6
    )
    np.testing.assert_allclose(_log_joint(jnp.asarray(theta)), expected, rtol=1e-5)


def test_posterior_is_symmetric_in_the_signs_of_theta3_and_theta4():
    """Why each mode's exact mass is 1/4."""
    theta = jnp.array([0.5, -0.3, 1.7, -1.2, 0.4])
    base = _log_joint(theta)
    for flip in ([1, 1, -1, 1, 1], [1, 1, 1, -1, 1], [1, 1, -1, -1, 1]):
        np.testing.assert_allclose(_log_joint(theta * jnp.array(flip)), base, rtol=1e-6)
    # and not in the correlation's sign
    assert abs(_log_joint(theta * jnp.array([1, 1, 1, 1, -1])) - base) > 0.1


def test_mode_masses():
    theta = np.zeros((8, 5))
    theta[:, 2] = [1, 1, 1, -1, -1, -1, -1, 1]
    theta[:, 3] = [1, -1, 1, 1, -1, -1, -1, 1]
    np.testing.assert_allclose(mode_masses(theta), [3 / 8, 1 / 8, 1 / 8, 3 / 8])


def test_c2st_known_answers():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(1000, 2)), rng.normal(size=(1000, 2))
    # same distribution: accuracy 0.5 up to its standard error (~0.011)
    assert abs(c2st(a, b) - 0.5) < 0.05
    assert c2st(a, b + 10.0) > 0.99


@pytest.mark.skipif(not DATA.is_dir(), reason="no SLCP reference data")
def test_reference_draws_have_four_equal_modes():
    x, reference = load_observation(DATA, 1)
    assert x.shape == (4, 2) and reference.shape == (10_000, 5)
    se = np.sqrt(0.25 * 0.75 / 10_000)
    np.testing.assert_allclose(mode_masses(reference), 0.25, atol=4 * se)
    # the reference draws are where the posterior is: the log joint is finite
    log_joint = jax.vmap(
        lambda t: log_density(slcp, (jnp.asarray(x),), {}, {"theta": t})[0]
    )(jnp.asarray(reference[:100]))
    assert np.all(np.isfinite(log_joint))


def test_benchmark_skips_cleanly_without_data(tmp_path, capsys):
    assert main([str(tmp_path / "absent")]) == 0
    assert "SKIPPED" in capsys.readouterr().err
