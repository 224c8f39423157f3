"""How close the Normal closed-form CRPS step is to the cost of its own
arithmetic.

``PredictiveELBO("crps")`` on a Normal likelihood computes, at every particle
``j`` and observation ``i``, :math:`\\mathbb{E}|Y_j - y_i|` and, for each
draw paired with the next, :math:`\\mathbb{E}|Y_j - Y_{j+1}|` in closed form
(:func:`numpyro_pvi._trace.normal.normal_abs_mean`: one error function and
one exponential each), where ``Trace_ELBO`` computes one Normal
log-likelihood. This benchmark times, in one process and interleaved:

- the ``Trace_ELBO`` step and the ``PredictiveELBO("crps")`` step (AutoNormal,
  ``step_models``' linear regression with ``N`` observations and ``D``
  coefficients, one jitted ``svi.update`` per call);
- the value and gradient of the closed form's terms on ``(M, N)`` arrays of
  locations and scales, compiled alone, and of the Normal log-likelihood on
  the same arrays.

The step of an objective that computes these terms cannot take less than
the ``Trace_ELBO`` step plus the difference of the two (the *floor* ratio
printed), whatever else it saves: the gap between the measured ratio and the
floor is what any rewrite of the step could still win.

Usage::

    python -m benchmarks.crps_floor                  # N = 10^4, D = 20, M = 8, 64
    python -m benchmarks.crps_floor --n 8000 --d 12 --particles 8,64
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import optax
from jax import random
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal
from numpyro_pvi._trace.normal import normal_abs_mean

from benchmarks.step_models import make_glm
from numpyro_pvi import PredictiveELBO

__all__ = ["main"]


def _step(loss, model: Callable, args: tuple) -> Callable[[], object]:
    """One jitted SVI step as a thunk (its state advances between calls)."""
    svi = SVI(model, AutoNormal(model), optax.adam(1e-3), loss=loss)
    box = [svi.init(random.PRNGKey(1), *args)]
    update = jax.jit(svi.update)

    def run() -> object:
        box[0], loss_value = update(box[0], *args)
        return loss_value

    return run


def _arithmetic(m: int, n: int) -> dict[str, Callable[[], object]]:
    """Value and gradient of the closed form's terms and of the Normal
    log-likelihood on ``(M, N)`` locations and ``(M, 1)`` scales."""
    k1, k2, k3 = random.split(random.PRNGKey(0), 3)
    loc = random.normal(k1, (m, n))
    scale = jnp.exp(0.1 * random.normal(k2, (m, 1)))
    y = random.normal(k3, (n,))

    def closed_form(loc: jax.Array, scale: jax.Array) -> jax.Array:
        obs = normal_abs_mean(y - loc, scale).sum()
        pair_scale = jnp.sqrt(jnp.square(scale) + jnp.square(jnp.roll(scale, 1, 0)))
        pair = normal_abs_mean(loc - jnp.roll(loc, 1, 0), pair_scale).sum()
        return -obs + 0.5 * pair

    def log_lik(loc: jax.Array, scale: jax.Array) -> jax.Array:
        return (-0.5 * jnp.square((y - loc) / scale) - jnp.log(scale)).sum()

    out = {}
    for name, f in (("closed form", closed_form), ("log-likelihood", log_lik)):
        g = jax.jit(jax.value_and_grad(f, argnums=(0, 1)))
        out[name] = lambda g=g: g(loc, scale)
    return out


def _time(thunk: Callable[[], object], seconds: float) -> float:
    """Milliseconds per call over a block of about ``seconds``."""
    for _ in range(3):
        out = thunk()
    jax.block_until_ready(out)
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        out = thunk()
        calls += 1
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / calls * 1e3


def arguments(description: str, *, n: int, d: int) -> argparse.ArgumentParser:
    """The command line of the CRPS step benchmarks: the regression's shape,
    the particles and the interleaved repetitions."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--n", type=int, default=n)
    parser.add_argument("--d", type=int, default=d)
    parser.add_argument("--particles", default="8,64")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--block-seconds", type=float, default=0.15)
    return parser


def interleaved_medians(
    thunks: dict[str, Callable[[], object]], reps: int, seconds: float
) -> dict[str, float]:
    """Median milliseconds per call of each thunk, timed in turn ``reps``
    times in blocks of about ``seconds``."""
    times: dict[str, list[float]] = {k: [] for k in thunks}
    for _ in range(reps):
        for name, thunk in thunks.items():
            times[name].append(_time(thunk, seconds))
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv: Sequence[str] | None = None) -> None:
    parser = arguments(__doc__.split("\n")[0], n=10_000, d=20)
    args = parser.parse_args(argv)
    model, data = make_glm(random.PRNGKey(0), n=args.n, d=args.d)
    print(
        f"linear regression N = {args.n}, D = {args.d}, jax {jax.__version__}, "
        f"load {os.getloadavg()[0]:.2f}"
    )
    print(
        "| M | Trace_ELBO ms | crps step | closed form alone | log-lik alone | floor |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for m in (int(v) for v in args.particles.split(",")):
        thunks = {
            "base": _step(Trace_ELBO(num_particles=m), model, data),
            "crps": _step(PredictiveELBO("crps", num_particles=m), model, data),
            **_arithmetic(m, args.n),
        }
        med = interleaved_medians(thunks, args.reps, args.block_seconds)
        base = med["base"]
        extra = med["closed form"] - med["log-likelihood"]
        print(
            f"| {m} | {base:.3f} | {med['crps'] / base:.2f} | "
            f"{med['closed form']:.3f} ms | {med['log-likelihood']:.3f} ms | "
            f"{(base + extra) / base:.2f} |"
        )


if __name__ == "__main__":
    main()
