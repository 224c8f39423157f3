"""Masks (``handlers.mask``, ``Distribution.mask``, ``obs_mask=``) are
honoured as NumPyro's density honours them: by every score, objective and
diagnostic.

Known answers: a masked outlier leaves the mean loss and gradient of every
estimator at the exact score of the kept data (tolerances from the Monte
Carlo standard error over keys); a masked observation or component gives
exactly the loss of the model without it at the same key, for the scores
that are deterministic given the particles.
"""

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from jax import random
from numpyro import handlers
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoDiagonalNormal, AutoNormal
from scipy.stats import norm

from numpyro_pvi import (
    FitRecipe,
    PACmELBO,
    PredictiveELBO,
    Replications,
    SNISForwardKL,
    SoftCVIELBO,
    StratifiedELBO,
    diagnostics,
    predictive_score,
)
from numpyro_pvi.guides import AutoGaussianMixture
from numpyro_pvi.scores import CRPS, EnergyScore
from numpyro_pvi.selection import cross_validate

Y = jnp.array([0.3, -1.0, 8.0, 0.5])
KEEP = jnp.array([True, True, False, True])
PARAMS = {"m": jnp.array(0.2), "s": jnp.array(0.7)}


def masked_model(y, keep):
    theta = numpyro.sample("theta", dist.Normal(0.0, 10.0))
    with numpyro.plate("n", y.shape[0]), handlers.mask(mask=keep):
        numpyro.sample("y", dist.Normal(theta, 1), obs=y)  # an integer scale


def plain_model(y, keep=None):
    theta = numpyro.sample("theta", dist.Normal(0.0, 10.0))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Normal(theta, 1.0), obs=y)


def guide(y, keep=None):
    loc, scale = numpyro.param("m", 0.2), numpyro.param("s", 0.7)
    numpyro.sample("theta", dist.Normal(loc, scale))


def _crps_normal(y, loc, scale):
    z = (y - loc) / scale
    return scale * (
        z * (2 * norm.cdf(z) - 1) + 2 * norm.pdf(z) - 1 / math.sqrt(math.pi)
    )


def _exact_crps_loss_and_grad(y):
    """Σ CRPS(N(m, 1 + s²), y_i) and its derivative in m (the loss of
    PredictiveELBO(crps, regularizer=None) in expectation)."""
    scale = math.sqrt(1 + 0.7**2)
    loss = np.sum(_crps_normal(y, 0.2, scale))
    grad = np.sum(1 - 2 * norm.cdf((y - 0.2) / scale))
    return loss, grad


def _label(loss):
    return (
        repr(loss)
        if type(loss).__module__.startswith("numpyro_pvi")
        else type(loss).__name__
    )


def _loss_and_grad_over_keys(loss, model, args, num_keys):
    f = jax.jit(
        jax.vmap(
            jax.value_and_grad(lambda p, k: loss.loss(k, p, model, guide, *args)),
            (None, 0),
        )
    )
    values, grads = f(PARAMS, random.split(random.PRNGKey(0), num_keys))
    return np.asarray(values), np.asarray(grads["m"])


@pytest.mark.parametrize(
    "score",
    [
        CRPS(estimator="all-pairs"),
        CRPS(estimator="derangement"),
        CRPS(estimator="closed-form"),
        CRPS(),
        EnergyScore(),
        EnergyScore(estimator="derangement"),
    ],
    ids=repr,
)
def test_masked_outlier_leaves_every_estimator_at_the_kept_datas_score(score):
    """The issue's reproduction: with the outlier at 8 masked, mean loss and
    mean d/dm are the exact CRPS of the three kept observations (1.3244,
    +0.4150), not those of all four (8.44, -0.58: the outlier reverses the
    gradient)."""
    loss = PredictiveELBO(score, num_particles=4, regularizer=None)
    values, grads = _loss_and_grad_over_keys(loss, masked_model, (Y, KEEP), 4000)
    exact_loss, exact_grad = _exact_crps_loss_and_grad(np.asarray(Y)[np.asarray(KEEP)])
    all_loss, all_grad = _exact_crps_loss_and_grad(np.asarray(Y))
    assert exact_loss == pytest.approx(1.3244, abs=1e-4)
    assert exact_grad == pytest.approx(0.4149, abs=1e-4)
    se_loss = values.std() / math.sqrt(values.size)
    se_grad = grads.std() / math.sqrt(grads.size)
    assert abs(values.mean() - exact_loss) < 4.5 * se_loss
    assert abs(grads.mean() - exact_grad) < 4.5 * se_grad
    # power: the unmasked answer is many standard errors away
    assert abs(values.mean() - all_loss) > 50 * se_loss
    assert abs(grads.mean() - all_grad) > 20 * se_grad


