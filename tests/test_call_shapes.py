"""Two call shapes, NumPyro's, and the one deprecation shim.

Every public function on a fitted guide takes ``(rng_key, params, model,
guide, *args, **kwargs)`` (``psis_diagnostic``'s); every one that fits takes
``(rng_key, model, guide, optim, ...)`` (``vsbc_diagnostic``'s); none takes
more than 12 parameters. The shapes of earlier versions still work, with a
``FutureWarning``, and give the same numbers.
"""

import inspect
import warnings

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from jax import random
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal

import numpyro_pvi
from numpyro_pvi import (
    FitRecipe,
    PredictiveELBO,
    Replications,
    StratifiedELBO,
    diagnostics,
    selection,
)
from numpyro_pvi import guides as pvi_guides
from numpyro_pvi._core import deprecation
from tests.arviz_generation import group

N = 12
X = jnp.linspace(-1.0, 1.0, N)
Y = 0.5 + X + 0.3 * random.normal(random.PRNGKey(0), (N,))

FITTED = {
    "predictive_score": numpyro_pvi.predictive_score,
    "psis": diagnostics.psis,
    "psis_resample": diagnostics.psis_resample,
    "to_inference_data": diagnostics.to_inference_data,
    "report": diagnostics.report,
    "heterogeneity": diagnostics.heterogeneity,
    "prune_components": pvi_guides.prune_components,
}
FITTING = {
    "vsbc": diagnostics.vsbc,
    "predictive_calibration": diagnostics.predictive_calibration,
    "cross_validate": selection.cross_validate,
    "fit_gm_pvi": pvi_guides.fit_gm_pvi,
    "stack": selection.stack,
}


def model(x, y=None):
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    with numpyro.plate("obs", x.shape[0]):
        numpyro.sample("y", dist.Normal(b * x, 0.5), obs=y)


@pytest.fixture(scope="module")
def fit():
    guide = AutoNormal(model)
    svi = SVI(model, guide, optax.adam(0.05), Trace_ELBO())
    return guide, svi.run(random.PRNGKey(1), 100, X, Y, progress_bar=False).params


def _public_functions():
    modules = [numpyro_pvi, diagnostics, selection, pvi_guides, numpyro_pvi.scores]
    for module in modules:
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isfunction(obj):
                yield f"{module.__name__}.{name}", obj


def _parameters(fn):
    return list(inspect.signature(fn).parameters.values())


@pytest.mark.parametrize("name, fn", list(_public_functions()))
def test_no_public_function_takes_more_than_12_parameters(name, fn):
    assert len(_parameters(fn)) <= 12, name


@pytest.mark.parametrize("name", FITTED)
def test_functions_on_a_fitted_guide_take_psis_diagnostics_shape(name):
    params = _parameters(FITTED[name])
    assert [p.name for p in params[:4]] == ["rng_key", "params", "model", "guide"]
    assert params[4].kind is inspect.Parameter.VAR_POSITIONAL
    assert params[-1].kind is inspect.Parameter.VAR_KEYWORD


@pytest.mark.parametrize("name", FITTING)
def test_procedures_that_fit_take_vsbc_diagnostics_shape(name):
    params = _parameters(FITTING[name])
    assert [p.name for p in params[:4]] == ["rng_key", "model", "guide", "optim"]
    assert any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    assert params[-1].kind is inspect.Parameter.VAR_KEYWORD


def test_recipes_refuse_bad_fields_and_loose_options():
    with pytest.raises(ValueError, match="Replications: num_simulations"):
        Replications(num_simulations=1)
    with pytest.raises(ValueError, match="Replications: chain_method"):
        Replications(chain_method="parallel")
    with pytest.raises(TypeError, match="Replications: data_generator"):
        Replications(data_generator=3)
    with pytest.raises(ValueError, match="FitRecipe: num_steps"):
        FitRecipe(num_steps=0)
    with pytest.raises(TypeError, match=r"replications must be a Replications\("):
        diagnostics.vsbc(
            random.PRNGKey(0),
            model,
            AutoNormal(model),
            optax.adam(0.01),
            Trace_ELBO(),
            X,
            replications={"num_simulations": 4},
        )
    with pytest.raises(TypeError, match="inside replications=Replications"):
        diagnostics.vsbc(
            random.PRNGKey(0),
            model,
            AutoNormal(model),
            optax.adam(0.01),
            Trace_ELBO(),
            X,
            replications=Replications(),
            num_simulations=4,
        )


def test_vsbc_refuses_a_data_generator():
    with pytest.raises(ValueError, match="it is for predictive_calibration"):
        diagnostics.vsbc(
            random.PRNGKey(0),
            model,
            AutoNormal(model),
            optax.adam(0.01),
            Trace_ELBO(),
            X,
            replications=Replications(data_generator=lambda key: {"y": Y}),
        )


# -- the old shapes: a FutureWarning, the same numbers ----------------------


def _same(old, new):
    """Run ``old`` (must warn) and ``new`` (must not); return both."""
    with pytest.warns(FutureWarning, match="deprecated and will be removed"):
        a = old()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        b = new()
    return a, b


