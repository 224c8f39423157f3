"""The diagnostics on the installed ArviZ generation: ArviZ's own PSIS, the
approximation-corrected PSIS-LOO, and ArviZ ≥ 1.0's functions on the results.

The same tests run on ArviZ 0.2x (Python 3.11) and ArviZ 1.x (Python 3.12);
the generation-specific checks compare the package with what that ArviZ
itself computes.
"""

import math

import arviz as az
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
import xarray as xr
from jax import random
from scipy import stats
from scipy.special import logsumexp

from numpyro_pvi._arviz.loo import approximate_loo_pointwise
from numpyro_pvi.diagnostics import approximate_loo, pareto_smooth, to_inference_data
from tests.arviz_generation import ARVIZ_1, elpd, group

# ArviZ containers: also run in the Python 3.12 leg (ArviZ 1.x)
pytestmark = pytest.mark.py312


def _psislw(log_ratio):
    """Row-wise Pareto smoothing through the public ``pareto_smooth``."""
    rows = [pareto_smooth(row) for row in np.atleast_2d(log_ratio)]
    return (
        np.stack([r.log_weight for r in rows]).reshape(np.shape(log_ratio)),
        np.asarray([r.pareto_k for r in rows]).reshape(np.shape(log_ratio)[:-1]),
    )


# conjugate normal model: y_i ~ N(mu, 1), mu ~ N(0, 2^2)
Y = np.array([1.2, 0.3, -0.4, 2.1, 0.8, 1.5, -0.2, 0.9, 1.1, 0.4, 0.0, 2.5])
TAU0 = 2.0


def _posterior(y):
    var = 1 / (1 / TAU0**2 + len(y))
    return var * y.sum(), var


def model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, TAU0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def _guide(shift, scale):
    mean, var = _posterior(Y)

    def guide(y):
        sd = math.sqrt(var)
        numpyro.sample("mu", dist.Normal(mean + shift * sd, scale * sd))

    return guide


def _exact_loo():
    total = 0.0
    for i in range(len(Y)):
        mean, var = _posterior(np.delete(Y, i))
        total += stats.norm(mean, math.sqrt(var + 1.0)).logpdf(Y[i])
    return total


def _export(key, guide, num_draws=4000):
    return to_inference_data(
        random.PRNGKey(key), {}, model, guide, jnp.asarray(Y), num_draws=num_draws
    )


def test_pareto_smoothing_is_arviz_and_smooths_the_right_tail():
    # log ratios with a heavy right tail: exp(Gumbel / 2) has k = 0.5
    lr = 0.5 * np.random.default_rng(0).gumbel(size=2000)
    smooth = pareto_smooth(lr)
    order = np.argsort(lr)
    body = order[: lr.size - smooth.tail_length]
    # the body keeps the raw ratios (up to normalisation); only the largest
    # ratios are replaced, and they stay the largest weights
    offset = smooth.log_weight[body] - lr[body]
    np.testing.assert_allclose(offset, offset[0], atol=1e-10)
    assert np.argmax(smooth.log_weight) == order[-1]
    assert logsumexp(smooth.log_weight) == pytest.approx(0.0, abs=1e-10)
    assert 0.3 < smooth.pareto_k < 0.7
    if ARVIZ_1:
        from arviz_stats.base import array_stats

        expected_lw, expected_k = array_stats.psislw(-lr, r_eff=1.0)
    else:
        expected_lw, expected_k = az.psislw(lr.copy(), reff=1.0)
    np.testing.assert_allclose(smooth.log_weight, expected_lw)
    assert smooth.pareto_k == pytest.approx(float(expected_k))


def test_approximate_loo_of_an_exact_guide_is_plain_loo():
    data = _export(0, _guide(0.0, 1.0))
    corrected, plain = approximate_loo(data), az.loo(data)
    # lp - log_q is constant up to float32 rounding of the draws' densities
    assert elpd(corrected) == pytest.approx(elpd(plain), abs=1e-5)


