"""VSBC (Yao et al. 2018, Algorithm 2): symmetry test, known answers, layout."""

import itertools

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

from numpyro_pvi import PredictiveELBO, Replications, SoftCVIELBO, diagnostics
from numpyro_pvi.diagnostics.rank_tests import (
    adjust_p_values,
    band_level,
    ecdf_band,
    reflection_tail,
    reflection_walk,
    symmetry_test,
)
from numpyro_pvi.diagnostics.vsbc import plot_vsbc, vsbc
from tests.arviz_generation import (
    ARVIZ_1,
    CONTAINER,
    group,
    group_names,
    netcdf_round_trip,
)
from tests.recipes import with_replications

# ArviZ containers: also run in the Python 3.12 leg (ArviZ 1.x)
pytestmark = pytest.mark.py312

# --------------------------------------------------------------------------
# the symmetry test
# --------------------------------------------------------------------------


def test_statistic_is_the_two_sample_ks_of_p_against_one_minus_p():
    rng = np.random.default_rng(1)
    grid = 8  # p = k / 8 is exact in binary, so ties between p and 1-p are exact
    for _ in range(100):
        below = rng.integers(0, grid + 1, size=15)
        p = below / grid
        walk, _ = reflection_walk(below, grid)
        for alternative, stat in (
            ("two-sided", np.abs(walk).max()),
            ("greater", max(0.0, -walk.min())),
            ("less", max(0.0, walk.max())),
        ):
            ks = stats.ks_2samp(p, 1 - p, alternative, method="asymp").statistic
            assert stat / p.size == pytest.approx(ks, abs=1e-12)


def test_reflection_p_values_are_exact_by_enumeration():
    # Under symmetry the signs of p - 1/2 are fair coins given |p - 1/2|: the
    # p-value is the fraction of the 2^n sign patterns at least as extreme.
    grid, n = 6, 10
    below = np.array([0, 1, 1, 2, 3, 3, 4, 5, 6, 6])  # ties and one p = 1/2
    centred = np.abs(2 * below - grid)
    walk, sizes = reflection_walk(below, grid)
    two, over = int(np.abs(walk).max()), int(max(0, -walk.min()))
    hits_two = hits_over = 0
    for signs in itertools.product((-1, 1), repeat=n):
        w, _ = reflection_walk((np.array(signs) * centred + grid) // 2, grid)
        hits_two += np.abs(w).max() >= two
        hits_over += max(0, -w.min()) >= over
    assert reflection_tail(sizes, two, two_sided=True) == pytest.approx(
        hits_two / 2**n, abs=1e-12
    )
    assert reflection_tail(sizes, over, two_sided=False) == pytest.approx(
        hits_over / 2**n, abs=1e-12
    )


def test_symmetry_test_holds_its_level_where_two_sample_ks_does_not():
    rng = np.random.default_rng(2)
    reps, num, draws = 400, 40, 1000
    below = rng.integers(0, draws + 1, size=(num, reps))
    ours = symmetry_test(below, draws, None, 0.05)["p_value"]
    asymptotic = np.array(
        [
            stats.ks_2samp(b / draws, 1 - b / draws, method="asymp").pvalue
            for b in below.T
        ]
    )
    se = np.sqrt(0.05 * 0.95 / reps)
    assert np.mean(ours < 0.05) <= 0.05 + 3 * se
    # the independent-samples KS p-value rejects a symmetric p about 13% of
    # the time at level 5%: it is not a valid test here
    assert np.mean(asymptotic < 0.05) > 0.05 + 3 * se


@pytest.mark.parametrize(
    "a, b, expected", [(1.0, 3.0, "over"), (3.0, 1.0, "under"), (0.3, 0.3, "ok")]
)
def test_direction_from_the_one_sided_tests(a, b, expected):
    # p piling up near 0 means θ* sits low in q: q overestimates θ.
    rng = np.random.default_rng(3)
    draws = 1000
    below = np.round(rng.beta(a, b, size=(60, 1)) * draws).astype(int)
    result = symmetry_test(below, draws, "holm", 0.05)
    assert result["direction"][0] == expected


def test_holm_and_bh_corrections():
    p = np.array([0.01, 0.04, 0.03, 0.005])
    # Holm: sorted p times (m, m-1, ...), running maximum, capped at 1
    np.testing.assert_allclose(adjust_p_values(p, "holm"), [0.03, 0.06, 0.06, 0.02])
    # BH: sorted p times m / rank, running minimum from the largest
    np.testing.assert_allclose(adjust_p_values(p, "bh"), [0.02, 0.04, 0.04, 0.02])
    np.testing.assert_allclose(
        adjust_p_values(p, "bh"), stats.false_discovery_control(p, method="bh")
    )
    np.testing.assert_allclose(adjust_p_values(p, None), p)
    np.testing.assert_allclose(
        adjust_p_values(np.array([0.5, 0.6]), "holm"), [1.0, 1.0]
    )


# --------------------------------------------------------------------------
# known answers: Bayesian linear regression with a biased guide for σ
# --------------------------------------------------------------------------


N, K = 100, 3
X = jax.random.normal(jax.random.PRNGKey(1), (N, K))


def regression(X, y=None):
    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([K]).to_event(1))
    sigma = numpyro.sample("sigma", dist.LogNormal(0.0, 0.5))
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(X @ beta, sigma), obs=y)


