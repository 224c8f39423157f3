"""Efficiency of the CRPS estimators: gradient variance times step time.

An estimator that is cheaper per step but noisier needs more steps for the
same progress; what matters is the *efficiency*, the inverse of (gradient
variance × step time) on the same model. For each model and number of
particles ``M`` the guide is first fitted with ``PredictiveELBO("crps")`` (so
that the variance is measured where the optimisation spends its time, near
the optimum); there the total variance of the loss gradient (the sum over
every parameter entry of the variance over random keys) is estimated from
``--keys`` gradients per estimator, and the step times of the estimators and
of ``Trace_ELBO`` are measured interleaved in one process
(:func:`benchmarks.step_time.time_case`). Estimators:

- ``all-pairs``: the fair all-pairs estimator (``CRPS()``), ``M`` draws;
- ``derangement``: each draw paired with the next (``CRPS(estimator=
  "derangement")``), ``M`` draws;
- ``paired-2M``: Lai & Yao's estimator from ``2M`` draws, the first ``M``
  paired with the last ``M`` (:class:`SplitPairCRPS`, ``num_particles=2M``);
- ``closed-form``: Normal likelihoods only, both expectations over ``y`` given
  ``θ`` in closed form, each draw paired with the next
  (``CRPS(estimator="closed-form")``), ``M`` draws and no simulation.

Usage::

    python -m benchmarks.crps_efficiency --models glm,bnn --particles 8,64
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import optax
from jax import random
from jax.flatten_util import ravel_pytree
from numpyro.infer import SVI

from benchmarks.step_models import GUIDES, MODELS
from benchmarks.step_time import Objective, _load, _machine, time_case
from numpyro_pvi import PredictiveELBO
from numpyro_pvi.particles import Y_SIM, ParticleTerms, particle_sum, require_iid
from numpyro_pvi.scores import CRPS, Score
from numpyro_pvi.scores._sites import simulations

__all__ = [
    "ESTIMATORS",
    "SplitPairCRPS",
    "efficiency_main",
    "efficiency_table",
    "gradient_variance",
    "main",
]


class SplitPairCRPS(Score):
    r"""The paired CRPS estimator of Lai & Yao (2024): from ``2M`` draws,

    .. math::

        \widehat{S}_i = -\frac{1}{2M}\sum_{j=1}^{2M} |y_j - y_i|
        + \frac{1}{2M}\sum_{j=1}^{M} |y_j - y_{M+j}|.
    """

    name = "crps"
    requires = frozenset({Y_SIM})
    min_particles = 2

    def estimate(self, terms: ParticleTerms) -> jax.Array:
        require_iid(terms, "SplitPairCRPS")
        y_sim, y_obs = simulations(terms, self.name)
        x, y = y_sim[..., 0], y_obs[:, 0]
        n = x.shape[0]
        half = n // 2
        obs_term = particle_sum(jnp.abs(x - y)) / n
        pairs = particle_sum(jnp.abs(x[:half] - x[half : 2 * half])) / half
        return -obs_term + 0.5 * pairs


#: ``name -> (num_particles -> loss)``, the estimators compared.
ESTIMATORS = {
    "all-pairs": lambda m: PredictiveELBO(CRPS(estimator="all-pairs"), num_particles=m),
    "derangement": lambda m: PredictiveELBO(
        CRPS(estimator="derangement"), num_particles=m
    ),
    "paired-2M": lambda m: PredictiveELBO(SplitPairCRPS(), num_particles=2 * m),
    "closed-form": lambda m: PredictiveELBO(
        CRPS(estimator="closed-form"), num_particles=m
    ),
}


def _fitted_params(model, guide, args, loss, steps, seed):
    svi = SVI(model, guide, optax.adam(1e-2), loss=loss)
    result = svi.run(random.PRNGKey(seed), steps, *args, progress_bar=False)
    return svi.get_params(result.state)


def gradient_variance(loss, model, guide, args, params, num_keys, seed=1) -> float:
    """Total variance of the loss gradient at ``params`` over ``num_keys`` keys
    (the sum over parameter entries of the per-entry variance)."""

    def grad(key):
        g = jax.grad(lambda p: loss.loss(key, p, model, guide, *args))(params)
        return ravel_pytree(g)[0]

    grads = jax.jit(lambda keys: jax.lax.map(grad, keys, batch_size=8))(
        random.split(random.PRNGKey(seed), num_keys)
    )
    return float(jnp.sum(jnp.var(grads, axis=0, ddof=1)))


def efficiency_table(
    estimators: dict,
    models: Sequence[str],
    particles: Sequence[int],
    num_keys: int,
    fit_steps: int,
    reps: int,
) -> None:
    """Print the Markdown table of gradient variance, step time and
    efficiency relative to ``estimators``' first entry, for each model and
    number of particles; the guide (``AutoNormal``) is fitted with the first
    estimator."""
    print(f"machine: {_machine()}")
    print(f"load average (1/5/15 min) at start: {_load()}")
    print(
        "| model | M | estimator | gradient variance | ms/step (CPU) | "
        "÷ Trace_ELBO | efficiency ÷ first |"
    )
    print("|---|---:|---|---:|---:|---:|---:|")
    first = next(iter(estimators))
    for model_name in models:
        model, data = MODELS[model_name].make(random.PRNGKey(0))
        for m in particles:
            guide = GUIDES["AutoNormal"](model)
            fit_loss = estimators[first](m)
            params = _fitted_params(model, guide, data, fit_loss, fit_steps, 0)
            variance = {
                name: gradient_variance(make(m), model, guide, data, params, num_keys)
                for name, make in estimators.items()
            }
            timed = time_case(
                model_name,
                "AutoNormal",
                m,
                [Objective(name, make) for name, make in estimators.items()],
                reps=reps,
                clock=time.process_time,
            )
            ms = {r.objective: r.objective_ms for r in timed}
            ratio = {r.objective: r.ratio for r in timed}
            ref = variance[first] * ms[first]
            for name in estimators:
                print(
                    f"| {model_name} | {m} | {name} | {variance[name]:.4g} | "
                    f"{ms[name]:.2f} | {ratio[name]:.2f} | "
                    f"{ref / (variance[name] * ms[name]):.2f} |",
                    flush=True,
                )
    print(f"load average (1/5/15 min) at end: {_load()}")


def efficiency_main(
    estimators: dict,
    description: str,
    default_models: str,
    argv: Sequence[str] | None = None,
) -> None:
    """The command line of an efficiency benchmark: :func:`efficiency_table`
    of ``estimators`` with the models, particles, keys, fitting steps and
    timing repetitions given."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--models", default=default_models)
    parser.add_argument("--particles", default="8,64")
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--fit-steps", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args(argv)
    efficiency_table(
        estimators,
        args.models.split(","),
        [int(p) for p in args.particles.split(",")],
        args.keys,
        args.fit_steps,
        args.reps,
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry point; prints a Markdown table."""
    efficiency_main(ESTIMATORS, __doc__.split("\n\n")[0], "glm,bnn", argv)


if __name__ == "__main__":
    main()
