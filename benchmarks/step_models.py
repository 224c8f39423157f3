"""The models and guides of the step-time benchmark."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from jax import random
from numpyro.infer.autoguide import AutoMultivariateNormal, AutoNormal

from numpyro_pvi.guides import AutoFlow, AutoGaussianMixture

__all__ = ["GUIDES", "MIXTURE_GUIDES", "MODELS", "BenchModel"]


class BenchModel(NamedTuple):
    """A benchmark problem.

    :ivar name: registry key.
    :ivar description: one line for the results table.
    :ivar make: ``rng_key -> (model, args)``: the model and the arguments
        (data) passed to it and to ``svi.update``.
    """

    name: str
    description: str
    make: Callable[[jax.Array], tuple[Callable, tuple]]


def glm_model(x: jax.Array, y: jax.Array) -> None:
    """Linear regression with D coefficients, intercept and noise scale."""
    d = x.shape[1]
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([d]).to_event(1))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Normal(x @ w + b, sigma), obs=y)


def make_glm(rng_key: jax.Array, n: int = 10_000, d: int = 20):
    kx, kw, ke = random.split(rng_key, 3)
    x = random.normal(kx, (n, d))
    w = random.normal(kw, (d,))
    y = x @ w + 0.5 + random.normal(ke, (n,))
    return glm_model, (x, y)


def student_model(x: jax.Array, y: jax.Array, df: float | None = 4.0) -> None:
    """Robust regression: a Student-t likelihood (4 degrees of freedom, or a
    latent number of them when ``df`` is None)."""
    d = x.shape[1]
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([d]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    if df is None:
        df = numpyro.sample("df", dist.Gamma(2.0, 0.1))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.StudentT(df, x @ w, sigma), obs=y)


def make_student(
    rng_key: jax.Array, n: int = 5000, d: int = 12, df: float | None = 4.0
):
    kx, kw, ke = random.split(rng_key, 3)
    x = random.normal(kx, (n, d))
    y = x @ random.normal(kw, (d,)) + 0.5 * random.t(ke, 4.0, (n,))
    return partial(student_model, df=df), (x, y)


def volatility_model(returns: jax.Array) -> None:
    """NumPyro's ``examples/stochastic_volatility.py`` as written: a
    Gaussian random walk of log volatilities, Student-t returns with latent
    degrees of freedom, no plate."""
    step_size = numpyro.sample("sigma", dist.Exponential(50.0))
    s = numpyro.sample(
        "s", dist.GaussianRandomWalk(scale=step_size, num_steps=returns.shape[0])
    )
    nu = numpyro.sample("nu", dist.Exponential(0.1))
    numpyro.sample("r", dist.StudentT(df=nu, loc=0.0, scale=jnp.exp(s)), obs=returns)


def make_volatility(rng_key: jax.Array, t: int = 2000):
    return volatility_model, (0.02 * random.t(rng_key, 4.0, (t,)),)


def gamma_model(x: jax.Array, y: jax.Array) -> None:
    """Gamma regression (log link) with its shape a latent variable."""
    d = x.shape[1]
    w = numpyro.sample("w", dist.Normal(0.0, 0.5).expand([d]).to_event(1))
    shape = numpyro.sample("shape", dist.LogNormal(0.0, 1.0))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Gamma(shape, shape / jnp.exp(x @ w)), obs=y)


def make_gamma(rng_key: jax.Array, n: int = 5000, d: int = 8):
    kx, kw, ke = random.split(rng_key, 3)
    x = 0.3 * random.normal(kx, (n, d))
    y = random.gamma(ke, 3.0, (n,)) / 3.0 * jnp.exp(x @ random.normal(kw, (d,)))
    return gamma_model, (x, y)


def beta_model(x: jax.Array, y: jax.Array) -> None:
    """Beta regression (logit link, latent precision)."""
    d = x.shape[1]
    w = numpyro.sample("w", dist.Normal(0.0, 0.5).expand([d]).to_event(1))
    phi = numpyro.sample("phi", dist.LogNormal(2.0, 0.5))
    mean = jax.nn.sigmoid(x @ w)
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Beta(mean * phi, (1.0 - mean) * phi), obs=y)


def make_beta(rng_key: jax.Array, n: int = 5000, d: int = 8):
    kx, kw, ke = random.split(rng_key, 3)
    x = 0.5 * random.normal(kx, (n, d))
    mean = jax.nn.sigmoid(x @ random.normal(kw, (d,)))
    y = random.beta(ke, 10.0 * mean, 10.0 * (1.0 - mean))
    return beta_model, (x, jnp.clip(y, 1e-4, 1.0 - 1e-4))


def mixture_regression_model(x: jax.Array, y: jax.Array) -> None:
    """Regression with a two-component Normal mixture of intercepts (the
    component summed out by ``MixtureSameFamily``: no reparameterised
    sampler, the CRPS in closed form)."""
    d = x.shape[1]
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([d]).to_event(1))
    b = numpyro.sample("b", dist.Normal(0.0, 3.0).expand([2]).to_event(1))
    p = numpyro.sample("p", dist.Beta(2.0, 2.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    mixing = dist.Categorical(jnp.stack([p, 1.0 - p]))
    with numpyro.plate("data", x.shape[0]):
        component = dist.Normal((x @ w)[:, None] + b, sigma)
        numpyro.sample("y", dist.MixtureSameFamily(mixing, component), obs=y)


def make_mixture_regression(rng_key: jax.Array, n: int = 10_000, d: int = 20):
    kx, kw, kc, ke = random.split(rng_key, 4)
    x = random.normal(kx, (n, d))
    shift = jnp.where(random.bernoulli(kc, 0.3, (n,)), -2.0, 2.0)
    y = x @ random.normal(kw, (d,)) + shift + random.normal(ke, (n,))
    return mixture_regression_model, (x, y)


def poisson_model(x: jax.Array, y: jax.Array) -> None:
    """Poisson regression (log link; no reparameterised sampler, the CRPS
    in closed form with one draw per pair)."""
    d = x.shape[1]
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([d]).to_event(1))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Poisson(jnp.exp(x @ w + b)), obs=y)


def make_poisson(rng_key: jax.Array, n: int = 10_000, d: int = 20):
    kx, kw, ky = random.split(rng_key, 3)
    x = random.normal(kx, (n, d))
    rate = jnp.exp(x @ random.normal(kw, (d,)) / jnp.sqrt(d) + 1.0)
    return poisson_model, (x, random.poisson(ky, rate).astype(jnp.float32))


def negative_binomial_model(x: jax.Array, y: jax.Array) -> None:
    """Negative-binomial regression (log link, latent concentration): a
    Poisson of a Gamma rate, drawn once per particle and count."""
    d = x.shape[1]
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([d]).to_event(1))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    r = numpyro.sample("r", dist.Gamma(2.0, 0.5))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.NegativeBinomial2(jnp.exp(x @ w + b), r), obs=y)


def make_negative_binomial(rng_key: jax.Array, n: int = 10_000, d: int = 20):
    kx, kw, kg, ky = random.split(rng_key, 4)
    x = random.normal(kx, (n, d))
    mean = jnp.exp(x @ random.normal(kw, (d,)) / jnp.sqrt(d) + 1.0)
    rate = random.gamma(kg, 4.0, (n,)) * mean / 4.0
    return negative_binomial_model, (x, random.poisson(ky, rate).astype(jnp.float32))


def zero_inflated_model(x: jax.Array, y: jax.Array) -> None:
    """Zero-inflated Poisson regression: the gate and the rate each
    regressed on the covariates (NumPyro's example's model)."""
    d = x.shape[1]
    w1 = numpyro.sample("w1", dist.Normal(0.0, 1.0).expand([d]).to_event(1))
    w2 = numpyro.sample("w2", dist.Normal(0.0, 1.0).expand([d]).to_event(1))
    gate, rate = jax.nn.sigmoid(x @ w1), jnp.exp(x @ w2)
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.ZeroInflatedPoisson(gate, rate), obs=y)


def make_zero_inflated(rng_key: jax.Array, n: int = 5000, d: int = 8):
    kx, kw, kg, ky, kz = random.split(rng_key, 5)
    x = random.normal(kx, (n, d))
    rate = jnp.exp(x @ random.normal(kw, (d,)) / jnp.sqrt(d) + 1.0)
    zero = random.bernoulli(kz, jax.nn.sigmoid(x @ random.normal(kg, (d,)) - 1.0))
    y = jnp.where(zero, 0, random.poisson(ky, rate)).astype(jnp.float32)
    return zero_inflated_model, (x, y)


BNN_HIDDEN = 32


def trivariate_model(x: jax.Array, y: jax.Array) -> None:
    """Multivariate linear regression: three outcomes per observation, a
    correlated Normal likelihood (vector observations of the energy score)."""
    d = x.shape[1]
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([d, 3]).to_event(2))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0).expand([3]).to_event(1))
    scale_tril = jnp.diag(sigma) + 0.3 * jnp.tril(jnp.ones((3, 3)), -1)
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample(
            "y", dist.MultivariateNormal(x @ w, scale_tril=scale_tril), obs=y
        )


def make_trivariate(rng_key: jax.Array, n: int = 4000, d: int = 8):
    kx, kw, ke = random.split(rng_key, 3)
    x = random.normal(kx, (n, d))
    y = x @ random.normal(kw, (d, 3)) + 0.3 * random.normal(ke, (n, 3))
    return trivariate_model, (x, y)


def bnn_model(x: jax.Array, y: jax.Array) -> None:
    """One-hidden-layer Bayesian neural network with tanh units."""
    d, h = x.shape[1], BNN_HIDDEN
    w1 = numpyro.sample("w1", dist.Normal(0.0, 1.0).expand([d, h]).to_event(2))
    b1 = numpyro.sample("b1", dist.Normal(0.0, 1.0).expand([h]).to_event(1))
    w2 = numpyro.sample("w2", dist.Normal(0.0, 1.0).expand([h]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    f = jnp.tanh(x @ w1 + b1) @ w2
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Normal(f, sigma), obs=y)


def make_bnn(rng_key: jax.Array, n: int = 10_000, d: int = 20):
    kx, ke = random.split(rng_key)
    x = random.normal(kx, (n, d))
    y = jnp.sin(x[:, 0]) + 0.5 * x[:, 1] * x[:, 2] + 0.3 * random.normal(ke, (n,))
    return bnn_model, (x, y)


def logistic_model(x: jax.Array, y: jax.Array) -> None:
    """Logistic regression with D coefficients and intercept (finite support)."""
    d = x.shape[1]
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([d]).to_event(1))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=x @ w + b), obs=y)


def make_logistic(rng_key: jax.Array, n: int = 10_000, d: int = 20):
    kx, kw, ky = random.split(rng_key, 3)
    x = random.normal(kx, (n, d))
    logits = x @ random.normal(kw, (d,)) / jnp.sqrt(d) - 0.3
    y = random.bernoulli(ky, jax.nn.sigmoid(logits)).astype(jnp.float32)
    return logistic_model, (x, y)


SOFTMAX_CLASSES = 5


def softmax_model(x: jax.Array, y: jax.Array) -> None:
    """Multinomial logistic regression: K classes, D coefficients each."""
    d, k = x.shape[1], SOFTMAX_CLASSES
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([d, k]).to_event(2))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0).expand([k]).to_event(1))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Categorical(logits=x @ w + b), obs=y)


def make_softmax(rng_key: jax.Array, n: int = 10_000, d: int = 20):
    kx, kw, ky = random.split(rng_key, 3)
    x = random.normal(kx, (n, d))
    logits = x @ random.normal(kw, (d, SOFTMAX_CLASSES)) / jnp.sqrt(d)
    y = random.categorical(ky, logits)
    return softmax_model, (x, y)


def hetero_model(x: jax.Array, y: jax.Array) -> None:
    """Hierarchical heteroscedastic regression: groups with their own
    intercepts, a noise scale that depends on the covariates."""
    d, g = x.shape[1], HETERO_GROUPS
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([d]).to_event(1))
    v = numpyro.sample("v", dist.Normal(0.0, 0.3).expand([d]).to_event(1))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    with numpyro.plate("groups", g):
        a = numpyro.sample("a", dist.Normal(0.0, tau))
    group = jnp.arange(x.shape[0]) % g
    with numpyro.plate("data", x.shape[0]):
        scale = jax.nn.softplus(x @ v) + 0.1
        numpyro.sample("y", dist.Normal(x @ w + a[group], scale), obs=y)


HETERO_GROUPS = 50


def make_hetero(rng_key: jax.Array, n: int = 10_000, d: int = 10):
    kx, kw, ka, ke = random.split(rng_key, 4)
    x = random.normal(kx, (n, d))
    a = random.normal(ka, (HETERO_GROUPS,))
    scale = jax.nn.softplus(0.3 * x[:, 0]) + 0.1
    y = x @ random.normal(kw, (d,)) + a[jnp.arange(n) % HETERO_GROUPS]
    return hetero_model, (x, y + scale * random.normal(ke, (n,)))


BINOMIAL_TRIALS = 10


def binomial_model(x: jax.Array, y: jax.Array) -> None:
    """Binomial regression: 10 trials per observation (11 support values)."""
    d = x.shape[1]
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([d]).to_event(1))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Binomial(BINOMIAL_TRIALS, logits=x @ w + b), obs=y)


def make_binomial(rng_key: jax.Array, n: int = 10_000, d: int = 20):
    kx, kw, ky = random.split(rng_key, 3)
    x = random.normal(kx, (n, d))
    logits = x @ random.normal(kw, (d,)) / jnp.sqrt(d)
    y = random.binomial(ky, BINOMIAL_TRIALS, jax.nn.sigmoid(logits))
    return binomial_model, (x, y.astype(jnp.float32))


#: Trials of the ``binomial_40`` model (41 support values).
WIDE_TRIALS = 40


def make_binomial_wide(rng_key: jax.Array, n: int = 5000, d: int = 8):
    """Binomial regression of another shape: :data:`WIDE_TRIALS` trials per
    observation (41 support values), N = 5000, D = 8."""
    kx, kw, ky = random.split(rng_key, 3)
    x = random.normal(kx, (n, d))
    logits = x @ random.normal(kw, (d,)) / jnp.sqrt(d)
    y = random.binomial(ky, WIDE_TRIALS, jax.nn.sigmoid(logits))

    def binomial_40_model(x: jax.Array, y: jax.Array) -> None:
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([d]).to_event(1))
        b = numpyro.sample("b", dist.Normal(0.0, 1.0))
        with numpyro.plate("data", x.shape[0]):
            numpyro.sample("y", dist.Binomial(WIDE_TRIALS, logits=x @ w + b), obs=y)

    return binomial_40_model, (x, y.astype(jnp.float32))


#: Trials (at most) of the ``binomial_200`` models (201 support values).
MANY_TRIALS = 200


def make_binomial_many(
    rng_key: jax.Array, n: int = 2000, d: int = 5, varying: bool = False
):
    """Binomial regression of many trials: :data:`MANY_TRIALS` per
    observation (or, ``varying``, 20 to :data:`MANY_TRIALS`, data closed
    over), N = 2000, D = 5: the derangement's overlaps by the recurrence."""
    kx, kw, ky, kn = random.split(rng_key, 4)
    x = random.normal(kx, (n, d))
    logits = x @ random.normal(kw, (d,)) / jnp.sqrt(d)
    trials = (
        random.randint(kn, (n,), 20, MANY_TRIALS + 1).astype(jnp.float32)
        if varying
        else jnp.full((n,), float(MANY_TRIALS))
    )
    y = random.binomial(ky, trials, jax.nn.sigmoid(logits))

    def binomial_200_model(x: jax.Array, y: jax.Array) -> None:
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([d]).to_event(1))
        b = numpyro.sample("b", dist.Normal(0.0, 1.0))
        with numpyro.plate("data", x.shape[0]):
            numpyro.sample("y", dist.Binomial(trials, logits=x @ w + b), obs=y)

    return binomial_200_model, (x, y.astype(jnp.float32))


