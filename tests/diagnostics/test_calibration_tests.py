"""The three readings of calibration ranks: symmetry (bias), dispersion
(too narrow / too wide) and the simultaneous ECDF band test of uniformity.

Ranks are simulated as VSBC produces them: the true value θ* and a
location-scale guide around the exact posterior, ``L`` guide draws counted
below θ*. Rates are measured over many replications with fixed seeds; the
tolerances are three binomial standard errors.
"""

import itertools

import numpy as np
import pytest
from scipy import optimize, special, stats

from numpyro_pvi.diagnostics.rank_tests import (
    censored_spreads,
    dispersion_test,
    ecdf_band,
    eval_points,
    holm,
    normal_scores,
    rank_datasets,
    rank_positions,
    uniformity_test,
)
from tests.arviz_generation import ARVIZ_1

ALPHA = 0.05


def _ranks(seed, num, reps, *, bias=0.0, scale=1.0, num_draws=1000):
    """``(num, reps)`` ranks of θ* among ``num_draws`` draws of a guide
    N(bias, scale²) when the exact posterior of θ* is N(0, 1)."""
    rng = np.random.default_rng(seed)
    theta = rng.standard_normal((num, reps))
    below = stats.norm.cdf((theta - bias) / scale)
    return rng.binomial(num_draws, below)


def _rates(ranks, num_draws=1000):
    tests, _ = rank_datasets(
        ranks,
        num_draws,
        {"component": np.arange(ranks.shape[1])},
        correction=None,
        alpha=ALPHA,
    )
    return {
        "direction": _counts(tests["direction"].values),
        "dispersion": _counts(tests["dispersion"].values),
        "uniformity": float(np.mean(tests["p_value_uniformity"].values < ALPHA)),
    }


def _counts(verdicts):
    values, counts = np.unique(verdicts, return_counts=True)
    return dict(zip(values.tolist(), counts.tolist(), strict=True))


def _rate(counts, key, n):
    return counts.get(key, 0) / n


def _se(p, n):
    return 3 * np.sqrt(p * (1 - p) / n)


# --------------------------------------------------------------------------
# the three readings on the guides that break VSBC
# --------------------------------------------------------------------------


@pytest.mark.slow
def test_exact_guide_is_ok_at_the_nominal_false_alarm_rate():
    reps = 1500
    r = _rates(_ranks(0, 100, reps), num_draws=1000)
    tol = _se(ALPHA, reps)
    # symmetry is exact but discrete: at most alpha
    assert 1 - _rate(r["direction"], "ok", reps) <= ALPHA + tol
    assert abs(1 - _rate(r["dispersion"], "ok", reps) - ALPHA) <= tol
    assert abs(r["uniformity"] - ALPHA) <= tol


@pytest.mark.slow
def test_too_narrow_unbiased_guide_is_ok_for_symmetry_and_flagged_for_spread():
    """σ_q = σ_post / 2: a symmetric U-shaped histogram that symmetry cannot
    see; dispersion says "too narrow", the band test rejects uniformity.
    Both have power near one with 100 replications (measured: 1.00)."""
    reps = 400
    r = _rates(_ranks(1, 100, reps, scale=0.5))
    assert 1 - _rate(r["direction"], "ok", reps) <= ALPHA + _se(ALPHA, reps)
    assert _rate(r["dispersion"], "too narrow", reps) >= 0.95
    assert r["uniformity"] >= 0.95


def test_too_wide_guide_is_flagged_too_wide():
    reps = 400
    r = _rates(_ranks(2, 100, reps, scale=2.0))
    assert _rate(r["dispersion"], "too wide", reps) >= 0.95
    assert r["uniformity"] >= 0.9
    assert 1 - _rate(r["direction"], "ok", reps) <= ALPHA + _se(ALPHA, reps)


@pytest.mark.slow
@pytest.mark.parametrize("bias, direction", [(0.8, "over"), (-0.8, "under")])
def test_biased_guide_is_flagged_in_its_direction_and_not_for_spread(bias, direction):
    """A shifted guide of the right width: the direction is flagged, while
    the dispersion test (about the scores' own mean) keeps its level."""
    reps = 400
    r = _rates(_ranks(3, 100, reps, bias=bias))
    assert _rate(r["direction"], direction, reps) >= 0.9
    assert abs(1 - _rate(r["dispersion"], "ok", reps) - ALPHA) <= _se(ALPHA, reps)
    assert r["uniformity"] >= 0.9


