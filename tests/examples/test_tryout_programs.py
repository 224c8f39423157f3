"""NumPyro programs as a new user writes them (the tryout of the third
audit), each where it found a path that failed: every refusal's remedy is
accepted by the function that names it, a forecast argument, a
deterministic site, a marginalised mixture, a binary image.

Models are NumPyro's examples as written (commit 0b935d48), with simulated
data of the same shapes.
"""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from jax import lax, random
from jax.scipy.special import logsumexp
from numpyro.contrib.control_flow import scan
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal

from numpyro_pvi import PredictiveELBO, diagnostics, predictive_score
from numpyro_pvi.particles import WHOLE_DATA

# -- examples/hmm.py: observed sites of different lengths, no plate ---------


def forward_one_step(prev_log_prob, curr_word, transition_log_prob, emission_log_prob):
    log_prob_tmp = jnp.expand_dims(prev_log_prob, axis=1) + transition_log_prob
    log_prob = log_prob_tmp + emission_log_prob[:, curr_word]
    return logsumexp(log_prob, axis=0)


def forward_log_prob(init_log_prob, words, transition_log_prob, emission_log_prob):
    def scan_fn(log_prob, word):
        return (
            forward_one_step(log_prob, word, transition_log_prob, emission_log_prob),
            None,
        )

    log_prob, _ = lax.scan(scan_fn, init_log_prob, words)
    return log_prob


def semi_supervised_hmm(
    transition_prior,
    emission_prior,
    supervised_categories,
    supervised_words,
    unsupervised_words,
):
    num_categories, num_words = transition_prior.shape[0], emission_prior.shape[0]
    transition_prob = numpyro.sample(
        "transition_prob",
        dist.Dirichlet(
            jnp.broadcast_to(transition_prior, (num_categories, num_categories))
        ),
    )
    emission_prob = numpyro.sample(
        "emission_prob",
        dist.Dirichlet(jnp.broadcast_to(emission_prior, (num_categories, num_words))),
    )
    numpyro.sample(
        "supervised_categories",
        dist.Categorical(transition_prob[supervised_categories[:-1]]),
        obs=supervised_categories[1:],
    )
    numpyro.sample(
        "supervised_words",
        dist.Categorical(emission_prob[supervised_categories]),
        obs=supervised_words,
    )
    transition_log_prob = jnp.log(transition_prob)
    emission_log_prob = jnp.log(emission_prob)
    init_log_prob = emission_log_prob[:, unsupervised_words[0]]
    log_prob = forward_log_prob(
        init_log_prob, unsupervised_words[1:], transition_log_prob, emission_log_prob
    )
    log_prob = logsumexp(log_prob, axis=0, keepdims=True)
    numpyro.factor("forward_log_prob", log_prob)


def _hmm_data():
    rng = np.random.default_rng(0)
    return (
        jnp.ones(3),
        jnp.repeat(0.1, 10),
        jnp.asarray(rng.integers(0, 3, 30)),
        jnp.asarray(rng.integers(0, 10, 30)),
        jnp.asarray(rng.integers(0, 10, 40)),
    )


#: The functions on a fitted guide whose refusals may name data_plate=.
FITTED = {
    "predictive_score": predictive_score,
    "psis_resample": diagnostics.psis_resample,
    "to_inference_data": diagnostics.to_inference_data,
    "report": diagnostics.report,
}


@pytest.mark.parametrize("name", list(FITTED))
def test_every_refusal_names_a_remedy_its_function_takes(name):
    """The semi-supervised HMM observes 29 categories and 30 words in no
    plate: no batch dimension indexes both, and the refusal names
    data_plate=, which the function naming it accepts (psis_resample did
    not: the keyword went to the model); with it, the function runs."""
    function = FITTED[name]
    args = _hmm_data()
    guide = AutoNormal(semi_supervised_hmm)
    svi = SVI(semi_supervised_hmm, guide, optax.adam(0.01), Trace_ELBO())
    params = svi.run(random.PRNGKey(0), 10, *args, progress_bar=False).params
    options = {"num_draws": 100} if name != "predictive_score" else {}
    if name == "report":
        options["show"] = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        try:
            function(
                random.PRNGKey(1), params, semi_supervised_hmm, guide, *args, **options
            )
        except ValueError as err:
            remedies = set(re.findall(r"pass (\w+)=", str(err)))
            assert remedies, str(err)
            import inspect

            assert remedies <= set(inspect.signature(function).parameters), (
                remedies,
                str(err),
            )
            assert "data_plate" in remedies
        function(
            random.PRNGKey(1),
            params,
            semi_supervised_hmm,
            guide,
            *args,
            data_plate=WHOLE_DATA,
            **options,
        )


