"""Diagnostics and held-out scores on the edges a new user reaches:
subsampled plates, observed values computed in the model, float64
log-likelihoods for ArviZ, argument order, recompilation, unconverged VSBC
replications, plots that keep their labels."""

import contextlib
import warnings

import arviz as az
import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from jax import random
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal

from numpyro_pvi import (
    PACmELBO,
    PredictiveELBO,
    Replications,
    diagnostics,
    predictive_score,
)
from numpyro_pvi.diagnostics.vsbc import loss_drift
from numpyro_pvi.evaluation.draws import cached_program_count
from tests.arviz_generation import elpd, group, group_names

matplotlib.use("Agg")
pytestmark = pytest.mark.py312

N = 20
X = jnp.linspace(-1.0, 1.0, N)
Y = 0.5 + X + 0.3 * random.normal(random.PRNGKey(0), (N,))


def model(x, y=None, subsample_size=None):
    a = numpyro.sample("a", dist.Normal(0.0, 1.0))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("obs", x.shape[0], subsample_size=subsample_size) as idx:
        y_i = None if y is None else y[idx]
        numpyro.sample("y", dist.Normal(a + b * x[idx], sigma), obs=y_i)


@pytest.fixture(scope="module")
def fit():
    guide = AutoNormal(model)
    svi = SVI(model, guide, optax.adam(0.05), Trace_ELBO())
    return guide, svi.run(random.PRNGKey(1), 300, X, Y, progress_bar=False).params


# -- subsampled plates: score everything or refuse --------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "call",
    [
        lambda g, p: predictive_score(random.PRNGKey(0), p, model, g, X, Y, 5),
        lambda g, p: diagnostics.psis(random.PRNGKey(0), p, model, g, X, Y, 5),
        lambda g, p: diagnostics.to_inference_data(
            random.PRNGKey(0), p, model, g, X, Y, 5
        ),
        lambda g, p: diagnostics.heterogeneity(
            random.PRNGKey(0), p, model, g, X, Y, 5, reference_params=p
        ),
        lambda g, p: diagnostics.vsbc(
            random.PRNGKey(0),
            model,
            g,
            optax.adam(0.01),
            Trace_ELBO(),
            X,
            Y,
            5,
            replications=Replications(
                num_simulations=2, num_svi_steps=2, progress_bar=False
            ),
        ),
    ],
    ids=["predictive_score", "psis", "to_inference_data", "heterogeneity", "vsbc"],
)
def test_subsampled_data_plate_is_refused(fit, call):
    guide, params = fit
    with pytest.raises(ValueError, match="'obs' is subsampled"):
        call(guide, params)


def fixed_batch_model(x, y=None, batch=5):
    """The subsample size written into the model, the batch passed in (as
    NumPyro's TBIP notebook does): the data's arguments do not change it."""
    a = numpyro.sample("a", dist.Normal(0.0, 1.0))
    with numpyro.plate("obs", N, subsample_size=batch):
        numpyro.sample("y", dist.Normal(a * x, 1.0), obs=y)


