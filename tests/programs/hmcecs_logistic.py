"""Logistic regression over a subsampled plate with ``numpyro.subsample``
(the HMCECS example's model)."""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer.autoguide import AutoNormal

SOURCE = "pyro-ppl/numpyro examples/hmcecs.py (model), commit 0b935d48"
TRAITS = ("subsampled plate", "numpyro.subsample", "positional static argument")


def model(data, obs, subsample_size):
    n, m = data.shape
    theta = numpyro.sample("theta", dist.Normal(jnp.zeros(m), 0.5 * jnp.ones(m)))
    with numpyro.plate("N", n, subsample_size=subsample_size):
        batch_feats = numpyro.subsample(data, event_dim=1)
        batch_obs = numpyro.subsample(obs, event_dim=0)
        numpyro.sample(
            "obs", dist.Bernoulli(logits=theta @ batch_feats.T), obs=batch_obs
        )


def make_guide(model):
    return AutoNormal(model)


def _data(seed, n, subsample_size):
    rng = np.random.default_rng(seed)
    features = rng.standard_normal((n, 5)).astype(np.float32)
    theta = np.array([1.0, -0.5, 0.3, 0.0, 0.8], np.float32)
    obs = (rng.uniform(size=n) < 1 / (1 + np.exp(-features @ theta))).astype(np.float32)
    return (jnp.asarray(features), jnp.asarray(obs), subsample_size), {}


def data(seed=0):
    return _data(seed, 200, 50)


def held_out(seed=1):
    # every observation scored: the diagnostics refuse a subsampled plate
    return _data(seed, 100, None)
