"""Baseball batting averages, partially pooled on the logit scale: a local
latent per player and a Binomial whose ``total_count`` (at bats) varies."""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer.autoguide import AutoNormal

SOURCE = (
    "pyro-ppl/numpyro examples/baseball.py (partially_pooled_with_logit), "
    "commit 0b935d48"
)
TRAITS = ("local latents in the data plate", "Binomial counts", "HalfCauchy")


def partially_pooled_with_logit(at_bats, hits=None):
    r"""
    Number of hits has a Binomial distribution with a logit link function.
    The logits $\alpha$ for each player is normally distributed with the
    mean and scale parameters sharing a common prior.

    :param (jnp.ndarray) at_bats: Number of at bats for each player.
    :param (jnp.ndarray) hits: Number of hits for the given at bats.
    :return: Number of hits predicted by the model.
    """
    loc = numpyro.sample("loc", dist.Normal(-1, 1))
    scale = numpyro.sample("scale", dist.HalfCauchy(1))
    num_players = at_bats.shape[0]
    with numpyro.plate("num_players", num_players):
        alpha = numpyro.sample("alpha", dist.Normal(loc, scale))
        return numpyro.sample("obs", dist.Binomial(at_bats, logits=alpha), obs=hits)


model = partially_pooled_with_logit


def make_guide(model):
    return AutoNormal(model)


def data(seed=0):
    # the EfronMorris table's shape: 18 players, 45 at bats each (the first
    # half of the season); int32 counts as the example loads them
    rng = np.random.default_rng(seed)
    at_bats = np.full(18, 45, np.int32)
    hits = rng.binomial(at_bats, rng.uniform(0.2, 0.35, 18)).astype(np.int32)
    return (jnp.asarray(at_bats), jnp.asarray(hits)), {}


def held_out(seed=1):
    # the rest of the season: the same players, at bats that vary
    rng = np.random.default_rng(seed)
    at_bats = rng.integers(150, 550, 18).astype(np.int32)
    hits = rng.binomial(at_bats, 0.27).astype(np.int32)
    return (jnp.asarray(at_bats), jnp.asarray(hits)), {}