def test_old_fitted_order_and_param_map(fit):
    guide, params = fit
    key = random.PRNGKey(3)
    old, new = _same(
        lambda: numpyro_pvi.predictive_score(key, model, guide, params, X, Y),
        lambda: numpyro_pvi.predictive_score(key, params, model, guide, X, Y),
    )
    np.testing.assert_array_equal(old.score, new.score)
    old, new = _same(
        lambda: diagnostics.psis(
            key, param_map=params, model=model, guide=guide, x=X, y=Y, num_draws=200
        ),
        lambda: diagnostics.psis(
            key, params=params, model=model, guide=guide, x=X, y=Y, num_draws=200
        ),
    )
    for var in group(new, "psis").data_vars:
        np.testing.assert_array_equal(group(old, "psis")[var], group(new, "psis")[var])


@pytest.mark.parametrize("order", ["0.0", "0.1"])
def test_old_heterogeneity_orders(fit, order):
    guide, params = fit
    key = random.PRNGKey(3)
    if order == "0.0":
        old_args = (key, model, guide, params, guide, params, X, Y)
    else:
        old_args = (key, params, params, model, guide, guide, X, Y)
    old, new = _same(
        lambda: diagnostics.heterogeneity(*old_args, num_draws=50),
        lambda: diagnostics.heterogeneity(
            key, params, model, guide, X, Y, reference_params=params, num_draws=50
        ),
    )
    np.testing.assert_array_equal(
        group(old, "heterogeneity")["ratio"], group(new, "heterogeneity")["ratio"]
    )


@pytest.mark.parametrize("function", ["vsbc", "predictive_calibration"])
def test_old_loose_replication_keywords(function):
    fn = getattr(diagnostics, function)
    loose = dict(num_simulations=4, num_svi_steps=3, num_draws=20, progress_bar=False)
    args = (random.PRNGKey(0), model, AutoNormal(model), optax.adam(0.01))
    old, new = _same(
        lambda: fn(*args, Trace_ELBO(), X, Y, **loose),
        lambda: fn(*args, Trace_ELBO(), X, Y, replications=Replications(**loose)),
    )
    name = "vsbc" if function == "vsbc" else "calibration_pit"
    for var in group(new, name).data_vars:
        np.testing.assert_array_equal(group(old, name)[var], group(new, name)[var])


def test_old_vsbc_log_likelihood_keyword():
    args = (random.PRNGKey(0), model, AutoNormal(model), optax.adam(0.01))
    replications = Replications(num_simulations=4, num_svi_steps=2, num_draws=10)
    old, new = _same(
        lambda: diagnostics.vsbc(
            *args, Trace_ELBO(), X, Y, replications=replications, log_likelihood=False
        ),
        lambda: diagnostics.vsbc(
            *args,
            Trace_ELBO(),
            X,
            Y,
            replications=replications,
            test_quantities={"log_likelihood": None},
        ),
    )
    assert set(group(old, "vsbc").data_vars) == set(group(new, "vsbc").data_vars)
    assert set(group(new, "vsbc").data_vars) == {"b"}


@pytest.mark.slow
def test_old_cross_validate_shape():
    args = (random.PRNGKey(0), model, AutoNormal(model), optax.adam(0.05))
    candidates = [Trace_ELBO(), PredictiveELBO("log", num_particles=2)]
    options = dict(candidates=candidates, num_folds=2)
    old, new = _same(
        lambda: selection.cross_validate(
            *args, 20, X, Y, num_draws=50, progress_bar=False, **options
        ),
        lambda: selection.cross_validate(
            *args,
            X,
            Y,
            fit=FitRecipe(num_steps=20, num_draws=50, progress_bar=False),
            **options,
        ),
    )
    np.testing.assert_array_equal(old.scores["mean"], new.scores["mean"])
    # num_particles= builds the default candidates with that particle count
    with pytest.warns(FutureWarning) as record:
        _, kwargs = deprecation.cross_validate(
            "cross_validate",
            args,
            {"num_particles": 2, "score": "crps"},
            default_candidates=selection.default_candidates,
        )
    assert any("default_candidates" in str(w.message) for w in record)
    expected = selection.default_candidates(args[2], "crps", num_particles=2)
    assert list(kwargs["candidates"]) == list(expected)
    assert all(c.num_particles == 2 for c in kwargs["candidates"].values())


def linear(x, y=None):
    beta = numpyro.sample("beta", dist.Normal(jnp.zeros(1), 1.0).to_event(1))
    with numpyro.plate("obs", x.shape[0]):
        numpyro.sample("y", dist.Normal(x @ beta, 0.5), obs=y)


@pytest.mark.slow
def test_old_mixture_shapes():
    design = X[:, None]
    guide = pvi_guides.AutoGaussianMixture(linear, num_components=2)
    args = (random.PRNGKey(0), linear, guide, optax.adam(0.05), StratifiedELBO())
    old, new = _same(
        lambda: pvi_guides.fit_gm_pvi(*args, 10, design, Y),
        lambda: pvi_guides.fit_gm_pvi(*args, design, Y, num_steps=10),
    )
    np.testing.assert_array_equal(old.losses, new.losses)
    key, guide, params = random.PRNGKey(1), new.guide, new.params
    old, new = _same(
        lambda: pvi_guides.prune_components(key, linear, guide, params, design, Y),
        lambda: pvi_guides.prune_components(key, params, linear, guide, design, Y),
    )
    np.testing.assert_array_equal(old[2], new[2])
    old, new = _same(
        lambda: pvi_guides.linear_predictor_score(
            guide, params, design, Y, noise_scale=0.5
        ),
        lambda: pvi_guides.linear_predictor_score(
            params, guide, design, Y, noise_scale=0.5
        ),
    )
    np.testing.assert_array_equal(old, new)