def fixed_scale_guide(log_sigma_scale):
    """Mean-field guide whose scale for log σ is fixed, not learned."""

    def guide(X, y=None):
        loc = numpyro.param("beta_loc", jnp.zeros(K))
        scale = numpyro.param(
            "beta_scale", 0.1 * jnp.ones(K), constraint=dist.constraints.positive
        )
        numpyro.sample("beta", dist.Normal(loc, scale).to_event(1))
        log_sigma = numpyro.param("log_sigma_loc", 0.0)
        numpyro.sample("sigma", dist.LogNormal(log_sigma, log_sigma_scale))

    return guide


def _regression_vsbc(log_sigma_scale, num_simulations):
    return vsbc(
        jax.random.PRNGKey(0),
        regression,
        fixed_scale_guide(log_sigma_scale),
        optax.adam(0.05),
        Trace_ELBO(),
        X,
        replications=Replications(
            num_simulations=num_simulations,
            num_svi_steps=300,
            num_draws=500,
            progress_bar=False,
        ),
        observed_sites=["y"],
    )


@pytest.fixture(scope="module")
def wide():
    # q(log σ) = N(m, 1) while the posterior sd of log σ is about 0.07: the
    # ELBO optimum is m = log σ̂ + 1, so q overestimates σ (p ≈ Φ(-1) ≈ 0.16
    # in every replication; 20 replications give a p-value near 2e-9).
    return _regression_vsbc(1.0, 20)


@pytest.fixture(scope="module")
def narrow():
    # q(log σ) = N(m, 0.005): unbiased (m ≈ posterior mode) but far too
    # narrow, so p ≈ Φ((log σ* - m) / 0.005) is near 0 or 1 symmetrically.
    return _regression_vsbc(0.005, 40)


def test_biased_sigma_is_flagged_over_and_coefficients_are_not(wide):
    sym = group(wide, "vsbc_symmetry")
    assert sym["direction"].sel(component="sigma").item() == "over"
    assert float(sym["p_value_adjusted"].sel(component="sigma")) < 1e-4
    betas = sym.where(sym["variable"] == "beta", drop=True)
    assert list(betas["direction"].values) == ["ok"] * K
    assert float(np.median(wide.vsbc["sigma"])) < 0.5


def test_narrow_unbiased_guide_passes_symmetry_with_u_shaped_histogram(narrow):
    sym = group(narrow, "vsbc_symmetry")
    assert sym["direction"].sel(component="sigma").item() == "ok"
    # what symmetry cannot see, dispersion and uniformity do
    assert sym["dispersion"].sel(component="sigma").item() == "too narrow"
    assert float(sym["spread_ratio"].sel(component="sigma")) > 2  # capped: p = 0, 1
    assert float(sym["p_value_uniformity"].sel(component="sigma")) < 1e-3
    counts = narrow.vsbc_histogram["count"].sel(component="sigma").values
    # a uniform p puts 2/num_bins = 2/7 of the replications in the outer bins
    assert (counts[0] + counts[-1]) / counts.sum() > 0.75
    # the coefficients are fitted well: their p is uniform, which also proves
    # that each θ* is paired with the data simulated from it
    for j in range(K):
        p = narrow.vsbc["beta"].values[0, :, j]
        assert stats.kstest(p, "uniform").pvalue > 1e-3


