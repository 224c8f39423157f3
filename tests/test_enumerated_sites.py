"""Discrete sites marked for enumeration (``infer={"enumerate": ...}``,
``config_enumerate``), as in NumPyro's Gaussian-mixture notebook and its toy
mixture example: ``TraceEnum_ELBO`` sums them out of the joint density.
Replayed without enumeration, a site the guide does not draw is drawn from
its prior and the observations are scored at that one value, so every
objective and diagnostic refuses it, naming the site; the remedy it names
(the mixture written in the model) is scored exactly."""

import warnings

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from jax import random
from jax.scipy.special import logsumexp
from numpyro.distributions.transforms import biject_to
from numpyro.handlers import block
from numpyro.infer import SVI
from numpyro.infer.autoguide import AutoNormal

from numpyro_pvi import (
    PACmELBO,
    PredictiveELBO,
    SNISForwardKL,
    SoftCVIELBO,
    StratifiedELBO,
    diagnostics,
    predictive_score,
)

pytestmark = pytest.mark.py312

K = 2
DATA = jnp.array([0.0, 1.0, 10.0, 11.0, 12.0] * 4)


def enumerated(data, enumerate="parallel"):
    weights = numpyro.sample("weights", dist.Dirichlet(0.5 * jnp.ones(K)))
    scale = numpyro.sample("scale", dist.LogNormal(0.0, 2.0))
    with numpyro.plate("components", K):
        locs = numpyro.sample("locs", dist.Normal(0.0, 10.0))
    with numpyro.plate("data", len(data)):
        assignment = numpyro.sample(
            "assignment", dist.Categorical(weights), infer={"enumerate": enumerate}
        )
        numpyro.sample("obs", dist.Normal(locs[assignment], scale), obs=data)


def summed_out(data):
    weights = numpyro.sample("weights", dist.Dirichlet(0.5 * jnp.ones(K)))
    scale = numpyro.sample("scale", dist.LogNormal(0.0, 2.0))
    with numpyro.plate("components", K):
        locs = numpyro.sample("locs", dist.Normal(0.0, 10.0))
    with numpyro.plate("data", len(data)):
        mixture = dist.MixtureSameFamily(
            dist.Categorical(weights), dist.Normal(locs, scale)
        )
        numpyro.sample("obs", mixture, obs=data)


def global_guide(model):
    return AutoNormal(block(model, hide=["assignment"]))


OBJECTIVES = {
    "PredictiveELBO-log": lambda: PredictiveELBO("log", num_particles=2),
    "PredictiveELBO-crps": lambda: PredictiveELBO("crps", num_particles=2),
    "PACmELBO": lambda: PACmELBO(num_particles=2),
    "SoftCVIELBO": lambda: SoftCVIELBO(num_particles=2),
    "SNISForwardKL": lambda: SNISForwardKL(num_particles=2),
    "StratifiedELBO": lambda: StratifiedELBO(num_particles=2),
}


@pytest.mark.parametrize("enumerate", ["parallel", "sequential"])
@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_objectives_refuse_an_enumerated_site_the_guide_does_not_draw(name, enumerate):
    model = lambda data: enumerated(data, enumerate)  # noqa: E731
    svi = SVI(model, global_guide(model), optax.adam(0.01), OBJECTIVES[name]())
    with warnings.catch_warnings():  # NumPyro's SVI.init: "discrete latent"
        warnings.simplefilter("ignore")
        state = svi.init(random.PRNGKey(0), DATA)
    with pytest.raises(ValueError, match=r"site 'assignment' is marked for enum") as e:
        svi.update(state, DATA)
    assert "MixtureSameFamily" in str(e.value)
    assert "TraceEnum_ELBO" in str(e.value)


def remedy_params(scale=0.1):
    """Parameters of ``AutoNormal`` over the global sites (the same sites for
    the enumerated model's guide and the remedy's)."""
    return {
        "weights_auto_loc": jnp.array([0.3]),
        "weights_auto_scale": jnp.array([scale]),
        "scale_auto_loc": jnp.array(0.2),
        "scale_auto_scale": jnp.array(scale),
        "locs_auto_loc": jnp.array([0.5, 11.0]),
        "locs_auto_scale": jnp.full(K, scale),
    }


DIAGNOSTICS = {
    "predictive_score": lambda k, p, m, g: predictive_score(k, p, m, g, DATA),
    "psis": lambda k, p, m, g: diagnostics.psis(k, p, m, g, DATA, num_draws=100),
    "to_inference_data": lambda k, p, m, g: diagnostics.to_inference_data(
        k, p, m, g, DATA, num_draws=100
    ),
    "report": lambda k, p, m, g: diagnostics.report(
        k, p, m, g, DATA, num_draws=100, show=False
    ),
}


@pytest.mark.parametrize("name", sorted(DIAGNOSTICS))
def test_diagnostics_refuse_it_and_take_the_remedy(name):
    key, params = random.PRNGKey(0), remedy_params()
    with pytest.raises(ValueError, match=f"{name}: the model's discrete site 'assi"):
        DIAGNOSTICS[name](key, params, enumerated, global_guide(enumerated))
    DIAGNOSTICS[name](key, params, summed_out, AutoNormal(summed_out))


def test_the_remedy_scores_the_mixture_summed_over_its_components():
    """Known answer: a guide of negligible spread puts the predictive at the
    mixture of its locations, whose log density is summed over the two
    components by hand."""
    params = remedy_params(scale=1e-6)
    out = predictive_score(
        random.PRNGKey(1), params, summed_out, AutoNormal(summed_out), DATA
    )
    weights = biject_to(dist.Dirichlet(jnp.ones(K)).support)(params["weights_auto_loc"])
    locs, scale = params["locs_auto_loc"], jnp.exp(params["scale_auto_loc"])
    by_hand = logsumexp(
        jnp.log(weights) + dist.Normal(locs, scale).log_prob(DATA[:, None]), axis=-1
    )
    np.testing.assert_allclose(out.score, by_hand, rtol=1e-4)
    by_assignment = dist.Normal(locs[0], scale).log_prob(DATA)
    assert np.abs(np.asarray(out.score - by_assignment)).max() > 1.0


def test_a_site_the_guide_draws_is_the_guide_s():
    """Marked for enumeration but drawn by the guide (a Categorical guide
    site): an ordinary latent, fitted by the objectives that take discrete
    guides."""

    def guide(data):
        logits = numpyro.param("logits", jnp.zeros((len(data), K)))
        numpyro.sample("weights", dist.Dirichlet(jnp.ones(K)))
        numpyro.sample("scale", dist.LogNormal(0.0, 1.0))
        with numpyro.plate("components", K):
            numpyro.sample("locs", dist.Normal(jnp.array([0.5, 11.0]), 1.0))
        with numpyro.plate("data", len(data)):
            numpyro.sample("assignment", dist.Categorical(logits=logits))

    svi = SVI(enumerated, guide, optax.adam(0.05), SoftCVIELBO(num_particles=4))
    result = svi.run(random.PRNGKey(0), 20, DATA, progress_bar=False)
    assert np.isfinite(result.losses).all()
