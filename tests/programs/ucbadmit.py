"""UC Berkeley admissions: a varying-intercept, varying-slope GLMM without a
plate, ``len(np.unique(dept))`` on an argument, an ``LKJCholesky`` latent and
a Binomial whose ``total_count`` (applications) varies by row."""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax.scipy.special import expit
from numpyro.infer.autoguide import AutoNormal

SOURCE = "pyro-ppl/numpyro examples/ucbadmit.py (glmm), commit 0b935d48"
TRAITS = ("no plate", "Python on the arguments", "LKJCholesky", "Binomial counts")


def glmm(dept, male, applications, admit=None):
    v_mu = numpyro.sample("v_mu", dist.Normal(0, jnp.array([4.0, 1.0])))

    sigma = numpyro.sample("sigma", dist.HalfNormal(jnp.ones(2)))
    L_Rho = numpyro.sample("L_Rho", dist.LKJCholesky(2, concentration=2))
    scale_tril = sigma[..., jnp.newaxis] * L_Rho
    # non-centered parameterization
    num_dept = len(np.unique(dept))
    z = numpyro.sample("z", dist.Normal(jnp.zeros((num_dept, 2)), 1))
    v = jnp.dot(scale_tril, z.T).T

    logits = v_mu[0] + v[dept, 0] + (v_mu[1] + v[dept, 1]) * male
    if admit is None:
        # we use a Delta site to record probs for predictive distribution
        probs = expit(logits)
        numpyro.sample("probs", dist.Delta(probs), obs=probs)
    numpyro.sample("admit", dist.Binomial(applications, logits=logits), obs=admit)


model = glmm


def make_guide(model):
    return AutoNormal(model)


def _data(seed, scale):
    # the UCBadmit table's layout: 6 departments x (female, male)
    rng = np.random.default_rng(seed)
    dept = np.repeat(np.arange(6), 2)
    male = np.tile(np.array([0.0, 1.0]), 6)
    applications = (rng.integers(20, 400, 12) * scale).astype(np.int32)
    p = 1 / (1 + np.exp(-(rng.normal(0.0, 1.2, 6)[dept] - 0.1 * male)))
    admit = rng.binomial(applications, p).astype(np.int32)
    return (
        jnp.asarray(dept),
        jnp.asarray(male),
        jnp.asarray(applications),
        jnp.asarray(admit),
    ), {}


def data(seed=0):
    return _data(seed, 1)


def held_out(seed=1):
    return _data(seed, 1)