def test_layout_and_netcdf_round_trip(narrow, tmp_path):
    idata = narrow
    assert isinstance(idata, CONTAINER)
    assert group_names(idata) == {
        "prior",
        "vsbc",
        "prior_sbc",
        "vsbc_symmetry",
        "vsbc_fit_stats",
        "vsbc_histogram",
    }
    for name in ("prior", "vsbc", "prior_sbc"):
        ds = group(idata, name)
        assert set(ds.data_vars) == {"beta", "sigma", "log_likelihood"}
        assert ds["beta"].dims == ("chain", "draw", "beta_dim_0")
        assert ds["beta"].shape == (1, 40, K)
    p = idata.vsbc["sigma"].values
    np.testing.assert_allclose(p * 500, np.round(p * 500), atol=1e-9)
    assert np.all((p >= 0) & (p <= 1))
    assert np.all(idata.prior["sigma"].values > 0)
    assert np.all(np.isfinite(idata.vsbc_fit_stats["loss"].values))
    assert idata.vsbc_fit_stats["loss"].shape == (1, 40)
    sym = group(idata, "vsbc_symmetry")
    assert list(sym["component"].values) == [
        "beta[0]",
        "beta[1]",
        "beta[2]",
        "sigma",
        "log_likelihood",
    ]
    assert list(sym["kind"].values) == ["parameter"] * 4 + ["test quantity"]
    for name in ("dispersion", "p_value_dispersion", "spread_ratio"):
        assert sym[name].dims == ("component",)
    for name in ("p_value_uniformity", "p_value_uniformity_unadjusted"):
        assert np.all((sym[name].values >= 0) & (sym[name].values <= 1))
    hist = idata.vsbc_histogram
    np.testing.assert_array_equal(hist["count"].sum("bin").values, 40)
    np.testing.assert_allclose(hist["bin_left"].values[1:], hist["bin_right"][:-1])
    assert hist["bin_left"][0] == 0.0 and hist["bin_right"][-1] == 1.0
    assert idata.attrs["guide"] == "guide" and idata.attrs["loss"] == "Trace_ELBO"

    back = netcdf_round_trip(idata, str(tmp_path / "vsbc.nc"))
    for name in group_names(idata):
        assert group(back, name).equals(group(idata, name)), name
    assert list(back.vsbc_symmetry["direction"].values) == list(sym["direction"].values)


@pytest.mark.parametrize("kind", ["hist", "ecdf"])
def test_plot_vsbc_panels(narrow, kind):
    before = narrow.vsbc["beta"].values.copy()
    axes = plot_vsbc(narrow, kind=kind)
    assert len(axes) == K + 2 and len(axes[0].figure.axes) == K + 2
    sym = group(narrow, "vsbc_symmetry")
    for ax, label in zip(axes, sym["component"].values, strict=True):
        row = sym.sel(component=label)
        title = ax.get_title()
        assert title.startswith(str(label))
        assert f"bias: {row['direction'].item()}" in title
        assert f"spread: {row['dispersion'].item()}" in title
        rejected = float(row["p_value_uniformity"]) < 0.05
        assert ("uniformity: rejected" in title) == rejected
        if kind == "ecdf":  # the drawn curve leaves the band exactly when rejected
            row.attrs = sym.attrs
            band = ecdf_band(int(sym.attrs["num_simulations"]), 500, band_level(row))
            curve = ax.lines[0].get_ydata()
            outside = np.any(
                (curve < band.lower - band.cdf - 1e-9)
                | (curve > band.upper - band.cdf + 1e-9)
            )
            assert outside == rejected, label
            assert (ax.lines[0].get_color() == "tab:red") == rejected
    assert "spread: too narrow" in axes[K].get_title()
    plt.close("all")
    axes = plot_vsbc(narrow, kind=kind, var_names="sigma")
    assert len(axes) == 1 and len(axes[0].figure.axes) == 1
    plt.close("all")
    np.testing.assert_array_equal(narrow.vsbc["beta"].values, before)


