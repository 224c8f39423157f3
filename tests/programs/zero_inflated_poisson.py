"""Zero-inflated Poisson regression: ``ZeroInflatedPoisson`` observations
(no reparameterised sampler, infinite support) in a plate."""

import jax.numpy as jnp
import jax.scipy as jsp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer.autoguide import AutoNormal

SOURCE = "pyro-ppl/numpyro examples/zero_inflated_poisson.py (model), commit 0b935d48"
TRAITS = ("plate", "discrete likelihood without rsample", "infinite support")


def model(X, Y):
    D_X = X.shape[1]
    b1 = numpyro.sample("b1", dist.Normal(0.0, 1.0).expand([D_X]).to_event(1))
    b2 = numpyro.sample("b2", dist.Normal(0.0, 1.0).expand([D_X]).to_event(1))

    q = jsp.special.expit(jnp.dot(X, b1[:, None])).reshape(-1)
    lam = jnp.exp(jnp.dot(X, b2[:, None]).reshape(-1))

    with numpyro.plate("obs", X.shape[0]):
        numpyro.sample("Y", dist.ZeroInflatedPoisson(gate=q, rate=lam), obs=Y)


def make_guide(model):
    return AutoNormal(model)


def _data(seed, n):
    # the example's fish.dta: columns livebait, camper, persons, child,
    # intercept (unstandardised, as the example passes them) and the count
    # of fish caught (zero-inflated, heavy-tailed: up to 149 in the data)
    rng = np.random.default_rng(seed)
    X = np.column_stack(
        [
            rng.uniform(size=n) < 0.86,
            rng.uniform(size=n) < 0.59,
            rng.integers(1, 5, n),
            rng.integers(0, 4, n),
            np.ones(n),
        ]
    ).astype(np.float32)
    b1 = np.array([-0.3, -0.6, -0.9, 1.6, 1.3], np.float32)  # P(structural zero)
    b2 = np.array([1.6, 0.8, 0.9, -1.4, -2.4], np.float32)  # log rate
    q = 1 / (1 + np.exp(-(X @ b1)))
    lam = np.exp(X @ b2)
    y = np.where(rng.uniform(size=n) < q, 0, rng.poisson(lam)).astype(np.float32)
    return (jnp.asarray(X), jnp.asarray(y)), {}


def data(seed=0):
    return _data(seed, 160)


def held_out(seed=1):
    return _data(seed, 90)