def test_a_subsample_size_fixed_in_the_model_has_a_remedy_that_works():
    def guide(x, y=None, batch=5):
        numpyro.sample("a", dist.Normal(numpyro.param("a_loc", 0.5), 0.1))

    key = random.PRNGKey(0)
    message = r"substitute\(model, data=\{'obs': jnp.arange\(20\)\}\)"
    with pytest.raises(ValueError, match=message):
        predictive_score(key, {}, fixed_batch_model, guide, X[:5], Y[:5])
    full = numpyro.handlers.substitute(fixed_batch_model, data={"obs": jnp.arange(N)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # NumPyro: 5 vs 20 indices
        scores = predictive_score(key, {}, full, guide, X, Y)
    unsubsampled = predictive_score(key, {}, fixed_batch_model, guide, X, Y, N)
    np.testing.assert_allclose(scores.score, unsubsampled.score, rtol=1e-6)


def test_predictive_score_scores_every_observation(fit):
    guide, params = fit
    scores = predictive_score(random.PRNGKey(0), params, model, guide, X, Y)
    assert scores.score.shape == scores.se.shape == scores.pareto_k.shape == (N,)
    assert np.all(scores.se > 0) and np.all(scores.pareto_k < scores.good_k)


# -- observed values computed inside the model -------------------------------


def log_model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("log_y", dist.Normal(mu, 1.0), obs=jnp.log(y))


def test_export_takes_observed_values_computed_by_the_model():
    y = jnp.exp(Y)
    guide = AutoNormal(log_model)
    params = (
        SVI(log_model, guide, optax.adam(0.05), Trace_ELBO())
        .run(random.PRNGKey(0), 50, y, progress_bar=False)
        .params
    )
    fit = diagnostics.to_inference_data(random.PRNGKey(1), params, log_model, guide, y)
    np.testing.assert_allclose(fit.observed_data["log_y"].values, Y, rtol=1e-5)


# -- ArviZ's PSIS-LOO on the export ------------------------------------------


def test_loo_on_export_is_finite_and_says_what_it_assumes(fit):
    guide, params = fit
    idata = diagnostics.to_inference_data(
        random.PRNGKey(2), params, model, guide, X, Y, num_draws=500
    )
    assert idata.log_likelihood["y"].dtype == np.float64
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no divide by zero
        loo = az.loo(idata, reff=1.0)
    assert np.isfinite(elpd(loo))
    assert "Bayesian posterior" in idata.attrs["psis_loo"]
    assert "predictive_score" in idata.attrs["psis_loo"]


# -- one argument order: (rng_key, params, model, guide, *args) --------------
# (the old orders and the deprecation shim: tests/test_call_shapes.py)


@pytest.mark.parametrize("function", ["psis", "to_inference_data"])
def test_swapped_call_says_which_argument_is_which(fit, function):
    guide, params = fit
    with pytest.raises(TypeError, match=r"params \(2nd\) must be the dict"):
        getattr(diagnostics, function)(random.PRNGKey(0), model, params, guide, X, Y)


def test_predictive_score_compiles_once_per_shape(fit):
    """New data of the same shapes: no new program, for the draws, for the
    further draws of the observations far in the predictive's tail (shifted
    covariates) and for the moment matching of far observations (an outlier
    in each data set)."""
    guide, params = fit
    calls = [(X + 1.0, Y.at[3].set(30.0)), (X + 1.0, Y.at[5].set(-30.0)), (X, Y - 1.0)]
    for i, data in enumerate(calls):
        scores = predictive_score(random.PRNGKey(i), params, model, guide, *data)
        if i == 0:
            assert scores.adapted[3] and (scores.draws > 1000).any()
            size = cached_program_count()
    assert cached_program_count() == size


@contextlib.contextmanager
def _lowered_programs():
    """The programs JAX lowers inside the block (to compile them or to look
    them up in the persistent cache): one event each."""
    events: list[float] = []

    def listener(event: str, duration: float, **_: object) -> None:
        if event == "/jax/core/compile/jaxpr_to_mlir_module_duration":
            events.append(duration)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield events
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def grouped(group, y=None):
    """Python on an argument (the number of groups from its values)."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0).expand([len(np.unique(group))]))
    with numpyro.plate("data", group.shape[0]):
        numpyro.sample("y", dist.Normal(mu[group], 1.0), obs=y)


def test_python_on_arguments_compiles_once_per_data_values():
    """The arguments are the program's constants: the same values again
    (another diagnostic of the same data) compile nothing; new values of the
    same shapes get a program of their own, not the stale one."""
    group, y = jnp.array([0, 0, 1, 1, 2, 2]), jnp.linspace(-1.0, 1.0, 6)
    guide = AutoNormal(grouped)
    svi = SVI(grouped, guide, optax.adam(0.1), Trace_ELBO())
    params = svi.get_params(svi.init(random.PRNGKey(0), group, y))
    first = predictive_score(random.PRNGKey(1), params, grouped, guide, group, y)
    size = cached_program_count()
    same = jnp.array(np.asarray(y))  # other arrays, equal values
    with _lowered_programs() as lowered:
        again = predictive_score(random.PRNGKey(1), params, grouped, guide, group, same)
    assert lowered == [] and cached_program_count() == size
    np.testing.assert_array_equal(again.score, first.score)
    # (a count of the cached programs would not show it once the cache of
    # programs with constants is full: the new one replaces the oldest)
    with _lowered_programs() as lowered:
        far = predictive_score(random.PRNGKey(1), params, grouped, guide, group, y + 10)
    assert lowered != []
    # ten prior sds from the guide: far lower log scores than at y
    assert np.all(far.score < first.score - 20.0)


# -- small things ------------------------------------------------------------


def test_numbers_must_be_numbers():
    with pytest.raises(TypeError, match="lam must be a real number"):
        PredictiveELBO("log", lam="0.1")
    with pytest.raises(TypeError, match="beta must be a real number"):
        PACmELBO(beta="1")


def test_pacm_errors_name_its_own_arguments():
    with pytest.raises(ValueError, match="num_particles") as err:
        PACmELBO(num_particles=0)
    assert "score" not in str(err.value)


def test_losses_print_their_hyper_parameters():
    assert repr(PACmELBO(num_particles=4, beta=0.5)) == (
        "PACmELBO(num_particles=4, beta=0.5)"
    )
    text = repr(PredictiveELBO("crps", num_particles=8, lam=0.1))
    assert text == (
        "PredictiveELBO(score=CRPS(), num_particles=8, regularizer='prior', lam=0.1)"
    )


def test_point_mass_guide_warns():
    from numpyro.infer.autoguide import AutoDelta

    guide = AutoDelta(model)
    svi = SVI(model, guide, optax.adam(0.01), PredictiveELBO("log", num_particles=2))
    with pytest.warns(UserWarning, match="point mass"):
        svi.run(random.PRNGKey(0), 2, X, Y, progress_bar=False)


@pytest.mark.parametrize(
    "function", [diagnostics.psis, diagnostics.report, diagnostics.psis_resample]
)
def test_a_point_mass_guide_has_no_importance_ratios(function):
    """AutoDelta's draws are one value and it has no density: k̂ (which
    would read -inf, "constant weights", a good fit) is refused, with a
    remedy; a hand-written Delta guide likewise, and an AutoGuideList with
    an AutoDelta part (naming its sites); the same list with AutoNormal
    parts, and AutoMultivariateNormal (Deltas of its one draw), are not."""
    from numpyro.infer.autoguide import AutoDelta, AutoGuideList, AutoMultivariateNormal

    guide = AutoDelta(model)
    params = (
        SVI(model, guide, optax.adam(0.01), Trace_ELBO())
        .run(random.PRNGKey(0), 5, X, Y, progress_bar=False)
        .params
    )
    with pytest.raises(ValueError, match="point masses.*AutoLaplaceApproximation"):
        function(random.PRNGKey(1), params, model, guide, X, Y, num_draws=20)

    def delta_guide(x, y=None):
        for name in ("a", "b"):
            numpyro.sample(name, dist.Delta(numpyro.param(f"{name}_loc", 0.0)))
        numpyro.sample(
            "sigma",
            dist.Delta(numpyro.param("s", 1.0, constraint=dist.constraints.positive)),
        )

    with pytest.raises(ValueError, match="as point masses"):
        function(
            random.PRNGKey(1),
            {"a_loc": 0.0, "b_loc": 0.0, "s": 1.0},
            model,
            delta_guide,
            X,
            Y,
            num_draws=20,
        )

    def listed(first):
        guide = AutoGuideList(model)
        guide.append(first(numpyro.handlers.block(model, expose=["a"])))
        guide.append(AutoNormal(numpyro.handlers.block(model, hide=["a"])))
        svi = SVI(model, guide, optax.adam(0.01), Trace_ELBO())
        return guide, svi.get_params(svi.init(random.PRNGKey(0), X, Y))

    guide, params = listed(AutoDelta)
    with pytest.raises(ValueError, match=r"latent sites \['a'\] as point masses"):
        function(random.PRNGKey(1), params, model, guide, X, Y, num_draws=20)
    for guide, params in (listed(AutoNormal), (AutoMultivariateNormal(model), None)):
        if params is None:
            svi = SVI(model, guide, optax.adam(0.01), Trace_ELBO())
            params = svi.get_params(svi.init(random.PRNGKey(0), X, Y))
        function(random.PRNGKey(1), params, model, guide, X, Y, num_draws=30)


def test_network_parameters_of_numpyro_module_are_taken():
    """numpyro.module (NumPyro's VAE example, stax) makes one parameter a
    pytree of weights: the diagnostics take it (before, a raw TypeError
    from the model's structure), with the scores of the same network
    written with numpyro.param arrays."""
    from jax.example_libraries import stax

    def with_module(x, y=None):
        net = numpyro.module("net", stax.Dense(1), (N, 1))
        sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
        with numpyro.plate("obs", N):
            numpyro.sample("y", dist.Normal(net(x[:, None])[:, 0], sigma), obs=y)

    def with_params(x, y=None):
        w, b = numpyro.param("w", jnp.zeros((1, 1))), numpyro.param("b", jnp.zeros(1))
        sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
        with numpyro.plate("obs", N):
            numpyro.sample("y", dist.Normal((x[:, None] @ w + b)[:, 0], sigma), obs=y)

    guide = AutoNormal(with_module)
    svi = SVI(with_module, guide, optax.adam(0.05), Trace_ELBO())
    params = svi.run(random.PRNGKey(0), 50, X, Y, progress_bar=False).params
    (w, b) = params["net$params"]
    flat = {"w": w, "b": b, **{k: v for k, v in params.items() if "$" not in k}}
    key = random.PRNGKey(1)
    scores = [
        np.asarray(predictive_score(key, p, m, AutoNormal(m), X, Y).score)
        for p, m in ((params, with_module), (flat, with_params))
    ]
    np.testing.assert_allclose(scores[0], scores[1], rtol=1e-5)
    data = diagnostics.to_inference_data(key, params, with_module, guide, X, Y)
    assert group(data, "log_likelihood")["y"].shape[-1] == N


def test_too_few_draws_for_psis_loo_are_refused_alike(fit):
    """Under 25 draws arviz-stats' Pareto fit has no tail of 5 (a raw
    "n_draws_tail must be at least 5" from inside ArviZ 1.x, while ArviZ
    0.2x smoothed 4): refused under both generations, saying how many."""
    guide, params = fit
    data = diagnostics.to_inference_data(
        random.PRNGKey(0), params, model, guide, X, Y, num_draws=20
    )
    with pytest.raises(ValueError, match="20 draws, too few.*num_draws=25"):
        diagnostics.approximate_loo(data)
    with pytest.raises(ValueError, match="num_draws must be an integer >= 25"):
        diagnostics.report(random.PRNGKey(0), params, model, guide, X, Y, num_draws=20)
    data = diagnostics.to_inference_data(
        random.PRNGKey(0), params, model, guide, X, Y, num_draws=25
    )
    assert np.isfinite(elpd(diagnostics.approximate_loo(data)))


def test_a_model_without_data_gets_its_draws_and_k_hat():
    """A target density without data (NumPyro's neutra and funnel examples):
    psis, report and to_inference_data give the draws, lp, log q and k̂ (no
    log-likelihood, no LOO); the predictive functions refuse, naming the
    objectives that fit such a model."""

    def target():
        numpyro.sample("x", dist.Normal(1.0, 2.0))

    guide = AutoNormal(target)
    params = {"x_auto_loc": jnp.array(1.0), "x_auto_scale": jnp.array(2.0)}
    key = random.PRNGKey(0)
    data = diagnostics.to_inference_data(key, params, target, guide, num_draws=50)
    assert group_names(data) == {"posterior", "sample_stats"}
    lp = np.asarray(group(data, "sample_stats")["lp"]).ravel()
    log_q = np.asarray(group(data, "sample_stats")["log_q"]).ravel()
    np.testing.assert_allclose(lp, log_q, rtol=1e-5)  # the guide is the target
    out = diagnostics.report(key, params, target, guide, num_draws=200, show=False)
    assert "no observed site" in out.attrs["report"]
    assert out.attrs["verdict"].startswith("reliable")
    with pytest.raises(ValueError, match="no observed site.*SoftCVIELBO"):
        predictive_score(key, params, target, guide)
    tiny = Replications(num_simulations=2, num_svi_steps=2, num_draws=10)
    for procedure in (diagnostics.vsbc, diagnostics.predictive_calibration):
        with pytest.raises(ValueError, match="no observed site.*diagnostics.psis"):
            procedure(
                key, target, guide, optax.adam(0.1), Trace_ELBO(), replications=tiny
            )


def _label_inside(fig, artist):
    fig.canvas.draw()
    box = artist.get_window_extent(fig.canvas.get_renderer())
    return box.x0 >= 0 and box.y0 >= 0 and box.x1 <= fig.bbox.x1


def test_plots_keep_their_axis_labels_inside_the_figure(fit):
    guide, params = fit
    idata = diagnostics.psis(random.PRNGKey(0), params, model, guide, X, Y)
    axes = diagnostics.plot_psis(idata)
    fig = axes[0].figure
    assert _label_inside(fig, axes[0].yaxis.label)
    assert _label_inside(fig, axes[0].xaxis.label)
    ds = diagnostics.heterogeneity(
        random.PRNGKey(0),
        params,
        model,
        guide,
        X,
        Y,
        reference_params=params,
        num_draws=50,
    )
    ax = diagnostics.plot_heterogeneity(ds)
    assert _label_inside(ax.figure, ax.yaxis.get_ticklabels()[0])
    assert _label_inside(ax.figure, ax.xaxis.label)


# -- VSBC convergence --------------------------------------------------------


def test_loss_drift_separates_falling_from_fluctuating_losses():
    noise = random.normal(random.PRNGKey(0), (1000,))
    assert abs(float(loss_drift(10.0 + noise))) < 4.0
    assert float(loss_drift(10.0 + noise - jnp.linspace(0, 20, 1000))) > 10.0
    assert np.isnan(float(loss_drift(jnp.ones(3))))
    # without Monte Carlo noise: converged is 0, still falling is flagged
    assert float(loss_drift(jnp.full(100, 123.0))) == 0.0
    assert float(loss_drift(100.0 - jnp.linspace(0, 1, 100))) > 3.0


@pytest.mark.slow
def test_vsbc_flags_unconverged_replications_and_says_so():
    def simple(y=None):
        t = numpyro.sample("t", dist.Normal(0.0, 10.0))
        with numpyro.plate("n", 10):
            numpyro.sample("y", dist.Normal(t, 1.0), obs=y)

    with pytest.warns(UserWarning, match="had not converged") as record:
        idata = diagnostics.vsbc(
            random.PRNGKey(0),
            simple,
            AutoNormal(simple),
            optax.sgd(1e-4),  # far too small: the loss is still falling
            Trace_ELBO(num_particles=32),
            replications=Replications(
                num_simulations=8, num_svi_steps=200, num_draws=50, progress_bar=False
            ),
            observed_sites=["y"],
        )
    assert record[0].filename == __file__  # points at the user's call
    stats = idata.vsbc_fit_stats
    unconverged = int((~stats["converged"].values).sum())
    # θ* near the initial value converges early: a prior sd of 10 puts few
    # there (at 3, float64's draws put 4 of 8)
    assert unconverged >= 6
    assert idata.vsbc_symmetry.attrs["num_unconverged"] == unconverged
    assert "num_extreme" in idata.vsbc_symmetry
    axes = diagnostics.plot_vsbc(idata)
    assert "p = " not in axes[0].get_title()
    assert f"{unconverged} of 8 replications had not converged" in (
        axes[0].figure.get_suptitle()
    )

    with pytest.warns(
        UserWarning, match="predictive_calibration: .* not conv"
    ) as record:
        result = diagnostics.predictive_calibration(
            random.PRNGKey(0),
            simple,
            AutoNormal(simple),
            optax.sgd(1e-4),
            Trace_ELBO(num_particles=32),
            replications=Replications(
                num_simulations=8, num_svi_steps=200, num_draws=50, progress_bar=False
            ),
            observed_sites=["y"],
        )
    assert record[0].filename == __file__
    tests = group(result, "calibration")
    assert tests.attrs["num_unconverged"] >= 6


def test_chunked_draws_compile_once(fit):
    guide, params = fit
    psis_args = (params, model, guide, X, Y)
    diagnostics.psis(random.PRNGKey(0), *psis_args, num_draws=64, chunk_size=16)
    size = cached_program_count()
    diagnostics.psis(random.PRNGKey(1), *psis_args, num_draws=64, chunk_size=16)
    assert cached_program_count() == size