# -- examples/holt_winters.py: a forecast argument --------------------------


def holt_winters(y, n_seasons, future=0):
    T = y.shape[0]
    level_smoothing = numpyro.sample("level_smoothing", dist.Beta(1, 1))
    trend_smoothing = numpyro.sample("trend_smoothing", dist.Beta(1, 1))
    seasonality_smoothing = numpyro.sample("seasonality_smoothing", dist.Beta(1, 1))
    adj_seasonality_smoothing = seasonality_smoothing * (1 - level_smoothing)
    noise = numpyro.sample("noise", dist.HalfNormal(1))
    level_init = numpyro.sample("level_init", dist.Normal(0, 1))
    trend_init = numpyro.sample("trend_init", dist.Normal(0, 1))
    with numpyro.plate("n_seasons", n_seasons):
        seasonality_init = numpyro.sample("seasonality_init", dist.Normal(0, 1))

    def transition_fn(carry, t):
        previous_level, previous_trend, previous_seasonality = carry
        level = jnp.where(
            t < T,
            level_smoothing * (y[t] - previous_seasonality[0])
            + (1 - level_smoothing) * (previous_level + previous_trend),
            previous_level,
        )
        trend = jnp.where(
            t < T,
            trend_smoothing * (level - previous_level)
            + (1 - trend_smoothing) * previous_trend,
            previous_trend,
        )
        new_season = jnp.where(
            t < T,
            adj_seasonality_smoothing * (y[t] - (previous_level + previous_trend))
            + (1 - adj_seasonality_smoothing) * previous_seasonality[0],
            previous_seasonality[0],
        )
        step = jnp.where(t < T, 1, t - T + 1)
        mu = previous_level + step * previous_trend + previous_seasonality[0]
        pred = numpyro.sample("pred", dist.Normal(mu, noise))

        seasonality = jnp.concatenate(
            [previous_seasonality[1:], new_season[None]], axis=0
        )
        return (level, trend, seasonality), pred

    with numpyro.handlers.condition(data={"pred": y}):
        _, preds = scan(
            transition_fn,
            (level_init, trend_init, seasonality_init),
            jnp.arange(T + future),
        )

    if future > 0:
        numpyro.deterministic("y_forecast", preds[-future:])


def test_a_forecast_argument_scores_the_data_and_leaves_the_forecast_out():
    """future=10 runs the scan 10 steps past the data: those steps' values
    are drawn (imputed), not observed. The data score as without them; the
    forecast entries are no observation (the probe raised a KeyError on
    the scan's control-flow message)."""
    t = np.arange(36)
    y = jnp.asarray(
        np.sin(2 * np.pi * t / 12) + 0.1 * np.random.default_rng(0).normal(size=36)
    )
    guide = AutoNormal(holt_winters)
    svi = SVI(holt_winters, guide, optax.adam(0.02), Trace_ELBO())
    params = svi.run(random.PRNGKey(0), 100, y, 12, progress_bar=False).params
    plain = predictive_score(random.PRNGKey(1), params, holt_winters, guide, y, 12)
    forecast = predictive_score(
        random.PRNGKey(1), params, holt_winters, guide, y, 12, future=10
    )
    assert forecast.shape == (46,)
    assert not forecast.observed[36:].any() and np.all(forecast[36:] == 0)
    np.testing.assert_allclose(forecast[:36], plain, rtol=1e-5, atol=1e-5)


# -- examples/horseshoe_regression.py: a deterministic site -----------------


def model_normal_likelihood(X, Y):
    D_X = X.shape[1]
    lambdas = numpyro.sample("lambdas", dist.HalfCauchy(jnp.ones(D_X)))
    tau = numpyro.sample("tau", dist.HalfCauchy(jnp.ones(1)))
    unscaled_betas = numpyro.sample("unscaled_betas", dist.Normal(0.0, jnp.ones(D_X)))
    scaled_betas = numpyro.deterministic("betas", tau * lambdas * unscaled_betas)
    mean_function = jnp.dot(X, scaled_betas)
    prec_obs = numpyro.sample("prec_obs", dist.Gamma(3.0, 1.0))
    sigma_obs = 1.0 / jnp.sqrt(prec_obs)
    numpyro.sample("Y", dist.Normal(mean_function, sigma_obs), obs=Y)


def _horseshoe():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((50, 4))
    Y = X @ np.array([1.0, -0.5, 0.0, 0.0]) + 0.05 * rng.standard_normal(50)
    return jnp.asarray(X), jnp.asarray(Y)