@pytest.mark.slow
@pytest.mark.parametrize(
    "loss",
    [
        PredictiveELBO("log", num_particles=4),
        PredictiveELBO(CRPS(estimator="closed-form"), num_particles=4),
        PredictiveELBO("crps", num_particles=4, regularizer="posterior", lam=0.5),
        PACmELBO(num_particles=4),
        Trace_ELBO(num_particles=4),
        SoftCVIELBO(num_particles=4),
        SNISForwardKL(num_particles=4, low_variance=True),
        StratifiedELBO(num_particles=4),
    ],
    ids=_label,
)
def test_masked_observation_is_the_model_without_it_at_the_same_key(loss):
    """Scores that are deterministic given the particles (and the objectives
    built on the joint density): loss and gradient equal exactly those of
    the model without the masked observation, also with NaN in its place
    (NumPyro's missing-data convention)."""
    kept = Y[np.asarray(KEEP)]
    with_nan = Y.at[2].set(jnp.nan)

    @jax.jit  # one program for the three evaluations
    def evaluate(params):
        return [
            jax.value_and_grad(
                lambda p, data=data: loss.loss(
                    random.PRNGKey(3), p, masked_model, guide, data, KEEP
                )
            )(params)
            for data in (Y, with_nan)
        ] + [
            jax.value_and_grad(
                lambda p: loss.loss(random.PRNGKey(3), p, plain_model, guide, kept)
            )(params)
        ]

    *masked_values, plain = evaluate(PARAMS)
    for masked in masked_values:
        np.testing.assert_allclose(masked[0], plain[0], rtol=1e-5)
        for name in PARAMS:
            np.testing.assert_allclose(
                masked[1][name], plain[1][name], rtol=1e-4, atol=1e-6
            )


def test_mask_as_a_traced_argument_compiles_once_and_follows_the_pattern():
    """A missing-data pattern passed into a jitted step: each pattern gives
    its own kept data's loss, from one traced program."""
    loss = PredictiveELBO(CRPS(estimator="closed-form"), num_particles=4)
    traces = []

    def step(keep):
        traces.append(1)
        return loss.loss(random.PRNGKey(3), PARAMS, masked_model, guide, Y, keep)

    step = jax.jit(step)
    for keep in (KEEP, jnp.array([False, True, True, True]), jnp.ones(4, bool)):
        expected = loss.loss(
            random.PRNGKey(3), PARAMS, plain_model, guide, Y[np.asarray(keep)]
        )
        np.testing.assert_allclose(step(keep), expected, rtol=1e-5)
    assert len(traces) == 1


def _forms():
    """One masked observation (index 2) written the ways users write it."""

    def handler(y, keep):
        theta = numpyro.sample("theta", dist.Normal(0.0, 10.0))
        with numpyro.plate("n", 4), handlers.mask(mask=keep):
            numpyro.sample("y", dist.Normal(theta, 1.0), obs=y)

    def method(y, keep):
        theta = numpyro.sample("theta", dist.Normal(0.0, 10.0))
        with numpyro.plate("n", 4):
            numpyro.sample("y", dist.Normal(theta, 1.0).mask(keep), obs=y)

    def expanded(y, keep):
        theta = numpyro.sample("theta", dist.Normal(0.0, 10.0))
        with numpyro.plate("n", 4):
            numpyro.sample("y", dist.Normal(theta, 1.0).expand([4]).mask(keep), obs=y)

    def outside_plate(y, keep):  # the mask broadcast along the plate from outside
        theta = numpyro.sample("theta", dist.Normal(0.0, 10.0))
        with handlers.mask(mask=keep), numpyro.plate("n", 4):
            numpyro.sample("y", dist.Normal(theta, 1.0), obs=y)

    return [handler, method, expanded, outside_plate]


