"""A Bayesian neural network with two hidden layers and a Gamma prior on the
observation precision; observations ``Y`` of shape ``(N, 1)`` inside a plate,
``.to_event(1)``."""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer.autoguide import AutoNormal

SOURCE = "pyro-ppl/numpyro examples/bnn.py (model, nonlin), commit 0b935d48"
TRAITS = ("plate", "to_event observations", "neural network")


# the nonlinearity we use in our neural network
def nonlin(x):
    return jnp.tanh(x)


# a two-layer bayesian neural network with computational flow
# given by D_X => D_H => D_H => D_Y where D_H is the number of
# hidden units. (note we indicate tensor dimensions in the comments)
def model(X, Y, D_H, D_Y=1):
    N, D_X = X.shape

    # sample first layer (we put unit normal priors on all weights)
    w1 = numpyro.sample("w1", dist.Normal(jnp.zeros((D_X, D_H)), jnp.ones((D_X, D_H))))
    assert w1.shape == (D_X, D_H)
    z1 = nonlin(jnp.matmul(X, w1))  # <= first layer of activations
    assert z1.shape == (N, D_H)

    # sample second layer
    w2 = numpyro.sample("w2", dist.Normal(jnp.zeros((D_H, D_H)), jnp.ones((D_H, D_H))))
    assert w2.shape == (D_H, D_H)
    z2 = nonlin(jnp.matmul(z1, w2))  # <= second layer of activations
    assert z2.shape == (N, D_H)

    # sample final layer of weights and neural network output
    w3 = numpyro.sample("w3", dist.Normal(jnp.zeros((D_H, D_Y)), jnp.ones((D_H, D_Y))))
    assert w3.shape == (D_H, D_Y)
    z3 = jnp.matmul(z2, w3)  # <= output of the neural network
    assert z3.shape == (N, D_Y)

    if Y is not None:
        assert z3.shape == Y.shape

    # we put a prior on the observation noise
    prec_obs = numpyro.sample("prec_obs", dist.Gamma(3.0, 1.0))
    sigma_obs = 1.0 / jnp.sqrt(prec_obs)

    # observe data
    with numpyro.plate("data", N):
        # note we use to_event(1) because each observation has shape (1,)
        numpyro.sample("Y", dist.Normal(z3, sigma_obs).to_event(1), obs=Y)


def make_guide(model):
    return AutoNormal(model)


def _data(seed, n):
    # get_data() of the example: a noisy cubic, inputs with a bias column
    rng = np.random.default_rng(seed)
    x = np.linspace(-1, 1, n)
    X = np.power(x[:, np.newaxis], np.arange(3))
    W = 0.5 * rng.standard_normal(3)
    y = np.dot(X, W) + 0.5 * np.power(0.5 + x, 2.0) * np.sin(4.0 * x)
    y += 0.1 * rng.standard_normal(n)
    y = (y - y.mean()) / y.std()
    X[:, 1:] = (X[:, 1:] - X[:, 1:].mean(0)) / X[:, 1:].std(0)
    return (jnp.asarray(X, jnp.float32), jnp.asarray(y[:, None], jnp.float32), 5), {}


def data(seed=0):
    return _data(seed, 50)


def held_out(seed=1):
    return _data(seed, 40)
