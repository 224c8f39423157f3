"""Test helpers of the scores' tests: particle terms with i.i.d. or
stratified weights, an autoguide's initial parameters, a short
cross-validation of a CRPS and a log-score PVI candidate scored by the CRPS
(finite held-out scores and stacking's pair gains), and NumPyro's
Gaussian-process example model (also read by the diagnostics' tests)."""

import math

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
import optax
from jax import random
from numpyro.infer import SVI
from numpyro.infer.autoguide import AutoNormal

from numpyro_pvi import FitRecipe, PredictiveELBO
from numpyro_pvi._trace.data_plate import DataPlate
from numpyro_pvi.particles import Likelihood, ParticleTerms, Weights
from numpyro_pvi.scores import CRPS, Score
from numpyro_pvi.selection import CrossValidation, cross_validate


def weighted_terms(km, b, num_strata=1, omega=None, **fields) -> ParticleTerms:
    """Terms with weights ``1/(K M)``, or with ``omega`` the ``(K, b)``
    strata weights (``v_j = ω_k / M``), and the score's ``fields``."""
    if omega is None:
        log_predictive = jnp.full((km, b), -math.log(km))
    else:
        m = km // num_strata
        log_predictive = jnp.repeat(jnp.log(omega / m), m, axis=0)
    return ParticleTerms(
        log_prior=jnp.zeros(km),
        log_q=jnp.zeros(km),
        weights=Weights(
            particle=jnp.full((km,), 1.0 / km),
            log_predictive=log_predictive,
            observation=jnp.ones(b),
        ),
        num_strata=num_strata,
        **fields,
    )


def likelihood(law, *params, values, reparam=True, key=None) -> Likelihood:
    """The :class:`Likelihood` of one observed site of ``b`` observations
    whose distribution at particle ``j`` is ``law(*(p[j] for p in
    params))`` (each ``p`` with a leading particle axis), observing
    ``values`` (``(b, ...)``)."""
    laws = jax.vmap(law)(*params)
    first = law(*(p[0] for p in params))
    km, b = params[0].shape[0], values.shape[0]
    keys = random.split(random.PRNGKey(0) if key is None else key, km)
    plate = DataPlate("data", -1, b, b)
    return Likelihood((laws,), (first,), (values,), keys, None, plate, ("y",), reparam)


def law_terms(law, *params, y_obs, num_strata=1, omega=None, **options):
    """:func:`weighted_terms` of ``M`` particles whose likelihood at one
    observed site is ``law`` (:func:`likelihood`), observing ``y_obs``
    ``(b, d)``, with its log-likelihoods ``(M, b)``."""
    values = y_obs[:, 0] if y_obs.shape[1] == 1 else y_obs
    site_lik = likelihood(law, *params, values=values, **options)
    log_lik = jax.vmap(lambda d: d.log_prob(values))(site_lik.laws[0])
    log_lik = log_lik.reshape(log_lik.shape[:2] + (-1,)).sum(-1)
    km, b = params[0].shape[0], y_obs.shape[0]
    return weighted_terms(
        km, b, num_strata, omega, y_obs=y_obs, likelihood=site_lik, log_lik=log_lik
    )


def simulated_terms(x, y_obs, num_strata=1, omega=None) -> ParticleTerms:
    """:func:`weighted_terms` of ``M`` particles that simulate ``x``
    ``(M, b, d)`` (:func:`with_simulations`), observing ``y_obs``."""
    terms = weighted_terms(*x.shape[:2], num_strata, omega, y_obs=y_obs)
    return with_simulations(terms, x)


def with_simulations(terms, x) -> ParticleTerms:
    """``terms`` whose observed site simulates ``x`` ``(M, b, d)``: point
    masses at the simulations (what the estimators from simulations read)."""
    d = x.shape[-1]
    if d == 1:
        site_lik = likelihood(dist.Delta, x[..., 0], values=terms.y_obs[:, 0])
    else:
        site_lik = likelihood(
            lambda v: dist.Delta(v, event_dim=1), x, values=terms.y_obs
        )
    return terms._replace(likelihood=site_lik)


def initial_params(model, *args) -> tuple[AutoNormal, dict]:
    """An ``AutoNormal`` of ``model`` and its initial parameters."""
    guide = AutoNormal(model)
    svi = SVI(model, guide, optax.sgd(0.0), loss=PredictiveELBO("crps"))
    return guide, svi.get_params(svi.init(random.PRNGKey(8), *args))


def crps_against_log(
    seed: int,
    model,
    *args,
    score: Score | None = None,
    num_folds: int = 3,
    learning_rate: float = 1e-2,
) -> CrossValidation:
    """50 steps of each candidate (4 particles) per fold, 200 draws to score."""
    score = CRPS() if score is None else score
    return cross_validate(
        random.PRNGKey(seed),
        model,
        AutoNormal(model),
        optax.adam(learning_rate),
        *args,
        fit=FitRecipe(num_steps=50, num_draws=200, progress_bar=False),
        candidates={
            "crps": PredictiveELBO(score, num_particles=4),
            "log": PredictiveELBO("log", num_particles=4),
        },
        num_folds=num_folds,
        score=score,
        rule="best",
    )


def gp_model(X, Y):
    """NumPyro's examples/gp.py (model; kernel inlined): one observation,
    a MultivariateNormal of the whole series, under ``LogNormal(0, 10)``
    priors on the kernel's hyperparameters."""
    var = numpyro.sample("kernel_var", dist.LogNormal(0.0, 10.0))
    noise = numpyro.sample("kernel_noise", dist.LogNormal(0.0, 10.0))
    length = numpyro.sample("kernel_length", dist.LogNormal(0.0, 10.0))
    k = var * jnp.exp(-0.5 * jnp.power((X[:, None] - X) / length, 2.0))
    k += (noise + 1.0e-6) * jnp.eye(X.shape[0])
    numpyro.sample(
        "Y",
        dist.MultivariateNormal(loc=jnp.zeros(X.shape[0]), covariance_matrix=k),
        obs=Y,
    )