def test_public_names():
    assert diagnostics.vsbc is vsbc and diagnostics.plot_vsbc is plot_vsbc


# --------------------------------------------------------------------------
# test quantities: the joint log-likelihood sees what marginals miss
# --------------------------------------------------------------------------

NSUM = 20


def sum_model(y=None):
    theta = numpyro.sample("theta", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    with numpyro.plate("data", NSUM):
        numpyro.sample("y", dist.Normal(theta[0] + theta[1], 1.0), obs=y)


def exact_marginals_guide(y=None):
    """Independent normals with the exact posterior marginals of sum_model:
    covariance I - n/(1+2n) 11ᵀ, mean Σ 1 Σy. The posterior correlation,
    about -0.96, is missing."""
    shrink = NSUM / (1 + 2 * NSUM)
    mean = (1 - 2 * shrink) * jnp.sum(y) * jnp.ones(2)
    zero = numpyro.param("zero", 0.0)
    numpyro.sample(
        "theta", dist.Normal(mean + zero, jnp.sqrt(1 - shrink)).expand([2]).to_event(1)
    )


def _sum_vsbc(**options):
    """VSBC of sum_model with the fixed exact-marginals guide (two steps: it
    has nothing to learn)."""
    return vsbc(
        jax.random.PRNGKey(0),
        sum_model,
        exact_marginals_guide,
        optax.adam(1e-3),
        Trace_ELBO(),
        jnp.zeros(NSUM),
        **with_replications(options, num_svi_steps=2, progress_bar=False),
    )


def test_joint_log_likelihood_flags_a_guide_with_exact_marginals():
    """Modrák et al. (2023): a guide with the exact marginals and no
    correlation passes every marginal check, while the joint log-likelihood
    (the sum θ₁ + θ₂ that the data pin down is 20 times too spread) is
    flagged: its p piles up near 1. A user quantity sees it too."""
    result = _sum_vsbc(
        num_simulations=100,
        num_draws=500,
        test_quantities={"total": lambda theta, data: jnp.sum(theta["theta"])},
    )
    sym = group(result, "vsbc_symmetry")
    for label in ("theta[0]", "theta[1]"):
        assert sym["direction"].sel(component=label).item() == "ok"
        assert sym["dispersion"].sel(component=label).item() == "ok"
    assert sym["direction"].sel(component="log_likelihood").item() == "under"
    assert sym["dispersion"].sel(component="total").item() == "too wide"
    assert float(sym["spread_ratio"].sel(component="total")) < 0.5
    # the quantities at the true values: the sum of θ*, and log p(y | θ*)
    prior = group(result, "prior")
    np.testing.assert_allclose(
        prior["total"].values, prior["theta"].values.sum(-1), rtol=1e-5
    )
    assert np.all(prior["log_likelihood"].values < 0)


def test_joint_log_likelihood_is_numpyros_log_likelihood_summed():
    from numpyro.infer.util import log_likelihood

    from numpyro_pvi._trace.data_plate import joint_log_likelihood

    y = jax.random.normal(jax.random.PRNGKey(1), (NSUM,))
    theta = {"theta": jnp.array([0.3, -1.2])}
    f = joint_log_likelihood(sum_model, lambda data: ((), {"y": data["y"]}))
    expected = log_likelihood(sum_model, {"theta": theta["theta"][None]}, y=y)["y"]
    np.testing.assert_allclose(f(theta, {"y": y}), expected.sum(), rtol=1e-6)


@pytest.mark.parametrize(
    "quantities, match",
    [
        ({"theta": lambda t, d: t["theta"][0]}, "name of a latent site"),
        ({"other": None}, "to callables"),
        ([lambda t, d: 0.0], "must be a mapping"),
        ({"bad": 3, "log_likelihood": None}, "to callables"),
        ({"bad": lambda t, d: t["nope"]}, "test quantity 'bad' failed"),
    ],
)
def test_test_quantities_bad_input(quantities, match):
    with pytest.raises((TypeError, ValueError), match=match):
        _sum_vsbc(num_simulations=4, num_draws=10, test_quantities=quantities)


def test_log_likelihood_is_in_by_default_and_can_be_replaced_or_left_out():
    """The joint log-likelihood is a test quantity unless mapped to None; a
    function of one's own under its name replaces it."""
    default = _sum_vsbc(num_simulations=4, num_draws=10)
    assert "log_likelihood" in group(default, "prior").data_vars
    total = _sum_vsbc(
        num_simulations=4,
        num_draws=10,
        test_quantities={"log_likelihood": lambda t, d: t["theta"].sum()},
    )
    prior = group(total, "prior")
    np.testing.assert_allclose(
        prior["log_likelihood"].values, prior["theta"].values.sum(axis=-1), rtol=1e-6
    )
    left_out = _sum_vsbc(
        num_simulations=4, num_draws=10, test_quantities={"log_likelihood": None}
    )
    assert "log_likelihood" not in group(left_out, "prior").data_vars


# --------------------------------------------------------------------------
# eight schools, centred vs non-centred (paper Figure 6)
# --------------------------------------------------------------------------

SIGMA = jnp.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])


