"""The held-out benchmark harness (benchmarks.harness, benchmarks.candidates).

A tiny synthetic regression checks the harness's output structure, that its
test numbers are ``predictive_score`` sums of the selected fits, and that
the validation step keeps the best candidate of each seed. The paper's
models are checked against the posteriordb programs when the shared data
are present.
"""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from jax import random
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoMultivariateNormal, AutoNormal

from benchmarks import candidates, dense_guide, harness, posteriordb
from numpyro_pvi import predictive_score

ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = ROOT.parent / "shared" / "data" / "posteriordb"


NUM_SEEDS = 2
NUM_DRAWS = 64
SEED = 3


def regression(x, y):
    a = numpyro.sample("a", dist.Normal(0.0, 5.0))
    b = numpyro.sample("b", dist.Normal(0.0, 5.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.Normal(a + b * x, sigma), obs=y)


@pytest.fixture(scope="module")
def run():
    rng = np.random.default_rng(0)
    x = rng.normal(size=40).astype(np.float32)
    # heavy-tailed noise: the model is misspecified, so λ matters
    y = (1.0 + 0.5 * x + rng.standard_t(2, size=40)).astype(np.float32)
    splits = [
        harness.random_split({"x": x, "y": y}, num_obs=40, seed=s)
        for s in range(NUM_SEEDS)
    ]
    guide = AutoNormal(regression)
    # one compiled fit (the λ grid) and, as validation and test have the
    # same size, one compiled scorer
    objectives = {
        "PVI-Log": candidates.pvi_objective(
            "log", num_particles=8, lams=(0.0, 0.1, 1.0), regularizers=("posterior",)
        )
    }
    results = harness.run_benchmark(
        regression,
        splits,
        objectives,
        {"diag": lambda model: guide},
        scores=("log",),
        num_steps=150,
        learning_rate=0.05,
        num_draws=NUM_DRAWS,
        seed=SEED,
    )
    return splits, guide, results


def test_split_sizes_and_disjointness():
    data = {"x": np.arange(10.0), "y": np.arange(10.0) * 2, "c": 7.0}
    split = harness.random_split(data, num_obs=10, seed=1)
    assert [len(p["y"]) for p in split] == [6, 2, 2]
    assert sorted(np.concatenate([p["x"] for p in split]).tolist()) == list(
        np.arange(10.0)
    )
    assert all(p["c"] == 7.0 for p in split)
    np.testing.assert_array_equal(split.train["y"], 2 * split.train["x"])


def test_bad_input():
    with pytest.raises(ValueError, match="fractions"):
        harness.random_split(
            {"y": np.zeros(10)}, num_obs=10, seed=0, fractions=(0.5, 0.5)
        )
    with pytest.raises(ValueError, match="select_by"):
        candidates.Objective(
            [("a", Trace_ELBO()), ("b", Trace_ELBO(num_particles=2))], select_by=None
        )
    with pytest.raises(TypeError, match="ELBO"):
        candidates.Objective([("a", "not a loss")])
    with pytest.raises(ValueError, match="lam"):
        candidates.pvi_objective("log", lams=(-1.0,))


@pytest.mark.slow
def test_result_structure(run):
    splits, _, results = run
    assert [len(p["y"]) for p in splits[0]] == [24, 8, 8]
    assert [(r.guide, r.objective) for r in results] == [("diag", "PVI-Log")]
    (r,) = results
    labels = ["lam=0", "posterior lam=0.1", "posterior lam=1"]
    assert list(r.validation) == labels and list(r.final_loss) == labels
    assert len(r.selected) == NUM_SEEDS and set(r.selected) <= set(labels)
    assert set(r.test) == {"log"}
    assert r.test["log"].shape == (NUM_SEEDS,)
    assert np.all(np.isfinite(r.test["log"]))
    for label in labels:
        assert r.validation[label].shape == (NUM_SEEDS,)
        assert np.all(np.isfinite(r.final_loss[label]))
        assert all(v.shape[0] == NUM_SEEDS for v in r.params[label].values())
    # the λ grid was fitted as distinct fits, not one fit repeated
    assert not np.allclose(r.final_loss["lam=0"], r.final_loss["posterior lam=1"])
    table = harness.format_table(results, title="toy")
    assert table.count("\n") == 2 and "| toy | diag | PVI-Log |" in table


def test_selection_keeps_best_validation_score(run):
    _, _, results = run
    pvi = results[0]
    labels = list(pvi.validation)
    table = np.stack([pvi.validation[label] for label in labels])
    assert pvi.selected == [labels[i] for i in np.argmax(table, axis=0)]


def test_test_score_is_predictive_score_sum_of_selected_fit(run):
    splits, guide, (pvi,) = run
    s = NUM_SEEDS - 1
    key = random.split(random.PRNGKey(SEED + 2), NUM_SEEDS)[s]
    params = {k: v[s] for k, v in pvi.params[pvi.selected[s]].items()}
    expected = predictive_score(
        key,
        params,
        regression,
        guide,
        score="log",
        num_draws=NUM_DRAWS,
        **splits[s].test,
    ).total
    np.testing.assert_allclose(pvi.test["log"][s], expected, rtol=1e-5)


needs_data = pytest.mark.skipif(
    not DATA_DIR.is_dir(), reason=f"posteriordb data not found at {DATA_DIR}"
)


@needs_data
def test_paper_models_match_posteriordb_programs():
    models = posteriordb.paper_models(DATA_DIR)
    assert set(models) == {"kidscore", "earnings", "nes", "glmm"}
    sizes = {"kidscore": 434, "earnings": 1192, "nes": 476, "glmm": 40}
    for key, pm in models.items():
        split = pm.splits(0)
        y = "C" if key == "glmm" else "y"
        n = sizes[key]
        assert [len(p[y]) for p in split] == [
            round(0.6 * n),
            round(0.2 * n),
            n - round(0.6 * n) - round(0.2 * n),
        ]
    # kidscore: the standardised coefficients give the posteriordb mean
    # beta1 + beta2 hs + beta3 iq + beta4 hs iq with the implied beta.
    split = models["kidscore"].splits(1)
    data = split.test
    gamma = jnp.array([0.3, -0.2, 0.5, 0.1])
    tr = numpyro.handlers.trace(
        numpyro.handlers.substitute(
            numpyro.handlers.seed(models["kidscore"].model, 0),
            data={"gamma": gamma, "sigma": 10.0},
        )
    ).get_trace(**data)
    m, s = data["x_loc"], data["x_scale"]
    slopes = data["y_scale"] * gamma[1:] / s
    intercept = data["y_loc"] + data["y_scale"] * (
        gamma[0] - jnp.sum(gamma[1:] * m / s)
    )
    hs, iq = data["x"][:, 0], data["x"][:, 1]
    np.testing.assert_array_equal(data["x"][:, 2], hs * iq)
    stan_mu = intercept + slopes[0] * hs + slopes[1] * iq + slopes[2] * hs * iq
    np.testing.assert_allclose(tr["y"]["fn"].loc, stan_mu, rtol=1e-4)
    # the constants come from the training split only
    np.testing.assert_allclose(data["y_loc"], np.mean(split.train["y"]), rtol=1e-6)


@pytest.mark.slow
def test_dense_guide_density_matches_multivariate_normal():
    """The benchmark's LAPACK-free dense guide has the same density and
    gradients as NumPyro's MultivariateNormal (batched, as under vmap)."""
    d = 6
    k1, k2, k3 = random.split(random.PRNGKey(4), 3)
    raw = random.normal(k1, (3, d, d))
    tril = jnp.tril(raw, -1) + jnp.eye(d) * jnp.exp(0.3 * raw)
    loc = random.normal(k2, (3, d))
    value = random.normal(k3, (5, 3, d)) * 2.0

    def log_probs(cls, loc, tril, value):
        return cls(loc, scale_tril=tril).log_prob(value)

    ours = dense_guide._MultivariateNormalSubstitution
    np.testing.assert_allclose(
        log_probs(ours, loc, tril, value),
        log_probs(dist.MultivariateNormal, loc, tril, value),
        rtol=1e-5,
        atol=1e-4,
    )
    grad = jax.grad(lambda *a: jnp.sum(log_probs(ours, *a)), argnums=(0, 1, 2))
    ref = jax.grad(
        lambda *a: jnp.sum(log_probs(dist.MultivariateNormal, *a)), argnums=(0, 1, 2)
    )
    for g, r in zip(grad(loc, tril, value), ref(loc, tril, value), strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4)

    # the guide: same parameters and the same loss as AutoMultivariateNormal
    x, y = jnp.linspace(-1.0, 1.0, 20), jnp.linspace(0.0, 2.0, 20)
    loss = Trace_ELBO(num_particles=4)
    params, values = [], []
    for guide in (
        dense_guide.DenseGuide(regression),
        AutoMultivariateNormal(regression),
    ):
        svi = SVI(regression, guide, optax.adam(1e-2), loss)
        p = svi.get_params(svi.init(random.PRNGKey(5), x, y))
        params.append(p)
        values.append(loss.loss(random.PRNGKey(6), p, regression, guide, x, y))
    assert jax.tree.structure(params[0]) == jax.tree.structure(params[1])
    np.testing.assert_allclose(values[0], values[1], rtol=1e-5)


def test_merge_validation_is_train_and_validation():
    """The fitting part of the cross-validated benchmark: train and
    validation concatenated, the test part untouched, constants passed."""
    data = {"x": np.arange(50.0), "y": -np.arange(50.0), "c": np.ones(3)}
    split = harness.random_split(data, num_obs=50, seed=3)
    merged = harness.merge_validation(split, ("x", "y"))
    np.testing.assert_array_equal(
        merged.train["x"], np.concatenate([split.train["x"], split.validation["x"]])
    )
    np.testing.assert_array_equal(merged.train["y"], -merged.train["x"])
    np.testing.assert_array_equal(merged.test["x"], split.test["x"])
    assert merged.validation == {} and merged.train["c"] is data["c"]
    covered = np.concatenate([merged.train["x"], merged.test["x"]])
    np.testing.assert_array_equal(np.sort(covered), data["x"])