@pytest.mark.py312
def test_deterministic_sites_are_exported_as_predictive_returns_them():
    """The horseshoe's betas = tau * lambdas * unscaled_betas, in the
    posterior group at every draw (to_inference_data dropped it), and in
    report's; heterogeneity runs on the fits."""
    X, Y = _horseshoe()
    fits = {}
    for label, loss in (("vi", Trace_ELBO()), ("pvi", PredictiveELBO("log"))):
        guide = AutoNormal(model_normal_likelihood)
        svi = SVI(model_normal_likelihood, guide, optax.adam(0.02), loss)
        fits[label] = (
            guide,
            svi.run(random.PRNGKey(0), 200, X, Y, progress_bar=False).params,
        )
    guide, params = fits["vi"]
    data = diagnostics.to_inference_data(
        random.PRNGKey(1), params, model_normal_likelihood, guide, X, Y, num_draws=100
    )
    post = diagnostics.get_group(data, "posterior")
    expected = np.asarray(post["tau"]) * np.asarray(post["lambdas"])
    expected = expected * np.asarray(post["unscaled_betas"])
    np.testing.assert_allclose(np.asarray(post["betas"]), expected, rtol=1e-5)
    assert "betas" not in diagnostics.get_group(data, "posterior_predictive")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        result = diagnostics.report(
            random.PRNGKey(1), params, model_normal_likelihood, guide, X, Y, show=False
        )
        assert "betas" in diagnostics.get_group(result, "posterior")
        diagnostics.heterogeneity(
            random.PRNGKey(2),
            fits["pvi"][1],
            model_normal_likelihood,
            fits["pvi"][0],
            X,
            Y,
            reference_params=params,
            reference_guide=guide,
            num_draws=200,
        )


def _residual_model(x, y):
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", x.shape[0]):
        obs = numpyro.sample("y", dist.Normal(b * x, 1.0), obs=y)
        numpyro.deterministic("residual", obs - b * x)


def test_a_deterministic_site_of_the_data_joins_the_posterior_predictive():
    """A deterministic site computed from the observations: its observed
    values in the posterior group, its values at the simulated data in
    posterior_predictive (as Predictive returns it)."""
    x = jnp.linspace(-1, 1, 8)
    y = 2.0 * x
    guide = AutoNormal(_residual_model)
    params = (
        SVI(_residual_model, guide, optax.adam(0.05), Trace_ELBO())
        .run(random.PRNGKey(0), 50, x, y, progress_bar=False)
        .params
    )
    data = diagnostics.to_inference_data(
        random.PRNGKey(1), params, _residual_model, guide, x, y, num_draws=50
    )
    post = diagnostics.get_group(data, "posterior")
    np.testing.assert_allclose(
        np.asarray(post["residual"])[0],
        np.asarray(y)[None] - np.asarray(post["b"])[0][:, None] * np.asarray(x),
        rtol=1e-5,
        atol=1e-6,
    )
    pp = diagnostics.get_group(data, "posterior_predictive")
    np.testing.assert_allclose(
        np.asarray(pp["residual"])[0],
        np.asarray(pp["y"])[0] - np.asarray(post["b"])[0][:, None] * np.asarray(x),
        rtol=1e-5,
        atol=1e-5,
    )


# -- examples/toy_mixture_model_discrete_enumeration.py, its enumerated site
#    summed out by hand: a refusal blames the site that causes it -----------


def _toy_guide(obs):
    a = numpyro.param("a", jnp.array([1.0, 10.0]), constraint=dist.constraints.positive)
    numpyro.sample("p_A", dist.Beta(a[0], a[1]))
    b = numpyro.param("b", jnp.ones((2, 2)), constraint=dist.constraints.positive)
    numpyro.sample("p_B", dist.Beta(b[:, 0], b[:, 1]).to_event(1))
    c = numpyro.param("c", jnp.ones((2, 2)), constraint=dist.constraints.positive)
    numpyro.sample("p_C", dist.Beta(c[:, 0], c[:, 1]).to_event(1))


