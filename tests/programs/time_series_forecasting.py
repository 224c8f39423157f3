"""The seasonal, global-trend model (SGT) of NumPyro's time-series
forecasting notebook: a ``scan`` over the series whose observed site is
conditioned with ``handlers.condition`` on ``y[1:]``, whose transition reads
the lagged data ``y[t]`` from the argument, and whose Cauchy priors are
scaled by ``jnp.max(y)``."""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.contrib.control_flow import scan
from numpyro.infer.autoguide import AutoNormal

SOURCE = (
    "pyro-ppl/numpyro notebooks/source/time_series_forecasting.ipynb (sgt), "
    "commit 0b935d48"
)
TRAITS = (
    "scan",
    "condition handler inside the model",
    "lagged data read from the argument",
    "priors scaled by the data",
    "keyword static argument",
)


def sgt(y, seasonality, future=0):
    # heuristically, standard derivation of Cauchy prior depends on
    # the max value of data
    cauchy_sd = jnp.max(y) / 150

    # NB: priors' parameters are taken from
    # https://github.com/cbergmeir/Rlgt/blob/master/Rlgt/R/rlgtcontrol.R
    nu = numpyro.sample("nu", dist.Uniform(2, 20))
    powx = numpyro.sample("powx", dist.Uniform(0, 1))
    sigma = numpyro.sample("sigma", dist.HalfCauchy(cauchy_sd))
    offset_sigma = numpyro.sample(
        "offset_sigma", dist.TruncatedCauchy(low=1e-10, loc=1e-10, scale=cauchy_sd)
    )

    coef_trend = numpyro.sample("coef_trend", dist.Cauchy(0, cauchy_sd))
    pow_trend_beta = numpyro.sample("pow_trend_beta", dist.Beta(1, 1))
    # pow_trend takes values from -0.5 to 1
    pow_trend = 1.5 * pow_trend_beta - 0.5
    pow_season = numpyro.sample("pow_season", dist.Beta(1, 1))

    level_sm = numpyro.sample("level_sm", dist.Beta(1, 2))
    s_sm = numpyro.sample("s_sm", dist.Uniform(0, 1))
    init_s = numpyro.sample("init_s", dist.Cauchy(0, y[:seasonality] * 0.3))

    def transition_fn(carry, t):
        level, s, moving_sum = carry
        season = s[0] * level**pow_season
        exp_val = level + coef_trend * level**pow_trend + season
        exp_val = jnp.clip(exp_val, 0)
        # use expected vale when forecasting
        y_t = jnp.where(t >= N, exp_val, y[t])

        moving_sum = (
            moving_sum + y[t] - jnp.where(t >= seasonality, y[t - seasonality], 0.0)
        )
        level_p = jnp.where(t >= seasonality, moving_sum / seasonality, y_t - season)
        level = level_sm * level_p + (1 - level_sm) * level
        level = jnp.clip(level, 0)

        new_s = (s_sm * (y_t - level) / season + (1 - s_sm)) * s[0]
        # repeat s when forecasting
        new_s = jnp.where(t >= N, s[0], new_s)
        s = jnp.concatenate([s[1:], new_s[None]], axis=0)

        omega = sigma * exp_val**powx + offset_sigma
        y_ = numpyro.sample("y", dist.StudentT(nu, exp_val, omega))

        return (level, s, moving_sum), y_

    N = y.shape[0]
    level_init = y[0]
    s_init = jnp.concatenate([init_s[1:], init_s[:1]], axis=0)
    moving_sum = level_init
    with numpyro.handlers.condition(data={"y": y[1:]}):
        _, ys = scan(
            transition_fn, (level_init, s_init, moving_sum), jnp.arange(1, N + future)
        )
    if future > 0:
        numpyro.deterministic("y_forecast", ys[-future:])


model = sgt


def make_guide(model):
    return AutoNormal(model)


def _data(seed, n):
    """A positive seasonal series of the notebook's training length (80) and
    period (38), in place of the lynx counts. (On a series that comes within
    about 300 of zero, NumPyro's own ``Trace_ELBO(num_particles=4)`` reads NaN
    from its second step: a draw of the seasonal terms near zero divides by
    them.)"""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    y = 2000 + 800 * np.sin(2 * np.pi * t / 38) + 50 * rng.standard_normal(n)
    return (jnp.asarray(y, jnp.float32),), {"seasonality": 38}


def data(seed=0):
    return _data(seed, 80)


def held_out(seed=1):
    return _data(seed, 80)
