"""Test helpers of the scores' tests: particle terms with i.i.d. or
stratified weights, an autoguide's initial parameters, a short
cross-validation of a CRPS and a log-score PVI candidate scored by the CRPS
(finite held-out scores and stacking's pair gains), and NumPyro's
Gaussian-process example model (also read by the diagnostics' tests)."""

import math

import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
import optax
from jax import random
from numpyro.infer import SVI
from numpyro.infer.autoguide import AutoNormal

from numpyro_pvi import FitRecipe, PredictiveELBO
from numpyro_pvi.particles import ParticleTerms, Weights
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
