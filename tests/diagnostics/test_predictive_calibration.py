"""Predictive calibration: PIT of held-out observations over simulated data
sets, read for bias, dispersion and uniformity."""

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import Trace_ELBO
from numpyro.infer.autoguide import AutoNormal
from scipy import stats

from numpyro_pvi import PredictiveELBO, Replications, diagnostics
from numpyro_pvi._trace.data_plate import DataPlate
from numpyro_pvi.diagnostics.predictive_calibration import pit_ranks
from tests.arviz_generation import CONTAINER, group, group_names
from tests.recipes import with_replications

N = 200


def normal_model(y=None):
    theta = numpyro.sample("theta", dist.Normal(0.0, 5.0))
    with numpyro.plate("data", N):
        numpyro.sample("y", dist.Normal(theta, 1.0), obs=y)


def wider_truth(key):
    """Lai & Yao's toy: the data are N(0, 2²), the model says N(θ, 1)."""
    return {"y": 2.0 * jax.random.normal(key, (N,))}


def _calibration(loss, data_generator, **options):
    options = with_replications(
        options,
        num_simulations=100,
        num_svi_steps=600,
        progress_bar=False,
        data_generator=data_generator,
    )
    return diagnostics.predictive_calibration(
        jax.random.PRNGKey(0),
        normal_model,
        AutoNormal(normal_model),
        optax.adam(0.05),
        loss,
        jnp.zeros(N),
        **options,
    )


LOSSES = {"VI": Trace_ELBO(), "PVI-Log": PredictiveELBO("log", num_particles=8)}


@pytest.mark.slow
@pytest.mark.parametrize(
    "loss, generator, dispersion",
    [
        ("VI", wider_truth, "too narrow"),
        ("PVI-Log", wider_truth, "ok"),
        ("VI", None, "ok"),
        ("PVI-Log", None, "ok"),
    ],
)
@pytest.mark.optimized  # run time dominates (benchmarks/RESULTS.md)
def test_known_answers_lai_yao_toy(loss, generator, dispersion):
    """Misspecified (truth N(0, 2²)): VI's predictive N(ȳ, 1 + 1/n) is too
    narrow by about 2 (spread ratio 1.8, capped by the ranks at 0 and L),
    PVI-Log's fits the spread of the data; well-specified (the model's own
    prior predictive): both are calibrated."""
    result = _calibration(LOSSES[loss], generator)
    tests = group(result, "calibration")
    assert tests["dispersion"].sel(component="y").item() == dispersion
    assert tests["direction"].sel(component="y").item() == "ok"
    uniform = float(tests["p_value_uniformity"].sel(component="y"))
    ratio = float(tests["spread_ratio"].sel(component="y"))
    if dispersion == "ok":
        assert uniform > 0.05 and 0.8 < ratio < 1.2
    else:
        assert uniform < 1e-3 and ratio > 1.5


@pytest.mark.py312
def test_layout_and_plots_agree_with_the_verdicts():
    result = _calibration(LOSSES["VI"], wider_truth, num_simulations=20)
    assert isinstance(result, CONTAINER)
    assert group_names(result) == {
        "calibration",
        "calibration_pit",
        "calibration_histogram",
        "calibration_fit_stats",
    }
    pit = group(result, "calibration_pit")
    assert pit["pit"].shape == (1, 20, 1)
    assert np.all((pit["pit"].values > 0) & (pit["pit"].values < 1))
    held = pit["held_out"].values
    assert held.shape == (1, 20) and np.all((held >= 0) & (held < N))
    assert result.attrs["loss"] == "Trace_ELBO"
    tests = group(result, "calibration")
    assert tests.attrs["data_generator"] == "wider_truth"
    for kind in ("hist", "ecdf"):
        (ax,) = diagnostics.plot_predictive_calibration(result, kind=kind)
        title = ax.get_title()
        assert f"spread: {tests['dispersion'].item()}" in title
        assert f"bias: {tests['direction'].item()}" in title
        rejected = tests["p_value_uniformity"].item() < 0.05
        assert ("uniformity: rejected" in title) == rejected
        plt.close("all")
    with pytest.raises(ValueError, match="not observed sites"):
        diagnostics.plot_predictive_calibration(result, var_names="theta")


