"""Beta–Bernoulli with a hand-written Beta guide (constrained parameters)."""

import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints

SOURCE = "pyro-ppl/numpyro test/infer/test_svi.py::test_beta_bernoulli, commit 0b935d48"
TRAITS = ("hand-written guide", "Beta latent", "Bernoulli")


def model(data):
    f = numpyro.sample("beta", dist.Beta(1.0, 1.0))
    with numpyro.plate("N", len(data)):
        numpyro.sample("obs", dist.Bernoulli(f), obs=data)


def guide(data):
    alpha_q = numpyro.param("alpha_q", 1.0, constraint=constraints.positive)
    beta_q = numpyro.param("beta_q", 1.0, constraint=constraints.positive)
    numpyro.sample("beta", dist.Beta(alpha_q, beta_q))


def make_guide(model):
    return guide


def data(seed=0):
    return (jnp.array([1.0] * 8 + [0.0] * 2),), {}


def held_out(seed=1):
    return (jnp.array([1.0] * 6 + [0.0] * 4),), {}