@pytest.mark.slow
def test_dispersion_level_with_few_draws():
    """With L = 9 draws the scores take 10 values; the moment-matched null
    keeps the level (a χ²_{R-1} null would not)."""
    reps = 4000
    rng = np.random.default_rng(4)
    ranks = rng.integers(0, 10, size=(30, reps))
    p = dispersion_test(ranks, 9)["p_value"]
    assert abs(np.mean(p < ALPHA) - ALPHA) <= _se(ALPHA, reps)


@pytest.mark.slow
def test_two_sample_ks_rejects_a_symmetric_p_too_often_as_documented():
    """The claim in symmetry_test's docstring and the README: the usual
    two-sample KS test of p against 1 - p, for 40 uniform p at level 5%,
    rejects 7.6% (SciPy's default) and 11.9% (asymptotic) of the time; this
    package's exact test about 5% (tests above)."""
    rng = np.random.default_rng(11)
    reps = 6000
    rates = {}
    for method in ("auto", "asymp"):
        rejected = [
            stats.ks_2samp(p, 1 - p, method=method).pvalue < ALPHA
            for p in rng.uniform(size=(reps, 40))
        ]
        rates[method] = np.mean(rejected)
    assert abs(rates["auto"] - 0.076) < _se(0.076, reps)  # 3 standard errors
    assert abs(rates["asymp"] - 0.119) < _se(0.119, reps)


def test_spread_ratio_estimates_the_width_error():
    """σ_post / σ_q, up to its sampling error (sd about ratio/√(2R) = 0.01)
    while few ranks hit 0 or L (their scores are capped)."""
    for scale in (0.8, 1.0, 1.25, 2.0):
        ranks = _ranks(5, 4000, 1, scale=scale, num_draws=4000)
        ratio = dispersion_test(ranks, 4000)["spread_ratio"][0]
        assert abs(ratio - 1 / scale) < 0.04 / scale


def test_spread_ratio_accounts_for_ranks_saturated_at_the_ends():
    """The issue's case: the guide 2.85 times too narrow, 120 replications,
    about a quarter of the ranks at 0 or L. The sd of the capped normal
    scores read 2.2; the censored fit recovers the ratio within its
    sampling error (sd about 0.27 here, over 30 repetitions of the study)."""
    rng = np.random.default_rng(0)
    num_draws, ratios, ends = 1000, [], []
    for _ in range(30):
        truth = 2.85 * rng.standard_normal(120)
        ranks = (rng.standard_normal((120, num_draws)) < truth[:, None]).sum(1)
        ends.append(np.mean((ranks == 0) | (ranks == num_draws)))
        ratios.append(dispersion_test(ranks[:, None], num_draws)["spread_ratio"][0])
    assert np.mean(ends) > 0.2
    assert abs(np.mean(ratios) - 2.85) < 3 * 0.27 / np.sqrt(30) + 0.1
    capped = np.std(normal_scores(ranks, num_draws), ddof=1)
    assert capped < 2.4  # what the plain sd of the scores says
    # every rank at an end, however they split between the ends: bounded
    # below only
    ends = np.array([[0, 0, 1000], [1000, 0, 0], [0, 1000, 0], [1000, 0, 0]])
    np.testing.assert_array_equal(dispersion_test(ends, 1000)["spread_ratio"], np.inf)


def _scipy_censored_spread(ranks, num_draws):
    """The reference fit of one column: L-BFGS-B on (μ, log σ)."""
    edges = special.ndtri(np.arange(num_draws + 2) / (num_draws + 1))
    lo, hi = edges[ranks], edges[ranks + 1]

    def negative_log_lik(x):
        a, b = (lo - x[0]) / np.exp(x[1]), (hi - x[0]) / np.exp(x[1])
        upper = a + b > 0  # the normal's upper tail there, without cancellation
        p = np.where(
            upper,
            stats.norm.sf(a) - stats.norm.sf(b),
            stats.norm.cdf(b) - stats.norm.cdf(a),
        )
        return -np.sum(np.log(p))

    scores = normal_scores(ranks, num_draws)
    fit = optimize.minimize(
        negative_log_lik,
        [scores.mean(), np.log(scores.std(ddof=1))],
        method="L-BFGS-B",
        options={"ftol": 1e-15, "gtol": 1e-10},
    )
    return np.exp(fit.x[1])


@pytest.mark.parametrize(
    "num_draws, num, scale, bias",
    [
        (9, 30, 1.0, 0.0),
        (99, 10, 2.0, 0.5),
        (1000, 120, 2.85, 0.0),
        (1000, 40, 0.5, 1.0),
        (4000, 20, 1.3, -0.5),
    ],
)
def test_censored_spreads_equal_a_scipy_fit_of_each_column(num_draws, num, scale, bias):
    """Newton's method on every column at once finds the maximum-likelihood
    scale that SciPy finds column by column."""
    ranks = _ranks(3, num, 12, bias=bias, scale=scale, num_draws=num_draws)
    expected = [_scipy_censored_spread(column, num_draws) for column in ranks.T]
    np.testing.assert_allclose(censored_spreads(ranks, num_draws), expected, rtol=1e-5)


