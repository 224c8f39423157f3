"""German credit with a learned partial non-centring of ``beta``
(``LocScaleReparam`` with a parameter): a model without arguments that
closes over its data, observed as one ``(1, N)`` array without a plate."""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer.autoguide import AutoNormal
from numpyro.infer.reparam import LocScaleReparam

SOURCE = (
    "pyro-ppl/numpyro notebooks/source/variationally_inferred_parameterization"
    ".ipynb (german_credit_reparam, data preparation), commit 0b935d48"
)
TRAITS = ("no plate", "(1, N) observation", "no arguments", "reparam handler")

# the notebook's data preparation, on simulated columns of the same kinds
_rng = np.random.default_rng(0)
numericals = _rng.standard_normal((120, 7))
categoricals = [_rng.integers(0, k, 120) for k in (3, 4, 2)]
status = (_rng.uniform(size=120) < 0.3).astype(np.int32)

x_numeric = numericals.astype(jnp.float32)
x_categorical = [jnp.eye(c.max() + 1)[c] for c in categoricals]
all_x = jnp.concatenate([x_numeric] + x_categorical, axis=1)
num_features = all_x.shape[1]
y = status[jnp.newaxis, Ellipsis]


def german_credit_reparam(beta_centeredness=None):
    def model():
        log_tau_zero = numpyro.sample("log_tau_zero", dist.Normal(0, 10))
        log_tau_i = numpyro.sample(
            "log_tau_i", dist.Normal(log_tau_zero, jnp.ones(num_features))
        )
        with numpyro.handlers.reparam(
            config={"beta": LocScaleReparam(beta_centeredness)}
        ):
            beta = numpyro.sample(
                "beta", dist.Normal(jnp.zeros(num_features), jnp.exp(log_tau_i))
            )
        numpyro.sample(
            "obs",
            dist.Bernoulli(logits=jnp.einsum("nd,md->mn", all_x, beta[jnp.newaxis, :])),
            obs=y,
        )

    return model


model = german_credit_reparam()


def make_guide(model):
    return AutoNormal(model)


def data(seed=0):
    return (), {}


held_out = None  # the model closes over its data
