"""What each speed-only path earns on a realistic model's whole step.

A speed-only path is kept only where it earns at least 3x. For each path the
benchmark times the jitted ``svi.update`` of ``PredictiveELBO(score)`` with
the path on, then replaces it with what NumPyro and JAX do by themselves
(NumPyro's own sampler, ``jax.random.poisson``, ``gammaincc``, the pmf over
the support) and times the same step again, in interleaved blocks; the
ratio of the medians is what the path earns.

Usage::

    python -m benchmarks.speed_paths                    # every case
    python -m benchmarks.speed_paths --cases gamma,poisson_cdf
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import random
from jax.scipy.special import gammaincc, gammaln

from benchmarks.step_models import GUIDES, MODELS
from benchmarks.step_time import _Runner
from numpyro_pvi import PredictiveELBO


def _numpyro_samplers() -> None:
    """NumPyro's own ``sample`` for every distribution (no registry entry)."""
    from numpyro_pvi.scores import simulation

    simulation._SAMPLERS.clear()


def _jax_gamma_rates() -> None:
    """A negative binomial's Gamma rates from ``jax.random.gamma``."""
    from numpyro_pvi.scores.closed_forms import counts

    counts.standard_gamma = lambda key, a, shape: random.gamma(key, a, shape)


def _jax_poisson() -> None:
    """The Poisson cdf and pmf from ``gammaincc`` and ``gammaln``, and the
    counts from ``jax.random.poisson``."""
    from numpyro_pvi.scores.closed_forms import counts

    def cdf_pmf(rate: jax.Array, n: jax.Array) -> tuple[jax.Array, jax.Array]:
        k = jnp.maximum(n, 0.0)
        cdf = jnp.where(n < 0, 0.0, gammaincc(k + 1.0, rate))
        pmf = jnp.where(n < 0, 0.0, jnp.exp(k * jnp.log(rate) - rate - gammaln(k + 1)))
        return jax.lax.stop_gradient(cdf), jax.lax.stop_gradient(pmf)

    def draws(key: jax.Array, rate: jax.Array, num_rows: int) -> jax.Array:
        rate = jax.lax.stop_gradient(jnp.broadcast_to(rate, (num_rows, rate.shape[1])))
        return random.poisson(key, rate, rate.shape).astype(rate.dtype)

    counts.poisson_cdf_pmf, counts.poisson_draws = cdf_pmf, draws


def _pmf_over_the_support() -> None:
    """The Binomial's pmf over its support, not its logits in closed form."""
    from numpyro_pvi.scores import crps_pmf, quadratic

    quadratic.binomial_parts = crps_pmf.binomial_parts = lambda *a, **k: None


#: case -> (model, score, M, the path replaced)
CASES: dict[str, tuple[str, str, int, Callable[[], None]]] = {
    "gamma": ("gamma", "crps", 8, _numpyro_samplers),
    "beta": ("beta", "crps", 8, _numpyro_samplers),
    "student": ("student", "crps", 8, _numpyro_samplers),
    "student_64": ("student", "crps", 64, _numpyro_samplers),
    "negative_binomial": ("negative_binomial", "crps", 8, _jax_gamma_rates),
    "poisson_cdf": ("poisson", "crps", 8, _jax_poisson),
    "binomial_40": ("binomial_40", "quadratic", 8, _pmf_over_the_support),
    "binomial": ("binomial", "quadratic", 8, _pmf_over_the_support),
}


def earns(case: str, reps: int = 11) -> str:
    """One case's table row (the replacement is global: one case per
    process)."""
    model_name, score, m, replace = CASES[case]
    model, args = MODELS[model_name].make(random.PRNGKey(0))
    key = random.PRNGKey(1)

    def runner() -> _Runner:
        loss = PredictiveELBO(score, num_particles=m)
        return _Runner(
            model, GUIDES["AutoNormal"](model), loss, args, key, 0.1, time.perf_counter
        )

    with_path = runner()
    replace()
    without = runner()
    for _ in range(reps):
        with_path.time_block()
        without.time_block()
    a, b = (statistics.median(r.times) * 1e3 for r in (with_path, without))
    where = f"{model_name} ({score}, M = {m})"
    return f"| {case} | {where} | {a:.2f} | {b:.2f} | {b / a:.1f}× |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--reps", type=int, default=11)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a case, in this process
    args = parser.parse_args()
    if args.one:
        warnings.simplefilter("ignore")
        print(earns(args.one, args.reps), flush=True)
        return
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    print("| path | model | with, ms | without, ms | earns |")
    print("|---|---|---:|---:|---:|")
    for case in args.cases.split(","):  # each replacement in a process of its own
        command = [sys.executable, "-m", "benchmarks.speed_paths", "--one", case]
        subprocess.run([*command, "--reps", str(args.reps)], check=True)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
