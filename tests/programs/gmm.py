"""The Gaussian mixture of NumPyro's GMM notebook: an assignment per
observation marked for enumeration (``config_enumerate``), the global sites
fitted by an autoguide of the model with the local sites hidden, and
``TraceEnum_ELBO``."""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax import random
from numpyro import handlers
from numpyro.contrib.funsor import config_enumerate
from numpyro.infer import TraceEnum_ELBO, init_to_value
from numpyro.infer.autoguide import AutoNormal

SOURCE = "pyro-ppl/numpyro notebooks/source/gmm.ipynb, commit 0b935d48"
TRAITS = ("enumerated discrete site", "autoguide of a blocked model")
#: the VI of an enumerated model
VI = TraceEnum_ELBO

K = 2  # Fixed number of components.


@config_enumerate
def model(data):
    # Global variables.
    weights = numpyro.sample("weights", dist.Dirichlet(0.5 * jnp.ones(K)))
    scale = numpyro.sample("scale", dist.LogNormal(0.0, 2.0))
    with numpyro.plate("components", K):
        locs = numpyro.sample("locs", dist.Normal(0.0, 10.0))

    with numpyro.plate("data", len(data)):
        # Local variables.
        assignment = numpyro.sample("assignment", dist.Categorical(weights))
        numpyro.sample("obs", dist.Normal(locs[assignment], scale), obs=data)


def make_guide(model):
    """The notebook's guide of the blocked model, initialised as its best
    initialisation is (equal weights, the data's scale, one location per
    cluster), with ``AutoNormal`` for its ``AutoDelta``: a point mass
    learns no predictive uncertainty (the objectives warn) and has no
    density (SoftCVI refuses it)."""
    init_values = {
        "weights": jnp.ones(K) / K,
        "scale": jnp.asarray(2.0),
        "locs": jnp.array([0.0, 11.0]),
    }
    global_model = handlers.block(
        handlers.seed(model, random.key(0)),
        hide_fn=lambda site: (
            site["name"] not in ["weights", "scale", "locs", "components"]
        ),
    )
    return AutoNormal(global_model, init_loc_fn=init_to_value(values=init_values))


def data(seed=0, num_obs=40):
    """Two clusters, around 0.5 and 11, with unit scale."""
    rng = np.random.default_rng(seed)
    centre = np.where(rng.random(num_obs) < 0.4, 0.5, 11.0)
    return (jnp.asarray(centre + rng.normal(size=num_obs), jnp.float32),), {}


def held_out(seed=1):
    return data(seed, num_obs=20)
