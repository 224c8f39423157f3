"""Two call shapes, NumPyro's.

Every public function on a fitted guide takes ``(rng_key, params, model,
guide, *args, **kwargs)`` (``psis_diagnostic``'s); every one that fits takes
``(rng_key, model, guide, optim, ...)`` (``vsbc_diagnostic``'s); none takes
more than 12 parameters.
"""

import inspect

import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from jax import random
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal

import numpyro_pvi
from numpyro_pvi import FitRecipe, Replications, diagnostics, selection
from numpyro_pvi import guides as pvi_guides

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
