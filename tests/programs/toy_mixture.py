"""The toy mixture with discrete enumeration: an observed Bernoulli ``A``
selects the Bernoulli of a hidden ``B``, marked for enumeration, which
selects the Bernoulli of the observed ``C``; a hand-written Beta guide over
the probabilities; fitted with ``TraceEnum_ELBO``."""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.contrib.funsor import config_enumerate
from numpyro.distributions import constraints
from numpyro.infer import TraceEnum_ELBO
from numpyro.ops.indexing import Vindex

SOURCE = (
    "pyro-ppl/numpyro examples/toy_mixture_model_discrete_enumeration.py, "
    "commit 002c6786"
)
TRAITS = ("enumerated discrete site", "hand-written guide", "two observed sites")
#: the VI of an enumerated model
VI = TraceEnum_ELBO


@config_enumerate
def model(prior, obs, num_obs):
    p_A = numpyro.sample("p_A", dist.Beta(1, 1))
    p_B = numpyro.sample("p_B", dist.Beta(jnp.ones(2), jnp.ones(2)).to_event(1))
    p_C = numpyro.sample("p_C", dist.Beta(jnp.ones(2), jnp.ones(2)).to_event(1))
    with numpyro.plate("data_plate", num_obs):
        A = numpyro.sample("A", dist.Bernoulli(p_A), obs=obs["A"])
        # Vindex used to ensure proper indexing into the enumerated sample sites
        B = numpyro.sample(
            "B", dist.Bernoulli(Vindex(p_B)[A]), infer={"enumerate": "parallel"}
        )
        numpyro.sample("C", dist.Bernoulli(Vindex(p_C)[B]), obs=obs["C"])


def guide(prior, obs, num_obs):
    a = numpyro.param("a", prior["A"], constraint=constraints.positive)
    numpyro.sample("p_A", dist.Beta(a[0], a[1]))
    b = numpyro.param("b", prior["B"], constraint=constraints.positive)
    numpyro.sample("p_B", dist.Beta(b[:, 0], b[:, 1]).to_event(1))
    c = numpyro.param("c", prior["C"], constraint=constraints.positive)
    numpyro.sample("p_C", dist.Beta(c[:, 0], c[:, 1]).to_event(1))


def make_guide(model):
    return guide


PRIOR = {
    "A": jnp.array([1.0, 10.0]),
    "B": jnp.array([[10.0, 1.0], [1.0, 10.0]]),
    "C": jnp.array([[10.0, 1.0], [1.0, 10.0]]),
}


def data(seed=0, num_obs=40):
    """The example's generating process: p_A = 0.3, p_B = (0.2, 0.9),
    p_C = (0.1, 0.8)."""
    rng = np.random.default_rng(seed)
    a = rng.random(num_obs) < 0.3
    b = rng.random(num_obs) < np.where(a, 0.9, 0.2)
    c = rng.random(num_obs) < np.where(b, 0.8, 0.1)
    obs = {"A": jnp.asarray(a, jnp.int32), "C": jnp.asarray(c, jnp.int32)}
    return (PRIOR, obs, num_obs), {}


def held_out(seed=1):
    return data(seed, num_obs=20)
