"""The divorce-rate regression: no plate, data passed as keyword arguments,
Python branches on the arguments (``if marriage is not None``)."""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer.autoguide import AutoNormal

SOURCE = (
    "pyro-ppl/numpyro notebooks/source/bayesian_regression.ipynb (model), "
    "commit 0b935d48"
)
TRAITS = ("no plate", "keyword-only data", "Python on the arguments")


def model(marriage=None, age=None, divorce=None):
    a = numpyro.sample("a", dist.Normal(0.0, 0.2))
    M, A = 0.0, 0.0
    if marriage is not None:
        bM = numpyro.sample("bM", dist.Normal(0.0, 0.5))
        M = bM * marriage
    if age is not None:
        bA = numpyro.sample("bA", dist.Normal(0.0, 0.5))
        A = bA * age
    sigma = numpyro.sample("sigma", dist.Exponential(1.0))
    mu = a + M + A
    numpyro.sample("obs", dist.Normal(mu, sigma), obs=divorce)


def make_guide(model):
    return AutoNormal(model)


def _data(seed, n):
    # the WaffleDivorce columns, standardised as in the notebook
    rng = np.random.default_rng(seed)
    marriage = rng.standard_normal(n).astype(np.float32)
    age = (-0.7 * marriage + 0.7 * rng.standard_normal(n)).astype(np.float32)
    divorce = (0.1 * marriage - 0.6 * age + 0.8 * rng.standard_normal(n)).astype(
        np.float32
    )
    return (), {
        "marriage": jnp.asarray(marriage),
        "age": jnp.asarray(age),
        "divorce": jnp.asarray(divorce),
    }


def data(seed=0):
    return _data(seed, 50)


def held_out(seed=1):
    return _data(seed, 50)
