"""Ordinal regression with an improper flat prior on the ordered cut points
(``ImproperUniform``) and a prior on them written as an observed site
outside the data plate (``c_y_smp``)."""

import numpy as onp
import numpyro
from jax import numpy as np
from jax import random
from numpyro import sample
from numpyro.distributions import (
    Categorical,
    ImproperUniform,
    Normal,
    OrderedLogistic,
    constraints,
)
from numpyro.infer.autoguide import AutoNormal

SOURCE = (
    "pyro-ppl/numpyro notebooks/source/ordinal_regression.ipynb (model2, "
    "data simulation), commit 0b935d48"
)
TRAITS = ("improper prior", "prior as an observed site", "OrderedLogistic")


def model2(X, Y, nclasses=3):
    b_X_eta = sample("b_X_eta", Normal(0, 5))
    c_y = sample(
        "c_y",
        ImproperUniform(
            support=constraints.ordered_vector,
            batch_shape=(),
            event_shape=(nclasses - 1,),
        ),
    )
    sample("c_y_smp", Normal(0, 1), obs=c_y)
    with numpyro.plate("obs", X.shape[0]):
        eta = X * b_X_eta
        sample("Y", OrderedLogistic(eta, c_y), obs=Y)


model = model2


def make_guide(model):
    return AutoNormal(model)


def _data(seed, nsim):
    simkeys = random.split(random.key(seed), 2)
    nclasses = 3
    Y = Categorical(logits=np.zeros(nclasses)).sample(simkeys[0], sample_shape=(nsim,))
    X = Normal().sample(simkeys[1], sample_shape=(nsim,))
    X += Y
    return (X, Y, nclasses), {}


def data(seed=1):
    return _data(seed, 50)


def held_out(seed=2):
    return _data(seed, 40)


assert onp is not None  # the notebook imports numpy beside jax.numpy
