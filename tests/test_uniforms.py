"""Uniform deviates several arrays at a time from one pass of the Threefry
hash (``numpyro_pvi/_core/uniforms.py``): their law, the independence of the
arrays and of neighbouring values, both floating-point widths, and the
fallback for other generators."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats as ss
from jax import random

from numpyro_pvi._core.uniforms import uniforms

N = 50_000
#: Kolmogorov–Smirnov critical value at level 1e-3, for N draws.
KS_CRITICAL = math.sqrt(-0.5 * math.log(0.5e-3)) / math.sqrt(N)
#: |z| of a correlation of N pairs beyond which independence is rejected
#: at level 1e-3 (two-sided).
Z_CRITICAL = 3.29


def _checks(u: np.ndarray) -> None:
    assert u.min() >= 0.0 and u.max() < 1.0
    for row in u:
        assert ss.kstest(row, "uniform").statistic < KS_CRITICAL
        # power: a law 2% narrower is rejected
        assert ss.kstest(row, ss.uniform(0, 0.98).cdf).statistic > KS_CRITICAL
    n = u.shape[1]
    for a, b in ((u[0], u[1]), (u[0, :-1], u[0, 1:]), (u[0, ::2], u[1, 1::2])):
        z = np.corrcoef(a, b)[0, 1] * math.sqrt(n)
        assert abs(z) < Z_CRITICAL
    # the joint law of the two arrays: counts in a 10 x 10 grid
    counts = np.histogram2d(u[0], u[1], bins=10, range=[[0, 1], [0, 1]])[0]
    assert ss.chisquare(counts.ravel()).pvalue > 1e-3


@pytest.mark.py312
def test_arrays_are_uniform_and_independent():
    u = np.asarray(
        np.stack(uniforms(random.PRNGKey(0), (N,), 2, jnp.float32)), np.float64
    )
    assert u.shape == (2, N)
    _checks(u)
    # the words are hashed once each: three arrays hold no repeated value
    w = np.stack(uniforms(random.PRNGKey(0), (N,), 3, jnp.float32))
    assert len(np.unique(w)) > 0.99 * w.size


def test_shapes_keys_and_batching():
    keys = random.split(random.PRNGKey(1), 3)
    u = jax.vmap(lambda k: jnp.stack(uniforms(k, (4, 5), 2, jnp.float32)))(keys)
    assert u.shape == (3, 2, 4, 5)
    assert not np.allclose(u[0], u[1])  # each key its own stream
    np.testing.assert_array_equal(
        u[1], np.stack(uniforms(keys[1], (4, 5), 2, jnp.float32))
    )
    typed = np.stack(uniforms(random.key(1), (4,), 2, jnp.float32))
    raw = np.stack(uniforms(random.key_data(random.key(1)), (4,), 2, jnp.float32))
    np.testing.assert_array_equal(typed, raw)
    assert [u.shape for u in uniforms(random.PRNGKey(1), (0, 3), 2)] == [(0, 3)] * 2


def test_another_generator_draws_with_jax():
    key = random.key(2, impl="rbg")
    u = np.stack(uniforms(key, (N,), 2, jnp.float32)).astype(np.float64)
    _checks(u)


@pytest.mark.numerics
def test_double_precision_uses_a_block_per_value():
    # float64 where JAX_ENABLE_X64=1 (the numerics rerun), float32 otherwise
    u = jnp.stack(uniforms(random.PRNGKey(3), (N,), 2, jnp.float64))
    x64 = jax.config.jax_enable_x64
    assert u.dtype == (jnp.float64 if x64 else jnp.float32)
    u = np.asarray(u, np.float64)
    _checks(u)
    # 52 random mantissa bits: values that single precision cannot hold
    assert (np.mean(u != u.astype(np.float32)) > 0.99) == x64