@pytest.mark.parametrize("model", _forms(), ids=lambda f: f.__name__)
@pytest.mark.parametrize("score", ["log", "crps", "energy"])
def test_every_mask_form_removes_the_observation(model, score):
    loss = PredictiveELBO(score, num_particles=4)
    args = (Y, KEEP)
    got = loss.loss(random.PRNGKey(3), PARAMS, model, guide, *args)
    want = loss.loss(random.PRNGKey(3), PARAMS, masked_model, guide, *args)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def bernoulli_rows(y, keep):
    """Rows of three Bernoulli outcomes, one observation each."""
    beta = numpyro.sample("beta", dist.Normal(jnp.zeros(3), 1.0).to_event(1))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=beta).mask(keep).to_event(1), obs=y)


def bernoulli_guide(y, keep):
    loc = numpyro.param("loc", jnp.array([0.5, -1.0, 2.0]))
    numpyro.sample("beta", dist.Normal(loc, 1e-6).to_event(1))


def test_quadratic_score_leaves_masked_components_out_of_the_product_support():
    """Guide at a point (so the pair estimate is exact): a row with one
    component masked scores the quadratic score of its other two components,
    2 q(y) - Π_c Σ_j p_c(j)²; a fully masked row scores 0 (its log score is
    0 too), not ±1."""
    y = jnp.array([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])
    keep = jnp.array([[True, False, True], [False, False, False]])
    p = jax.nn.sigmoid(jnp.array([0.5, -1.0, 2.0]))
    kept_p = np.asarray(p)[[0, 2]]
    q_obs = kept_p[0] * kept_p[1]  # y = 1 at both kept components
    sum_sq = np.prod(kept_p**2 + (1 - kept_p) ** 2)
    scores = predictive_score(
        random.PRNGKey(0),
        {"loc": jnp.array([0.5, -1.0, 2.0])},
        bernoulli_rows,
        bernoulli_guide,
        y,
        keep,
        score="quadratic",
        num_draws=8,
    )
    np.testing.assert_allclose(scores.score, [2 * q_obs - sum_sq, 0.0], rtol=1e-4)
    np.testing.assert_array_equal(scores.observed, [True, False])
    log = predictive_score(
        random.PRNGKey(0),
        {"loc": jnp.array([0.5, -1.0, 2.0])},
        bernoulli_rows,
        bernoulli_guide,
        y,
        keep,
        num_draws=8,
    )
    np.testing.assert_allclose(log.score, [np.log(q_obs), 0.0], rtol=1e-4)


