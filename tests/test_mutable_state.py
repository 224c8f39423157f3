"""``numpyro.mutable`` sites (the running statistics of a flax or haiku
batch-norm layer under ``flax_module(..., mutable=[...])``): NumPyro's
``Trace_ELBO`` returns their values with one particle and ``SVI`` carries
them from step to step. Every objective returns them (from one trace of
guide and model), so ``SVI.run`` keeps its state's structure; the test is
NumPyro's own ``test_mutable_state`` with each objective (an observed site
added, which the predictive objectives score)."""

import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from jax import random
from numpyro import optim
from numpyro.infer import SVI

from numpyro_pvi import (
    PACmELBO,
    PredictiveELBO,
    SNISForwardKL,
    SoftCVIELBO,
    StratifiedELBO,
)

pytestmark = pytest.mark.py312


def model():
    x = numpyro.sample("x", dist.Normal(-1, 1))
    numpyro.primitives.mutable("x1p", x + 1)
    numpyro.sample("obs", dist.Normal(x, 1.0), obs=np.array([0.5, 1.0]))


def guide():
    loc = numpyro.param("loc", 0.0)
    p = numpyro.primitives.mutable("loc1p", {"value": None})
    # the content of a dict-valued mutable site can be changed in place
    p["value"] = loc + 2
    numpyro.sample("x", dist.Normal(loc, 0.1))


OBJECTIVES = {
    "log": lambda: PredictiveELBO("log", num_particles=4),
    "crps": lambda: PredictiveELBO("crps", num_particles=4),
    "PACmELBO": lambda: PACmELBO(num_particles=4),
    "SoftCVIELBO": lambda: SoftCVIELBO(num_particles=4),
    "SNISForwardKL": lambda: SNISForwardKL(num_particles=4),
    "StratifiedELBO": lambda: StratifiedELBO(num_particles=4),
}


@pytest.mark.parametrize("stable_update", [False, True])
@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_every_objective_carries_the_mutable_state(name, stable_update):
    svi = SVI(model, guide, optim.Adam(0.1), OBJECTIVES[name]())
    result = svi.run(
        random.PRNGKey(0), 300, progress_bar=False, stable_update=stable_update
    )
    state = result.state.mutable_state
    assert set(state) == {"x1p", "loc1p"}
    # the guide's site follows the fitted parameter (one step behind it)
    np.testing.assert_allclose(
        state["loc1p"]["value"], result.params["loc"] + 2, atol=0.1
    )
    # the model's is set once, from the initial draw near 0, as under Trace_ELBO
    np.testing.assert_allclose(state["x1p"], 1.0, atol=0.2)