def centred(sigma, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("school", 8):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.sample("y", dist.Normal(theta, sigma), obs=y)


def non_centred(sigma, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("school", 8):
        eta = numpyro.sample("eta", dist.Normal(0.0, 1.0))
        numpyro.sample("y", dist.Normal(mu + tau * eta, sigma), obs=y)


@pytest.mark.slow
def test_eight_schools_tau_centred_vs_non_centred():
    # The paper (ADVI in Stan) finds opposite directions for τ. Mean-field
    # AutoNormal with Adam reproduces a different contrast: centred, q(τ) is
    # far too narrow but centred on the truth (symmetric U-shaped p, not
    # flagged); non-centred, q underestimates τ (p piles up near 1).
    # 100 replications: the non-centred KS statistic is about 0.35, p ~ 1e-3
    # after the Holm correction over 11 components.
    result = {}
    for model in (centred, non_centred):
        result[model.__name__] = vsbc(
            jax.random.PRNGKey(0),
            model,
            AutoNormal(model),
            optax.adam(0.05),
            Trace_ELBO(),
            SIGMA,
            replications=Replications(
                num_simulations=100,
                num_svi_steps=1000,
                num_draws=1000,
                progress_bar=False,
            ),
            observed_sites=["y"],
        )
    outer = {}
    for name, idata in result.items():
        counts = idata.vsbc_histogram["count"].sel(component="tau").values
        outer[name] = (counts[0] + counts[-1]) / counts.sum()
    sym_c = result["centred"].vsbc_symmetry
    sym_nc = result["non_centred"].vsbc_symmetry
    assert outer["centred"] > 0.6 and outer["centred"] > outer["non_centred"]
    assert sym_c["direction"].sel(component="tau").item() == "ok"
    # ... which the dispersion test reads: too narrow, uniformity rejected
    assert sym_c["dispersion"].sel(component="tau").item() == "too narrow"
    assert float(sym_c["p_value_uniformity"].sel(component="tau")) < 0.05
    assert sym_nc["direction"].sel(component="tau").item() == "under"
    assert float(sym_nc["p_value_adjusted"].sel(component="tau")) < 0.05
    # the group mean is not biased in either parameterisation
    assert sym_c["direction"].sel(component="mu").item() == "ok"
    assert sym_nc["direction"].sel(component="mu").item() == "ok"


# --------------------------------------------------------------------------
# any loss, any dispatch
# --------------------------------------------------------------------------


def normal_mean(n, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", n):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


@pytest.mark.parametrize(
    "loss, chain_method",
    [
        (PredictiveELBO("log", num_particles=4), jax.vmap),
        (SoftCVIELBO(num_particles=4), "vectorized"),
    ],
    ids=["pvi-callable", "softcvi-vectorized"],
)
def test_works_with_the_package_objectives(loss, chain_method):
    idata = vsbc(
        jax.random.PRNGKey(3),
        normal_mean,
        AutoNormal(normal_mean),
        optax.adam(0.05),
        loss,
        5,
        replications=Replications(
            num_simulations=4,
            num_svi_steps=30,
            num_draws=100,
            chain_method=chain_method,
            progress_bar=True,
        ),
        observed_sites=["y"],
    )
    assert idata.attrs["loss"] == type(loss).__name__
    assert np.all(np.isfinite(idata.vsbc_fit_stats["loss"].values))
    p = idata.vsbc["mu"].values
    assert p.shape == (1, 4) and np.all((p >= 0) & (p <= 1))


# --------------------------------------------------------------------------
# dispatch: sequential / vectorized / sharded / chunked give the same answer
# --------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.xdist_group("four_devices_vsbc")
def test_sharded_matches_vectorized_on_four_devices(four_devices_vsbc):
    # the same VSBC run (a normal model with unknown mean and log scale, 10
    # replications of 60 steps) with each chain method, on four host devices
    # (tests/sharding_worker.py: vsbc_dispatch)
    out = four_devices_vsbc["vsbc_dispatch"]
    assert out["devices"] == 4
    reference = out["vectorized"]
    # 10 replications on 4 devices: padded to 12 (one chunk) or to 2 chunks of
    # 8 (chunk_size=6 is rounded up to a multiple of the device count)
    for name in ("sequential", "sharded", "sharded_chunked"):
        for var in ("mu", "log_s"):
            # p lies on a grid of 1/200; batching may reassociate floating
            # point sums, which can move a draw across θ* but no further
            np.testing.assert_allclose(
                out[name][var], reference[var], atol=1.5 / 200, err_msg=name
            )
        np.testing.assert_allclose(
            out[name]["loss"], reference["loss"], rtol=1e-4, err_msg=name
        )


# --------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------


def _call(**overrides):
    kwargs = dict(
        num_simulations=4, num_svi_steps=2, num_draws=10, observed_sites=["y"]
    )
    kwargs.update(overrides)
    return vsbc(
        jax.random.PRNGKey(0),
        regression,
        fixed_scale_guide(1.0),
        optax.adam(0.05),
        Trace_ELBO(),
        X,
        **with_replications(kwargs, progress_bar=False),
    )


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"num_simulations": 1}, "num_simulations"),
        ({"num_svi_steps": 0}, "num_svi_steps"),
        ({"num_draws": 2.5}, "num_draws"),
        ({"chain_method": "parallel"}, "chain_method"),
        ({"correction": "bonferroni"}, "correction"),
        ({"alpha": 1.0}, "alpha"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"observed_sites": ["z"]}, "z"),
        ({"observed_sites": None}, "observed_sites"),
    ],
)
def test_bad_input(overrides, match):
    with pytest.raises((ValueError, TypeError), match=match):
        _call(**overrides)


def test_plot_vsbc_bad_input(narrow):
    with pytest.raises(ValueError, match="kind"):
        plot_vsbc(narrow, kind="rank")
    with pytest.raises(ValueError, match="var_names"):
        plot_vsbc(narrow, var_names=["tau"])


def test_prior_sbc_group_is_where_arviz_calibration_plots_read(narrow):
    """``prior_sbc`` holds the p values in ArviZ's SBC layout (sample dims
    chain, draw); on ArviZ ≥ 1.0 ``arviz_plots.plot_ecdf_pit`` draws them."""
    import matplotlib.pyplot as plt

    assert group(narrow, "prior_sbc").equals(group(narrow, "vsbc"))
    if ARVIZ_1:
        from arviz_plots import plot_ecdf_pit

        plot = plot_ecdf_pit(narrow, backend="matplotlib")
        lines = plot.viz["ecdf_lines"]
        assert set(lines.data_vars) == {"beta", "sigma", "log_likelihood"}
        assert lines["beta"].sizes == {"beta_dim_0": K}
    plt.close("all")