@pytest.mark.slow
def test_quadratic_masked_component_equals_the_model_without_it_at_the_same_key():
    """A guide with spread: the pair estimator over the kept components,
    exactly as the model observing only them."""

    def two_columns(y, keep):
        beta = numpyro.sample("beta", dist.Normal(jnp.zeros(3), 1.0).to_event(1))
        with numpyro.plate("n", y.shape[0]):
            numpyro.sample("y", dist.Bernoulli(logits=beta[::2]).to_event(1), obs=y)

    def wide_guide(y, keep):
        numpyro.sample(
            "beta", dist.Normal(numpyro.param("loc", jnp.zeros(3)), 0.8).to_event(1)
        )

    y = jnp.array([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    keep = jnp.broadcast_to(jnp.array([True, False, True]), y.shape)
    loss = PredictiveELBO("quadratic", num_particles=6)
    params = {"loc": jnp.array([0.3, -0.2, 1.0])}
    masked, plain = jax.jit(
        lambda params: [
            jax.value_and_grad(
                lambda p, model=model, data=data: loss.loss(
                    random.PRNGKey(1), p, model, wide_guide, data, keep
                )
            )(params)
            for model, data in ((bernoulli_rows, y), (two_columns, y[:, ::2]))
        ]
    )(params)
    np.testing.assert_allclose(masked[0], plain[0], rtol=1e-5)
    np.testing.assert_allclose(masked[1]["loc"], plain[1]["loc"], rtol=1e-4, atol=1e-6)


def normal_columns(y, keep):
    theta = numpyro.sample("theta", dist.Normal(0.0, 10.0))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample(
            "y",
            dist.Normal(theta, 1.0).expand([y.shape[0], 2]).mask(keep).to_event(1),
            obs=y,
        )


def test_energy_score_leaves_a_masked_column_out_of_both_vectors():
    """The second column masked (an outlier there): the energy score is the
    CRPS of the first column's predictive, over keys within Monte Carlo
    error (β = 1 in one dimension)."""
    y = jnp.stack([Y[np.asarray(KEEP)], jnp.array([50.0, -40.0, 30.0])], axis=1)
    keep = jnp.broadcast_to(jnp.array([True, False]), y.shape)
    loss = PredictiveELBO("energy", num_particles=4, regularizer=None)
    values, grads = _loss_and_grad_over_keys(loss, normal_columns, (y, keep), 4000)
    exact_loss, exact_grad = _exact_crps_loss_and_grad(np.asarray(y[:, 0]))
    assert abs(values.mean() - exact_loss) < 4.5 * values.std() / math.sqrt(values.size)
    assert abs(grads.mean() - exact_grad) < 4.5 * grads.std() / math.sqrt(grads.size)


@pytest.mark.slow
def test_mixture_guide_masked_observation_is_the_model_without_it():
    """Stratified draws of a mixture guide: same particles, same loss."""
    mixture = AutoGaussianMixture(masked_model, num_components=2)
    plain = AutoGaussianMixture(plain_model, num_components=2)
    svi = SVI(masked_model, mixture, optax.adam(0.1), loss=StratifiedELBO())
    params = svi.get_params(svi.init(random.PRNGKey(0), Y, KEEP))
    SVI(plain_model, plain, optax.adam(0.1), loss=StratifiedELBO()).init(
        random.PRNGKey(0), Y[np.asarray(KEEP)]
    )
    scores = ("log", CRPS(estimator="closed-form"), "energy")

    @jax.jit  # one program for the six losses
    def losses(params):
        return [
            (
                loss.loss(random.PRNGKey(2), params, masked_model, mixture, Y, KEEP),
                loss.loss(
                    random.PRNGKey(2), params, plain_model, plain, Y[np.asarray(KEEP)]
                ),
            )
            for loss in (PredictiveELBO(score, num_particles=4) for score in scores)
        ]

    for score, (a, b) in zip(scores, losses(params), strict=True):
        if score == "energy":  # simulations of other shapes: finite, and close
            assert np.isfinite(a) and abs(a - b) < 3.0
        else:
            np.testing.assert_allclose(a, b, rtol=1e-5)


@pytest.mark.slow
def test_predictive_score_and_cross_validation_leave_masked_observations_out():
    scores = predictive_score(random.PRNGKey(0), PARAMS, masked_model, guide, Y, KEEP)
    kept = predictive_score(
        random.PRNGKey(0), PARAMS, plain_model, guide, Y[np.asarray(KEEP)]
    )
    np.testing.assert_array_equal(scores.observed, np.asarray(KEEP))
    assert scores.score[2] == 0.0 and scores.se[2] == 0.0
    np.testing.assert_allclose(scores.score[np.asarray(KEEP)], kept.score, rtol=1e-5)
    np.testing.assert_allclose(scores.total, kept.total, rtol=1e-5)

    y = jnp.asarray(np.random.default_rng(0).normal(size=12)).at[5].set(30.0)
    keep = jnp.ones(12, bool).at[5].set(False)
    auto = AutoNormal(masked_model)
    cv = cross_validate(
        random.PRNGKey(0),
        masked_model,
        auto,
        optax.adam(0.05),
        y,
        keep,
        fit=FitRecipe(num_steps=200, num_draws=200, progress_bar=False),
        candidates=[Trace_ELBO(), PredictiveELBO("log", lam=1.0)],
        num_folds=3,
    )
    observed = cv.scores["observed"].values
    np.testing.assert_array_equal(observed, np.asarray(keep))
    for label in cv.candidates:
        pointwise = cv.scores["pointwise"].sel(candidate=label).values
        np.testing.assert_allclose(
            cv.scores["mean"].sel(candidate=label),
            pointwise[observed].mean(),
            rtol=1e-6,
        )


# --------------------------------------------------------------------------
# obs_mask: the missing entries are a latent site
# --------------------------------------------------------------------------

X = jnp.linspace(-1.0, 1.0, 10)
MISSING = jnp.zeros(10, bool).at[jnp.array([2, 7])].set(True)
Y_MISSING = (1.0 + 2.0 * X).at[MISSING].set(jnp.nan)


def imputing_model(x, y=None, mask=None):
    a = numpyro.sample("a", dist.Normal(0.0, 5.0))
    b = numpyro.sample("b", dist.Normal(0.0, 5.0))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Normal(a + b * x, 1.0), obs=y, obs_mask=mask)


OBJECTIVES = [
    Trace_ELBO(),
    PredictiveELBO("log", num_particles=4),
    PredictiveELBO("crps", num_particles=4),
    PredictiveELBO("energy", num_particles=4),
    PredictiveELBO("log", num_particles=4, regularizer="posterior"),
    PACmELBO(num_particles=4),
    SoftCVIELBO(num_particles=4),
    SNISForwardKL(num_particles=4),
    StratifiedELBO(num_particles=2),
]


@pytest.fixture(scope="module")
def imputing_fit():
    guide = AutoNormal(imputing_model)
    args = (X, Y_MISSING, ~MISSING)
    svi = SVI(imputing_model, guide, optax.adam(0.05), Trace_ELBO())
    params = svi.get_params(svi.init(random.PRNGKey(0), *args))
    return guide, params, args


@pytest.mark.slow
@pytest.mark.parametrize("loss", OBJECTIVES[1:], ids=_label)
def test_obs_mask_objectives_leave_the_observed_entries_of_the_latent_out(
    imputing_fit, loss
):
    """NumPyro gives the missing-entry latent 'y_unobserved' no density at
    the observed entries; the guide's density is left out there too, so the
    objective neither depends on the guide's factors there (zero gradient:
    they cannot drift, which makes Trace_ELBO's loss run to -inf) nor is
    blind to the missing entries (nonzero gradient there)."""
    guide, params, args = imputing_fit
    loss_value, grads = jax.jit(
        jax.value_and_grad(
            lambda p: loss.loss(random.PRNGKey(1), p, imputing_model, guide, *args)
        )
    )(params)
    assert np.isfinite(loss_value)
    for name in ("y_unobserved_auto_loc", "y_unobserved_auto_scale"):
        g = np.asarray(grads[name])
        np.testing.assert_array_equal(g[~np.asarray(MISSING)], 0.0)
    if not isinstance(loss, PredictiveELBO) or loss.regularizer is not None:
        assert np.all(
            np.asarray(grads["y_unobserved_auto_scale"])[np.asarray(MISSING)] != 0
        )


def test_trace_elbo_drifts_with_obs_mask_where_ours_does_not(imputing_fit):
    """The pathology that motivates the above: NumPyro's own ELBO grows the
    guide's scales at the observed entries without bound."""
    guide, _, args = imputing_fit
    for loss, drifts in (
        (Trace_ELBO(), True),
        (PredictiveELBO("log", num_particles=4), False),
    ):
        run = SVI(imputing_model, guide, optax.adam(0.05), loss).run(
            random.PRNGKey(0), 600, *args, progress_bar=False
        )
        scale = np.asarray(run.params["y_unobserved_auto_scale"])[~np.asarray(MISSING)]
        assert (scale.max() > 5.0) == drifts


@pytest.mark.slow
def test_obs_mask_diagnostics_run_and_procedures_that_simulate_refuse(imputing_fit):
    guide, params, args = imputing_fit
    key = random.PRNGKey(0)
    scores = predictive_score(key, params, imputing_model, guide, *args, num_draws=200)
    np.testing.assert_array_equal(scores.observed, ~np.asarray(MISSING))
    smoothed = diagnostics.psis(
        key, params, imputing_model, guide, *args, num_draws=200
    )
    # log q leaves the observed entries out: moving the guide there changes nothing
    dummy = ~np.asarray(MISSING)
    moved = dict(
        params,
        y_unobserved_auto_loc=params["y_unobserved_auto_loc"].at[dummy].add(3.0),
        y_unobserved_auto_scale=params["y_unobserved_auto_scale"].at[dummy].mul(5.0),
    )
    again = diagnostics.psis(key, moved, imputing_model, guide, *args, num_draws=200)
    lr = [
        np.asarray(diagnostics.get_group(d, "sample_stats")["log_ratio"])
        for d in (smoothed, again)
    ]
    np.testing.assert_allclose(lr[0], lr[1], rtol=1e-5, atol=1e-4)
    diagnostics.to_inference_data(
        key, params, imputing_model, guide, *args, num_draws=100
    )
    diagnostics.report(
        key, params, imputing_model, guide, *args, num_draws=200, show=False
    )
    optim = optax.adam(0.05)
    for function in (diagnostics.vsbc, diagnostics.predictive_calibration):
        with pytest.raises(
            ValueError, match="obs_mask=.*'y_unobserved'.*obs_mask=None"
        ):
            function(
                key,
                imputing_model,
                guide,
                optim,
                Trace_ELBO(),
                *args,
                replications=Replications(
                    num_simulations=4, num_svi_steps=5, progress_bar=False
                ),
            )


@pytest.mark.slow
def test_obs_mask_with_a_joint_guide_density_is_refused_with_a_remedy():
    guide = AutoDiagonalNormal(imputing_model)
    args = (X, Y_MISSING, ~MISSING)
    svi = SVI(imputing_model, guide, optax.adam(0.05), Trace_ELBO())
    params = svi.get_params(svi.init(random.PRNGKey(0), *args))
    with pytest.raises(ValueError, match=r"obs_mask=.*'y_unobserved'.*AutoNormal"):
        PredictiveELBO("log").loss(
            random.PRNGKey(0), params, imputing_model, guide, *args
        )


def test_predictive_calibration_refuses_masked_observations():
    auto = AutoNormal(masked_model)
    with pytest.raises(ValueError, match="observed site 'y' is masked"):
        diagnostics.predictive_calibration(
            random.PRNGKey(0),
            masked_model,
            auto,
            optax.adam(0.05),
            Trace_ELBO(),
            Y,
            KEEP,
            replications=Replications(
                num_simulations=4, num_svi_steps=5, progress_bar=False
            ),
        )


def masks_its_missing_values(y):
    """NumPyro's Lotka-Volterra notebook: the mask computed from the data."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("n", y.shape[0]):
        mask = jnp.isfinite(jnp.log(y))
        numpyro.sample("y", dist.LogNormal(mu, 0.5).mask(mask), obs=y)


@pytest.mark.parametrize(
    "function", [diagnostics.vsbc, diagnostics.predictive_calibration]
)
def test_a_mask_computed_from_the_data_masks_nothing_in_simulated_data(function):
    """A simulated data set is complete, so the mask the model computes from
    it leaves nothing out: both procedures run. The predictive calibration
    refused any mask and named a remedy that could not work (complete data
    still builds the mask); the one computed from another argument is still
    refused (above)."""
    y = jnp.array([1.0, 2.0, jnp.nan, 0.5, 1.5, 0.8])
    guide = AutoNormal(masks_its_missing_values)
    replications = Replications(num_simulations=2, num_svi_steps=5, num_draws=20)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # few draws
        result = function(
            random.PRNGKey(0), masks_its_missing_values, guide, optax.adam(0.05),
            Trace_ELBO(), y, replications=replications,
        )  # fmt: skip
    assert result is not None


@pytest.mark.parametrize(
    "call",
    [
        predictive_score,
        diagnostics.psis,
        diagnostics.to_inference_data,
        lambda *a, **k: diagnostics.report(*a, show=False, **k),
    ],
    ids=["predictive_score", "psis", "to_inference_data", "report"],
)
def test_missing_values_without_a_mask_are_refused_naming_them(imputing_fit, call):
    """NaN in the data and no mask: the log-likelihood there is -inf (the
    log score read -inf, psis blamed the guide's support); refused, naming
    the site and the entries, with obs_mask as the remedy (which the
    imputing fit above runs with the same NaN data)."""
    guide, params, (x, y, _) = imputing_fit
    with pytest.raises(
        ValueError, match=r"'y' holds NaN at 2 entries.*\[2, 7\].*obs_mask"
    ):
        call(random.PRNGKey(0), params, imputing_model, guide, x, y)


@pytest.mark.parametrize(
    "procedure", [diagnostics.vsbc, diagnostics.predictive_calibration]
)
def test_procedures_refuse_missing_values_without_a_mask(imputing_fit, procedure):
    guide, _, (x, y, _) = imputing_fit
    with pytest.raises(ValueError, match=r"'y' holds NaN at 2 entries.*obs_mask"):
        procedure(
            random.PRNGKey(0),
            imputing_model,
            AutoNormal(imputing_model),
            optax.adam(0.01),
            Trace_ELBO(),
            x,
            y,
            replications=Replications(num_simulations=2, num_svi_steps=2),
        )