@pytest.mark.slow
@pytest.mark.optimized  # run time dominates (benchmarks/RESULTS.md)
def test_pit_equals_the_closed_form_of_a_conjugate_normal_fit():
    """q(θ) = N(m, s²) and y ~ N(θ, 1): the predictive of y_j is
    N(m, 1 + s²), so E[rank / L] = Φ((y_j - m) / √(1 + s²)); tolerance four
    Monte Carlo standard errors of L = 20 000 draws."""
    m, s = 0.7, 0.4

    def guide(y=None):
        loc = numpyro.param("loc", m)
        numpyro.sample("theta", dist.Normal(loc, s))

    y = jnp.linspace(-2.0, 3.0, N)
    plate = DataPlate("data", -1, N, N)
    num_draws = 20_000
    for j in (0, 37, 120, 199):
        ranks = pit_ranks(
            jax.random.PRNGKey(j),
            {"loc": jnp.asarray(m)},
            numpyro.handlers.condition(normal_model, {"y": y}),
            guide,
            (),
            {},
            index=jnp.asarray(j),
            plate=plate,
            num_draws=num_draws,
        )
        expected = stats.norm.cdf((float(y[j]) - m) / np.sqrt(1 + s**2))
        tol = 4 * np.sqrt(expected * (1 - expected) / num_draws) + 1 / num_draws
        assert ranks.shape == (1,)
        assert abs(float(ranks[0]) / num_draws - expected) < tol


def count_model(y=None):
    rate = numpyro.sample("log_rate", dist.Normal(0.5, 0.3))
    with numpyro.plate("data", 50):
        numpyro.sample("y", dist.Poisson(jnp.exp(rate)), obs=y)


@pytest.mark.slow
@pytest.mark.optimized  # run time dominates (benchmarks/RESULTS.md)
def test_discrete_outcomes_use_the_randomised_pit():
    """Poisson counts near 1.6: about a quarter of the posterior-predictive
    draws tie with the held-out count; the ties are split at random, and the
    ranks are uniform (with L = 200 draws: the randomised rank is exact for
    any L)."""
    result = diagnostics.predictive_calibration(
        jax.random.PRNGKey(2),
        count_model,
        AutoNormal(count_model),
        optax.adam(0.05),
        Trace_ELBO(),
        jnp.zeros(50),
        replications=Replications(
            num_simulations=100, num_svi_steps=300, num_draws=200, progress_bar=False
        ),
    )
    tests = group(result, "calibration")
    assert tests["direction"].item() == "ok"
    assert tests["dispersion"].item() == "ok"
    assert tests["p_value_uniformity"].item() > 0.05


