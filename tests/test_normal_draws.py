"""Normal likelihoods' simulated observations drawn flat
(``numpyro_pvi/_core/normal_draws.py``): the same values as NumPyro's own
samplers, which draw the deviates in the observations' shape."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
from jax import random

from numpyro_pvi._core import fast_draw, has_fast_draw
from numpyro_pvi._core.normal_draws import standard_normal

SCALE_TRIL = jnp.array([[1.0, 0.0, 0.0], [0.5, 2.0, 0.0], [-1.0, 0.3, 0.7]])


def _likelihoods():
    loc = random.normal(random.PRNGKey(0), (40, 3))
    return {
        "normal": dist.Normal(loc, jnp.array([0.5, 1.0, 3.0])),
        "normal, scalar scale": dist.Normal(loc[:, 0], 2.0),
        "multivariate normal": dist.MultivariateNormal(loc, scale_tril=SCALE_TRIL),
    }


@pytest.mark.py312  # JAX's bits: also in the JAX 0.12 leg
@pytest.mark.parametrize("name", list(_likelihoods()))
def test_draws_are_numpyro_own_values(name):
    # JAX's bits are one counter per value in row-major order: the flat
    # deviates reshaped are NumPyro's, value for value (one key per particle
    # under vmap, as the objectives draw); the draws agree to the rounding of
    # loc + eps * scale, which XLA may fuse differently
    fn = _likelihoods()[name]
    assert has_fast_draw(fn)
    keys = random.split(random.PRNGKey(1), 6)
    shape = fn.shape()
    ours = jax.jit(jax.vmap(lambda k: fast_draw(fn, k, shape)))(keys)
    theirs = jax.jit(jax.vmap(fn.sample))(keys)
    assert ours.shape == theirs.shape == (6,) + shape
    np.testing.assert_allclose(
        np.asarray(ours), np.asarray(theirs), rtol=1e-6, atol=1e-6
    )
    # and a different key gives different values (the test can fail)
    assert not np.array_equal(np.asarray(ours[0]), np.asarray(ours[1]))


def test_standard_normal_keeps_shape_and_dtype():
    x = standard_normal(random.PRNGKey(2), (5, 4, 3))
    assert x.shape == (5, 4, 3) and x.dtype == jnp.result_type(float)
    np.testing.assert_array_equal(x, random.normal(random.PRNGKey(2), (5, 4, 3)))
    assert standard_normal(random.PRNGKey(2), (0, 3)).shape == (0, 3)


class _ShiftedNormal(dist.Normal):
    def sample(self, key, sample_shape=()):
        return super().sample(key, sample_shape) + 1.0


def test_a_subclass_with_its_own_sampler_keeps_it():
    assert not has_fast_draw(_ShiftedNormal(0.0, 1.0))
    assert has_fast_draw(dist.Normal(0.0, 1.0))