def _toy_model(obs):
    p_A = numpyro.sample("p_A", dist.Beta(1, 1))
    p_B = numpyro.sample("p_B", dist.Beta(jnp.ones(2), jnp.ones(2)).to_event(1))
    p_C = numpyro.sample("p_C", dist.Beta(jnp.ones(2), jnp.ones(2)).to_event(1))
    n = obs["A"].shape[0]
    with numpyro.plate("data_plate", n):
        A = numpyro.sample("A", dist.Bernoulli(p_A), obs=obs["A"])
        p_b = p_B[A.astype(int)]
        mixing = dist.Categorical(probs=jnp.stack([1 - p_b, p_b], -1))
        components = dist.Bernoulli(probs=jnp.broadcast_to(p_C, (n, 2)))
        numpyro.sample("C", dist.MixtureSameFamily(mixing, components), obs=obs["C"])


@pytest.mark.parametrize("score", ["crps", "energy", "quadratic"])
def test_a_refusal_blames_the_site_no_estimator_takes(score):
    """A's Bernoulli has a pmf; C's mixture of Bernoullis has neither a pmf
    nor a reparameterised sampler: every refusal names C (the CRPS's named
    A), and advises the log score, which works."""
    obs = {"A": jnp.array([1.0, 0, 1, 1]), "C": jnp.array([1.0, 1, 0, 1])}
    svi = SVI(_toy_model, _toy_guide, optax.adam(0.01), PredictiveELBO(score))
    with pytest.raises(ValueError, match=r"^Observed site 'C'.*Use score='log'"):
        svi.run(random.PRNGKey(0), 2, obs, progress_bar=False)
    svi = SVI(_toy_model, _toy_guide, optax.adam(0.01), PredictiveELBO("log"))
    assert np.isfinite(
        svi.run(random.PRNGKey(0), 2, obs, progress_bar=False).losses
    ).all()


# -- a binary image (examples/vae.py's likelihood) -------------------------


def _image_model(images):
    logits = numpyro.sample("logits", dist.Normal(0.0, 1.0).expand([64]).to_event(1))
    with numpyro.plate("batch", images.shape[0]):
        numpyro.sample("obs", dist.Bernoulli(logits=logits).to_event(1), obs=images)


def test_scores_of_a_binary_image_advise_and_warn_where_they_inform_nothing():
    """An observation of 64 binary values: its quadratic score is a product of
    64 probabilities, nearly zero under every draw, and informs no fit (a
    VAE's loss fell to the KL term alone): the score warns, and refusals do
    not advise it; the energy score's refusal speaks of its own needs, not
    of the CRPS from the pmf."""
    images = jnp.asarray(np.random.default_rng(0).integers(0, 2, (10, 64)), float)
    guide = AutoNormal(_image_model)
    params = (
        SVI(_image_model, guide, optax.adam(0.01), Trace_ELBO())
        .run(random.PRNGKey(0), 5, images, progress_bar=False)
        .params
    )
    with pytest.warns(UserWarning, match="64 values.*score='log'"):
        predictive_score(
            random.PRNGKey(1), params, _image_model, guide, images, score="quadratic"
        )
    with pytest.raises(ValueError) as refusal:  # the CRPS: one value only
        predictive_score(
            random.PRNGKey(1), params, _image_model, guide, images, score="crps"
        )
    assert "'quadratic'" not in str(refusal.value), str(refusal.value)
    assert "score='log'" in str(refusal.value), str(refusal.value)
    # the energy score of held-out images, from simulations (no gradient)
    energy = predictive_score(
        random.PRNGKey(1), params, _image_model, guide, images, score="energy"
    )
    assert np.all(np.isfinite(energy))
    # fitting it differentiates simulations, which binary values have not
    svi = SVI(_image_model, guide, optax.adam(0.01), PredictiveELBO("energy"))
    with pytest.raises(ValueError) as refusal:
        svi.run(random.PRNGKey(0), 2, images, progress_bar=False)
    message = str(refusal.value)
    assert "'obs'" in message and "Use score='log'" in message, message
    assert "'quadratic'" not in message and "CRPS from the pmf" not in message


def _count_model(n, y):
    p = numpyro.sample("p", dist.Beta(1.0, 1.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Binomial(n, p), obs=y)


def test_a_traced_total_count_is_refused_naming_it():
    """A user's jit over a step with the counts as an argument: the scores
    from the pmf need the support's size when compiling, and say so."""
    n, y = jnp.array([5, 6, 7]), jnp.array([2.0, 3, 4])
    guide = AutoNormal(_count_model)
    svi = SVI(_count_model, guide, optax.adam(0.01), PredictiveELBO("quadratic"))
    state = svi.init(random.PRNGKey(0), n, y)
    with pytest.raises(ValueError, match="total_count is a traced value.*score='log'"):
        jax.jit(svi.update)(state, n, y)
    # closed over, as SVI.run does, it works
    assert np.isfinite(float(svi.update(state, n, y)[1]))
