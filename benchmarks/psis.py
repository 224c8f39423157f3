"""Cost of ``diagnostics.psis`` against NumPyro's ``psis_diagnostic``.

Same model, guide, fitted parameters and number of draws S; both warmed up
once (compilation excluded), then timed in interleaved repetitions; the
median ratio is reported. ``psis`` additionally returns the draws, the
smoothed weights and the InferenceData; ``psis_diagnostic`` returns k̂ only.

Usage: ``python benchmarks/psis.py [--draws 10000] [--reps 7]``
"""

from __future__ import annotations

import argparse
import functools
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax import random
from numpyro.infer import SVI, Trace_ELBO, psis_diagnostic
from numpyro.infer.autoguide import AutoNormal

from numpyro_pvi.diagnostics import psis

__all__ = ["main"]


def eight_schools(sigma, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("school", sigma.shape[0]):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.sample("obs", dist.Normal(theta, sigma), obs=y)


def logistic(x, y=None):
    beta = numpyro.sample(
        "beta", dist.Normal(0.0, 1.0).expand([x.shape[1]]).to_event(1)
    )
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=x @ beta), obs=y)


def _problems():
    sigma = jnp.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])
    y = jnp.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
    x = random.normal(random.PRNGKey(0), (500, 10))
    beta = jnp.linspace(-1.0, 1.0, 10)
    labels = random.bernoulli(random.PRNGKey(1), jax.nn.sigmoid(x @ beta)).astype(float)
    return {
        "eight_schools": (eight_schools, (sigma, y)),
        "logistic_500x10": (logistic, (x, labels)),
    }


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--draws", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=7)
    ns = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    print(f"S = {ns.draws}, {ns.reps} interleaved repetitions, jax {jax.__version__}")
    print(f"{'model':<18}{'psis [s]':>10}{'numpyro [s]':>13}{'ratio':>8}{'k̂':>7}")
    for name, (model, args) in _problems().items():
        guide = AutoNormal(model)
        svi = SVI(model, guide, numpyro.optim.Adam(0.05), Trace_ELBO())
        params = svi.run(random.PRNGKey(0), 500, *args, progress_bar=False).params
        ours = functools.partial(
            psis, random.PRNGKey(1), params, model, guide, *args, num_draws=ns.draws
        )
        ref = functools.partial(
            psis_diagnostic,
            random.PRNGKey(1),
            params,
            model,
            guide,
            *args,
            num_particles=ns.draws,
        )
        idata = ours()  # warm-up: compilation
        ref()
        times_ours, times_ref = [], []
        for _ in range(ns.reps):
            times_ours.append(_time(ours))
            times_ref.append(_time(ref))
        t_ours, t_ref = np.median(times_ours), np.median(times_ref)
        k = float(idata["psis"]["pareto_k"])
        print(f"{name:<18}{t_ours:>10.4f}{t_ref:>13.4f}{t_ours / t_ref:>8.2f}{k:>7.2f}")


if __name__ == "__main__":
    main()