def test_corrections_are_applied_like_the_symmetry_tests():
    ranks = np.concatenate([_ranks(6, 60, 3, scale=0.6), _ranks(7, 60, 3)], axis=1)
    tests, _ = rank_datasets(
        ranks, 1000, {"component": np.arange(6)}, correction="holm", alpha=ALPHA
    )
    np.testing.assert_allclose(
        tests["p_value_uniformity"], holm(tests["p_value_uniformity_unadjusted"])
    )
    raw = dispersion_test(ranks, 1000)["p_value"]
    np.testing.assert_allclose(tests["p_value_dispersion"], holm(raw))
    np.testing.assert_allclose(tests["p_value_adjusted"], holm(tests["p_value"]))


# --------------------------------------------------------------------------
# the uniformity test is exact and agrees with its band
# --------------------------------------------------------------------------


@pytest.mark.parametrize("num, num_draws", [(3, 4), (4, 2)])
def test_uniformity_p_values_are_exact_by_enumeration(num, num_draws):
    """Over every equally likely set of ranks, Pr(p ≤ p_obs) = p_obs at each
    attainable p-value."""
    sets = np.array(list(itertools.product(range(num_draws + 1), repeat=num)))
    p = uniformity_test(sets.T, num_draws)
    for value in np.unique(p):
        np.testing.assert_allclose(np.mean(p <= value + 1e-12), value, atol=1e-9)


def test_ecdf_leaves_the_band_exactly_when_the_p_value_is_at_most_its_level():
    num, num_draws = 60, 1000
    ranks = np.concatenate([_ranks(8, num, 60), _ranks(9, num, 60, scale=0.7)], axis=1)
    p = uniformity_test(ranks, num_draws)
    for level in (0.95, 0.99):
        band = ecdf_band(num, num_draws, level)
        assert band.level >= level
        for j in range(ranks.shape[1]):
            u = np.sort(rank_positions(ranks[:, j], num_draws))
            ecdf = np.searchsorted(u, band.z, side="right") / num
            outside = np.any((ecdf < band.lower) | (ecdf > band.upper))
            assert outside == (p[j] <= 1 - band.level + 1e-12), (level, j, p[j])


@pytest.mark.py312
def test_band_is_arviz_simultaneous_band():
    """ArviZ 0.2x's optimised band (the same recursion, its pointwise level
    found by a continuous search) agrees to one count; ArviZ ≥ 1.0's
    simulated band (1000 simulations) to its simulation error."""
    num, num_draws, prob = 100, 1000, 0.94
    band = ecdf_band(num, num_draws, prob)
    if ARVIZ_1:
        from arviz_stats.ecdf_utils import (
            get_pointwise_confidence_band,
            simulate_confidence_bands,
        )

        pointwise = simulate_confidence_bands(
            num, 1, band.z, prob, 1000, np.random.default_rng(0)
        )
        lower, upper = get_pointwise_confidence_band(pointwise, num, band.z)
        atol = 2.0 / num
    else:
        from arviz.stats.ecdf_utils import ecdf_confidence_band

        lower, upper = ecdf_confidence_band(
            num, band.z, band.cdf, prob=prob, method="optimized"
        )
        atol = 1.0 / num
    np.testing.assert_allclose(band.lower, lower, atol=atol + 1e-12)
    np.testing.assert_allclose(band.upper, upper, atol=atol + 1e-12)


def test_band_holds_uniform_ecdfs_at_its_level():
    num, num_draws, reps = 100, 1000, 2000
    band = ecdf_band(num, num_draws, 0.94)
    ranks = np.random.default_rng(10).integers(0, num_draws + 1, size=(reps, num))
    u = np.sort(rank_positions(ranks, num_draws), axis=1)
    ecdf = np.stack([np.searchsorted(row, band.z, side="right") / num for row in u])
    inside = np.all((ecdf >= band.lower) & (ecdf <= band.upper), axis=1)
    assert abs(inside.mean() - band.level) <= _se(band.level, reps)


def test_eval_points_use_the_discrete_null_cdf():
    z, cdf = eval_points(3)
    # ranks 0..3 sit at 1/8, 3/8, 5/8, 7/8
    np.testing.assert_allclose(np.unique(cdf), [0.25, 0.5, 0.75])
    assert np.all(np.diff(z) > 0)