def two_sites(y1=None, y2=None):
    theta = numpyro.sample("theta", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", 100):
        numpyro.sample("y1", dist.Normal(theta, 1.0), obs=y1)
        numpyro.sample("y2", dist.Normal(10.0 * theta, 10.0), obs=y2)


@pytest.mark.slow
def test_two_observed_sites_are_read_apart():
    """Only y1 is misspecified (sd 2 where the model says 1); y2, on a scale
    ten times larger, is generated as modelled."""

    def generator(key):
        k1, k2, k3 = jax.random.split(key, 3)
        theta = jax.random.normal(k1)
        return {
            "y1": theta + 2.0 * jax.random.normal(k2, (100,)),
            "y2": 10.0 * theta + 10.0 * jax.random.normal(k3, (100,)),
        }

    result = diagnostics.predictive_calibration(
        jax.random.PRNGKey(2),
        two_sites,
        AutoNormal(two_sites),
        optax.adam(0.05),
        Trace_ELBO(),
        jnp.zeros(100),
        jnp.zeros(100),
        replications=Replications(
            num_simulations=100,
            num_svi_steps=500,
            data_generator=generator,
            progress_bar=False,
        ),
    )
    tests = group(result, "calibration")
    assert list(tests["component"].values) == ["y1", "y2"]
    assert tests["dispersion"].sel(component="y1").item() == "too narrow"
    assert tests["dispersion"].sel(component="y2").item() == "ok"


@pytest.mark.slow
def test_sequential_equals_vectorized():
    results = [
        _calibration(
            LOSSES["VI"],
            wider_truth,
            num_simulations=6,
            num_svi_steps=3,
            chain_method=method,
        )
        for method in ("sequential", "vectorized")
    ]
    pits = [group(r, "calibration_pit")["pit"].values for r in results]
    np.testing.assert_array_equal(pits[0], pits[1])


@pytest.mark.slow
@pytest.mark.optimized  # 2 x 100 fits of 400 steps
def test_mixture_guide_on_the_misspecified_toy():
    """A two-component mixture guide, fitted with the stratified ELBO (its VI)
    and with PVI-Log: the PIT draws are i.i.d. from the mixture's
    predictive; the known answers of the Gaussian guide hold. PVI-Log with
    M = 32 draws: with 4, a log of a mean of so few draws favours narrow
    fits (mean spread ratios over keys 1.04 in float32 and 1.10 in float64,
    against 0.95 and 1.03 with 32), enough for float64's key to read "too
    narrow"."""
    from numpyro_pvi import StratifiedELBO
    from numpyro_pvi.guides import AutoGaussianMixture

    verdicts = {}
    for name, loss in [
        ("VI", StratifiedELBO(num_particles=4)),
        ("PVI-Log", PredictiveELBO("log", num_particles=32)),
    ]:
        result = diagnostics.predictive_calibration(
            jax.random.PRNGKey(3),
            normal_model,
            AutoGaussianMixture(normal_model, num_components=2),
            optax.adam(0.05),
            loss,
            jnp.zeros(N),
            replications=Replications(
                num_simulations=100,
                num_svi_steps=400,
                data_generator=wider_truth,
                progress_bar=False,
            ),
        )
        verdicts[name] = group(result, "calibration")["dispersion"].item()
    assert verdicts == {"VI": "too narrow", "PVI-Log": "ok"}


@pytest.mark.slow
@pytest.mark.xdist_group("four_devices_vsbc")
def test_sharded_matches_vectorized_on_four_devices(four_devices_vsbc):
    # tests/sharding_worker.py: calibration_dispatch, 10 data sets of 60
    # steps; PIT values lie on a grid of 1/201 and batching may reassociate
    # floating-point sums, which can move a draw across y_j but no further
    out = four_devices_vsbc["vsbc_dispatch"]["predictive_calibration"]
    np.testing.assert_allclose(
        out["sharded"]["pit"], out["vectorized"]["pit"], atol=1.5 / 201
    )
    np.testing.assert_allclose(
        out["sharded"]["loss"], out["vectorized"]["loss"], rtol=1e-4
    )


def no_plate(y=None):
    theta = numpyro.sample("theta", dist.Normal(0.0, 1.0))
    numpyro.sample("y", dist.Normal(theta, 1.0), obs=y)


def subsampled(y=None):
    theta = numpyro.sample("theta", dist.Normal(0.0, 5.0))
    with numpyro.plate("data", N, subsample_size=20):
        batch = None if y is None else numpyro.subsample(y, event_dim=0)
        numpyro.sample("y", dist.Normal(theta, 1.0), obs=batch)


@pytest.mark.parametrize(
    "model, generator, match",
    [
        (no_plate, None, r"one observation in all \('y': 1 value;"),
        (subsampled, None, "plate 'data' is subsampled"),
        (normal_model, lambda key: {"z": jnp.zeros(N)}, "observed site 'y'"),
        (normal_model, lambda key: {"y": jnp.zeros(3)}, r"shape \(200,\)"),
        (normal_model, "prior", "data_generator must be a function"),
    ],
)
def test_bad_input(model, generator, match):
    with pytest.raises((TypeError, ValueError), match=match):
        diagnostics.predictive_calibration(
            jax.random.PRNGKey(0),
            model,
            AutoNormal(model),
            optax.adam(0.05),
            Trace_ELBO(),
            jnp.zeros(()) if model is no_plate else jnp.zeros(N),
            replications=Replications(
                num_simulations=4,
                num_svi_steps=2,
                data_generator=generator,
                progress_bar=False,
            ),
        )


def two_plates(y=None):
    """A second observed site, a function of a latent, in a plate of its own
    (as NumPyro's CUPED notebook writes it)."""
    theta = numpyro.sample("theta", dist.Normal(0.0, 1.0))
    with numpyro.plate("obs", N):
        y = numpyro.sample("y", dist.Normal(theta, 1.0), obs=y)
    with numpyro.plate("other", N):
        numpyro.sample("z", dist.Normal(0.0, 2.0), obs=y - theta)


def test_a_loss_indexing_another_plate_is_refused_with_the_plate_that_works():
    """The observations held out are those of data_plate: a PVI loss that
    indexes observations otherwise would score others."""

    def calibration(loss):
        return diagnostics.predictive_calibration(
            jax.random.PRNGKey(0),
            two_plates,
            AutoNormal(two_plates),
            optax.adam(0.05),
            loss,
            jnp.zeros(N),
            replications=Replications(
                num_simulations=2,
                num_svi_steps=2,
                num_draws=20,
                progress_bar=False,
                # data sets of one's own: z, a function of theta, is a term of
                # the joint density that prior draws of theta would not see
                data_generator=lambda key: {"y": jax.random.normal(key, (N,))},
            ),
            data_plate="obs",
        )

    for own, match in ((None, "finds no data plate"), ("other", "by 'other'")):
        loss = PredictiveELBO(num_particles=2, data_plate=own)
        with pytest.raises(ValueError, match=f"{match}.*data_plate='obs'"):
            calibration(loss)
    calibration(PredictiveELBO(num_particles=2, data_plate="obs"))
