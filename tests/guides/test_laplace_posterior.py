"""An ``AutoLaplaceApproximation`` in the functions that take a fitted guide:
they read the Laplace approximation it stands for (NumPyro's
``sample_posterior``), not the point mass it runs as while fitted."""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from jax import random
from numpyro.infer import Trace_ELBO
from numpyro.infer.autoguide import AutoLaplaceApproximation
from scipy import stats

from numpyro_pvi import FitRecipe, predictive_score
from numpyro_pvi.diagnostics import psis, to_inference_data
from numpyro_pvi.selection import cross_validate

pytestmark = pytest.mark.py312

# y_i ~ N(mu, 1), mu ~ N(0, 2^2): the posterior is normal, so the Laplace
# approximation at the MAP is the posterior itself
Y = jnp.asarray([1.2, 0.3, -0.4, 2.1, 0.8, 1.5, -0.2, 0.9])
VAR = 1 / (1 / 4 + len(Y))
MEAN = VAR * float(Y.sum())
DRAWS = 4000


def model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


@pytest.fixture
def laplace():
    """A guide never run, with the MAP as its fitted parameter (as when
    parameters are loaded): it sets itself up from the model's arguments."""
    return AutoLaplaceApproximation(model), {"auto_loc": jnp.asarray([MEAN])}


def test_draws_are_the_laplace_approximation(laplace):
    guide, params = laplace
    data = to_inference_data(
        random.PRNGKey(0), params, model, guide, Y, num_draws=DRAWS
    )
    mu = np.asarray(data.posterior["mu"]).reshape(-1)
    assert abs(mu.mean() - MEAN) < 4 * np.sqrt(VAR / DRAWS)
    assert abs(mu.var() / VAR - 1) < 4 * np.sqrt(2 / DRAWS)
    assert data.attrs["guide"].startswith("AutoLaplaceApproximation")
    expected = guide.sample_posterior(random.PRNGKey(1), params, sample_shape=(DRAWS,))
    assert stats.ks_2samp(mu, np.asarray(expected["mu"])).pvalue > 1e-3


def test_psis_and_scores_read_the_approximations_density(laplace):
    guide, params = laplace
    # q is the posterior: constant importance ratios
    result = psis(random.PRNGKey(0), params, model, guide, Y, num_draws=DRAWS)
    assert float(np.asarray(result.psis["pareto_k"])) < 0.3
    # the log score is that of the posterior predictive N(MEAN, 1 + VAR)
    score = predictive_score(
        random.PRNGKey(2), params, model, guide, Y, num_draws=DRAWS
    )
    exact = stats.norm(MEAN, np.sqrt(1 + VAR)).logpdf(np.asarray(Y))
    np.testing.assert_allclose(score.score, exact, atol=4 * float(np.max(score.se)))


def test_cross_validation_says_its_laplace_fits_are_scored_at_their_map(laplace):
    guide, _ = laplace
    fit = FitRecipe(num_steps=20, num_draws=20, progress_bar=False)
    with pytest.warns(UserWarning, match="plug-in predictive, not of a Laplace"):
        cross_validate(
            random.PRNGKey(0),
            model,
            guide,
            optax.adam(0.05),
            Y,
            fit=fit,
            candidates=[Trace_ELBO()],
            num_folds=2,
        )
