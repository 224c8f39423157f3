"""Contract tests over a registry of objectives x guides.

Every objective must give a finite scalar loss under ``jit`` and run
``SVI.run`` with every autoguide and a hand-written guide, on a model with a
subsampled data plate, for any supported number of particles. Objectives that
cannot work with a guide (no density to evaluate) must say so with a clear
error instead.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from jax import random
from numpyro.infer import SVI
from numpyro.infer.autoguide import (
    AutoBNAFNormal,
    AutoDelta,
    AutoDiagonalNormal,
    AutoIAFNormal,
    AutoLowRankMultivariateNormal,
    AutoMultivariateNormal,
    AutoNormal,
)

import numpyro_pvi
from numpyro_pvi.guides import AutoFlow


class Objective(NamedTuple):
    name: str
    make: object  # num_particles -> ELBO
    min_particles: int = 1
    #: guide names this objective rejects with a clear ValueError (match text)
    rejects: dict = {}


N, B = 12, 5
OBJECTIVES = [
    Objective(
        "pvi-log-prior", lambda m: numpyro_pvi.PredictiveELBO("log", num_particles=m)
    ),
    Objective(
        "pvi-log-posterior",
        lambda m: numpyro_pvi.PredictiveELBO(
            "log", num_particles=m, regularizer="posterior", lam=0.1
        ),
    ),
    Objective(
        "pvi-log-rejection",
        lambda m: numpyro_pvi.PredictiveELBO(
            "log",
            num_particles=m,
            regularizer=None,
            log_score_estimator="rejection",
            likelihood_bound=1 / np.sqrt(2 * np.pi),
        ),
        # AutoDelta has no density: its score function is undefined
        rejects={"AutoBNAFNormal": "cannot evaluate", "AutoDelta": "density"},
    ),
    Objective("pacm", lambda m: numpyro_pvi.PACmELBO(num_particles=m, beta=0.5)),
    Objective(
        "pvi-crps",
        lambda m: numpyro_pvi.PredictiveELBO("crps", num_particles=m),
        min_particles=2,
    ),
    Objective(
        "softcvi",
        lambda m: numpyro_pvi.SoftCVIELBO(num_particles=m, alpha=0.75),
        min_particles=2,
        rejects={"AutoBNAFNormal": "no inverse", "AutoDelta": "no density"},
    ),
    Objective(
        "snis-fkl",
        lambda m: numpyro_pvi.SNISForwardKL(num_particles=m, low_variance=True),
        min_particles=2,
        rejects={"AutoBNAFNormal": "no inverse", "AutoDelta": "no density"},
    ),
]


def model(x, y, subsample_size=None):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Normal(x[idx] @ w + b, 1.0), obs=y[idx])


def hand_written_guide(x, y, subsample_size=None):
    loc = numpyro.param("w_loc", jnp.zeros(2))
    scale = numpyro.param("w_scale", jnp.ones(2), constraint=dist.constraints.positive)
    w = numpyro.sample("w", dist.Normal(loc, scale).to_event(1))
    b_loc = numpyro.param("b_loc", 0.0)
    numpyro.sample("b", dist.Normal(b_loc + 0.1 * w.sum(), 0.5))


GUIDES = {
    "AutoNormal": AutoNormal,
    "AutoDiagonalNormal": AutoDiagonalNormal,
    "AutoMultivariateNormal": AutoMultivariateNormal,
    "AutoLowRankMultivariateNormal": lambda m: AutoLowRankMultivariateNormal(m, rank=1),
    "AutoIAFNormal": lambda m: AutoIAFNormal(m, num_flows=1, hidden_dims=[4]),
    "AutoBNAFNormal": lambda m: AutoBNAFNormal(m, num_flows=1, hidden_factors=[2]),
    "AutoDelta": AutoDelta,
    "AutoFlow": lambda m: AutoFlow(m, num_layers=2, hidden_dim=4),
    "hand-written": lambda m: hand_written_guide,
}


def _data():
    kx, ky = random.split(random.PRNGKey(0))
    x = random.normal(kx, (N, 2))
    return x, x @ jnp.array([1.0, -1.0]) + random.normal(ky, (N,))


#: particle counts are spread over the guides so that every objective runs with
#: 1 (where allowed), 2 and 16 particles without compiling each case twice
PARTICLES = {"AutoNormal": 1, "AutoDiagonalNormal": 16, "AutoFlow": 1}


def _run(objective, guide_name, num_particles, steps=3):
    """``SVI.run`` compiles the update step: the loss runs under ``jit``."""
    x, y = _data()
    guide = GUIDES[guide_name](model)
    svi = SVI(model, guide, optax.adam(0.01), objective.make(num_particles))
    result = svi.run(random.PRNGKey(1), steps, x, y, B, progress_bar=False)
    return result.losses, result.params


def _fast(objective_index: int, guide_index: int) -> bool:
    """The fast tier's cover of the matrix: every guide with one objective
    and every objective with at least one guide (rotating), and every
    rejection; the slow tier runs the whole matrix."""
    objective, guide = OBJECTIVES[objective_index], list(GUIDES)[guide_index]
    return (
        guide in objective.rejects or guide_index % len(OBJECTIVES) == objective_index
    )


MATRIX = [
    pytest.param(
        objective,
        guide,
        marks=() if _fast(i, j) else pytest.mark.slow,
        id=f"{objective.name}-{guide}",
    )
    for i, objective in enumerate(OBJECTIVES)
    for j, guide in enumerate(GUIDES)
]


@pytest.mark.parametrize("objective, guide_name", MATRIX)
def test_objective_runs_with_guide(objective, guide_name):
    m = max(PARTICLES.get(guide_name, 2), objective.min_particles)
    if guide_name in objective.rejects:
        with pytest.raises(ValueError, match=objective.rejects[guide_name]):
            _run(objective, guide_name, m)
        return
    losses, params = _run(objective, guide_name, m)
    assert losses.shape == (3,)
    assert jnp.all(jnp.isfinite(losses))
    leaves = jax.tree.leaves(params)
    assert leaves and all(jnp.all(jnp.isfinite(v)) for v in leaves)


@pytest.mark.parametrize("objective", OBJECTIVES, ids=lambda o: o.name)
def test_objective_rejects_too_few_particles(objective):
    with pytest.raises(ValueError, match="num_particles"):
        objective.make(objective.min_particles - 1)
    with pytest.raises(ValueError, match="num_particles"):
        objective.make(2.0)