def make_binomial_counts(rng_key: jax.Array, n: int = 10_000, d: int = 20):
    """Binomial regression with 1 to :data:`BINOMIAL_TRIALS` trials per
    observation (UCBadmit's shape of data). The counts are closed over, as
    ``SVI.run`` closes over the model's arguments: the quadratic score reads
    the support's size from them when the program is compiled."""
    kx, kw, kn, ky = random.split(rng_key, 4)
    x = random.normal(kx, (n, d))
    logits = x @ random.normal(kw, (d,)) / jnp.sqrt(d)
    counts = random.randint(kn, (n,), 1, BINOMIAL_TRIALS + 1).astype(jnp.float32)
    y = random.binomial(ky, counts, jax.nn.sigmoid(logits))

    def binomial_counts_model(x: jax.Array, y: jax.Array) -> None:
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([d]).to_event(1))
        b = numpyro.sample("b", dist.Normal(0.0, 1.0))
        with numpyro.plate("data", x.shape[0]):
            numpyro.sample("y", dist.Binomial(counts, logits=x @ w + b), obs=y)

    return binomial_counts_model, (x, y.astype(jnp.float32))


EXAMPLE_HIDDEN = 5


def bnn_example_model(x: jax.Array, y: jax.Array) -> None:
    """NumPyro's ``examples/bnn.py``: two tanh layers of 5 units, unit normal
    weights, a Gamma prior on the observation precision, ``(N, 1)``
    observations with ``to_event(1)``."""
    h = EXAMPLE_HIDDEN
    w1 = numpyro.sample("w1", dist.Normal(jnp.zeros((x.shape[1], h)), 1.0))
    z1 = jnp.tanh(x @ w1)
    w2 = numpyro.sample("w2", dist.Normal(jnp.zeros((h, h)), 1.0))
    z2 = jnp.tanh(z1 @ w2)
    w3 = numpyro.sample("w3", dist.Normal(jnp.zeros((h, 1)), 1.0))
    prec_obs = numpyro.sample("prec_obs", dist.Gamma(3.0, 1.0))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample(
            "Y", dist.Normal(z2 @ w3, 1.0 / jnp.sqrt(prec_obs)).to_event(1), obs=y
        )