def test_approximate_loo_corrects_a_shifted_narrow_guide():
    """The corrected estimate recovers the exact leave-one-out predictive of
    the conjugate posterior from a guide shifted by half a posterior sd and
    20% too wide; plain PSIS-LOO of the same draws (about 0.5 off) does not.
    Tolerances from the spread over 8 independent sets of draws."""
    guide, exact = _guide(0.5, 1.2), _exact_loo()
    corrected, plain = [], []
    for key in range(8):
        data = _export(key, guide, num_draws=2000)
        corrected.append(elpd(approximate_loo(data)))
        plain.append(elpd(az.loo(data)))
    corrected, plain = np.array(corrected), np.array(plain)
    se = corrected.std(ddof=1) / math.sqrt(corrected.size)
    assert abs(corrected.mean() - exact) < 4 * se
    assert abs(plain.mean() - exact) > 10 * se


def test_approximate_loo_pointwise_and_compare():
    exact = _export(0, _guide(0.0, 1.0))
    shifted = _export(1, _guide(1.5, 1.0))
    result = approximate_loo(exact)
    pareto_k = np.asarray(result.pareto_k).reshape(-1)
    assert pareto_k.shape == (len(Y),) and np.all(pareto_k < 0.7)
    table = az.compare(
        {"shifted": approximate_loo(shifted), "exact": approximate_loo(exact)}
    )
    assert list(table.index) == ["exact", "shifted"]
    with pytest.raises(TypeError, match="'sample_stats' group"):
        approximate_loo(az.loo(exact))


@pytest.mark.skipif(not ARVIZ_1, reason="arviz_stats.loo_approximate_posterior")
def test_loo_approximate_posterior_agrees_with_the_array_core():
    """ArviZ ≥ 1.0's own function on the stored lp / log_q equals the
    computation the ArviZ 0.2x adapter makes, on the same draws."""
    from arviz_stats import loo_approximate_posterior

    data = _export(0, _guide(0.5, 1.2))
    result = loo_approximate_posterior(
        data, data.sample_stats["lp"], data.sample_stats["log_q"], pointwise=True
    )
    assert np.isfinite(result.elpd)
    log_lik = data.log_likelihood["y"].values.reshape(-1, len(Y)).T
    elpd_i, pareto_k, p_i = approximate_loo_pointwise(
        log_lik,
        data.sample_stats["lp"].values.reshape(-1),
        data.sample_stats["log_q"].values.reshape(-1),
        _psislw,
    )
    np.testing.assert_allclose(result.elpd_i.values, elpd_i, rtol=1e-10)
    np.testing.assert_allclose(result.pareto_k.values, pareto_k, rtol=1e-10)
    assert result.elpd == pytest.approx(elpd_i.sum(), rel=1e-12)
    assert result.p == pytest.approx(p_i.sum(), rel=1e-9)
    assert approximate_loo(data).elpd == pytest.approx(result.elpd, rel=1e-12)


def test_too_few_draws_for_a_tail_fit_report_infinite_k():
    """With fewer than 5 tail draws (20 draws) there is no Pareto fit: k̂ = inf
    and the raw normalised ratios, on both ArviZ generations; arviz-stats'
    failed fit on 25 draws (NaN) is inf too; 30 draws fit."""
    lr = np.random.default_rng(1).normal(size=30)
    smooth = pareto_smooth(lr[:20])
    assert smooth.pareto_k == math.inf and smooth.tail_length == 4
    np.testing.assert_allclose(smooth.log_weight, lr[:20] - logsumexp(lr[:20]))
    assert not math.isnan(pareto_smooth(lr[:25]).pareto_k)
    smooth = pareto_smooth(lr)
    assert smooth.tail_length == 6 and math.isfinite(smooth.pareto_k)


def test_tail_length_is_arvizs():
    """The reported tail is the one ArviZ fits: a draw shorter on ArviZ ≥ 1.0
    whenever 3√S is not an integer."""
    expected = math.floor if ARVIZ_1 else math.ceil
    for num in (500, 4000, 50_000):
        smooth = pareto_smooth(np.random.default_rng(num).normal(size=num))
        assert smooth.tail_length == expected(3 * math.sqrt(num))


def test_get_group_reads_either_container():
    from numpyro_pvi.diagnostics import get_group

    data = _export(0, _guide(0.0, 1.0), num_draws=50)
    ds = get_group(data, "sample_stats")
    assert isinstance(ds, xr.Dataset) and set(ds.data_vars) == {"lp", "log_q"}
    assert ds.equals(group(data, "sample_stats"))
    with pytest.raises(KeyError, match="no group 'vsbc'"):
        get_group(data, "vsbc")