def make_bnn_example(rng_key: jax.Array, n: int = 100):
    """The example's data: a noisy cubic of 3 inputs (a bias column)."""
    x = jnp.linspace(-1.0, 1.0, n)
    features = jnp.power(x[:, None], jnp.arange(3.0))
    w = 0.5 * random.normal(rng_key, (3,))
    y = features @ w + 0.5 * jnp.power(0.5 + x, 2.0) * jnp.sin(4.0 * x)
    return bnn_example_model, (features, ((y - y.mean()) / y.std())[:, None])


#: Benchmark problems.
MODELS: dict[str, BenchModel] = {
    "glm": BenchModel(
        "glm", "linear regression, N=10000, D=20 (cheap likelihood)", make_glm
    ),
    "mixture_regression": BenchModel(
        "mixture_regression",
        "regression with a 2-component Normal mixture likelihood, N=10000, D=20 "
        "(MixtureSameFamily)",
        make_mixture_regression,
    ),
    "poisson": BenchModel(
        "poisson", "Poisson regression, N=10000, D=20 (log link)", make_poisson
    ),
    "negative_binomial": BenchModel(
        "negative_binomial",
        "negative-binomial regression, N=10000, D=20 (latent concentration)",
        make_negative_binomial,
    ),
    "zero_inflated": BenchModel(
        "zero_inflated",
        "zero-inflated Poisson regression, N=5000, D=8 (gate and rate regressed)",
        make_zero_inflated,
    ),
    "student": BenchModel(
        "student",
        "robust regression, N=5000, D=12, Student-t likelihood (simulations "
        "from a Gamma mixing variable)",
        make_student,
    ),
    "student_df": BenchModel(
        "student_df",
        "robust regression, N=5000, D=12, Student-t likelihood with latent "
        "degrees of freedom (their derivative in the simulations)",
        partial(make_student, df=None),
    ),
    "volatility": BenchModel(
        "volatility",
        "NumPyro's stochastic volatility example, 2000 returns, no plate "
        "(Student-t, latent degrees of freedom, a latent vector)",
        make_volatility,
    ),
    "gamma": BenchModel(
        "gamma",
        "Gamma regression, N=5000, D=8, latent shape (its draws' implicit gradient)",
        make_gamma,
    ),
    "beta": BenchModel(
        "beta",
        "Beta regression, N=5000, D=8, latent precision (two Gamma draws "
        "per simulation)",
        make_beta,
    ),
    "trivariate": BenchModel(
        "trivariate",
        "multivariate regression, N=4000, D=8, 3 outcomes, MultivariateNormal "
        "likelihood (the energy score of vector observations)",
        make_trivariate,
    ),
    "bnn": BenchModel(
        "bnn", f"BNN 20-{BNN_HIDDEN}-1 tanh, N=10000 (likelihood-dominated)", make_bnn
    ),
    "bnn_example": BenchModel(
        "bnn_example",
        f"NumPyro's examples/bnn.py: 3-{EXAMPLE_HIDDEN}-{EXAMPLE_HIDDEN}-1 tanh, "
        "N=100 (per-step overhead)",
        make_bnn_example,
    ),
    "logistic": BenchModel(
        "logistic",
        "logistic regression, N=10000, D=20 (Bernoulli, finite support)",
        make_logistic,
    ),
    "softmax": BenchModel(
        "softmax",
        f"multinomial logistic regression, N=10000, D=20, {SOFTMAX_CLASSES} classes "
        "(Categorical, finite support)",
        make_softmax,
    ),
    "hetero": BenchModel(
        "hetero",
        "hierarchical heteroscedastic regression, N=10000, D=10, 50 groups "
        "(Normal, scale per observation)",
        make_hetero,
    ),
    "binomial": BenchModel(
        "binomial",
        f"binomial regression, N=10000, D=20, {BINOMIAL_TRIALS} trials "
        "(finite support of 11 values)",
        make_binomial,
    ),
    "binomial_40": BenchModel(
        "binomial_40",
        f"binomial regression, N=5000, D=8, {WIDE_TRIALS} trials "
        f"(finite support of {WIDE_TRIALS + 1} values)",
        make_binomial_wide,
    ),
    "binomial_200": BenchModel(
        "binomial_200",
        f"binomial regression, N=2000, D=5, {MANY_TRIALS} trials "
        f"(finite support of {MANY_TRIALS + 1} values)",
        make_binomial_many,
    ),
    "binomial_200_counts": BenchModel(
        "binomial_200_counts",
        f"binomial regression, N=2000, D=5, 20 to {MANY_TRIALS} trials per "
        f"observation (data; {MANY_TRIALS + 1} support values)",
        partial(make_binomial_many, varying=True),
    ),
    "binomial_counts": BenchModel(
        "binomial_counts",
        f"binomial regression, N=10000, D=20, 1 to {BINOMIAL_TRIALS} trials per "
        "observation (data; 11 support values)",
        make_binomial_counts,
    ),
}

#: Guides, by name.
GUIDES: dict[str, Callable] = {
    "AutoNormal": AutoNormal,
    "AutoMultivariateNormal": AutoMultivariateNormal,
    "AutoFlow": AutoFlow,
    "AutoGaussianMixture": AutoGaussianMixture,  # K = 2 components
}

#: Guides with components: their baseline is ``StratifiedELBO`` (``M`` draws
#: per component, as every objective takes with them), not ``Trace_ELBO``.
MIXTURE_GUIDES = frozenset({"AutoGaussianMixture"})
