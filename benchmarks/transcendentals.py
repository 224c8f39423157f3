"""What one error function and one exponential cost on this CPU, alone and
inside the reductions XLA fuses them into.

The closed-form scores (the Normal CRPS: an error function and an
exponential per particle, observation and pair) are bounded below by these
evaluations. This benchmark times, on ``(M, N)`` float32 arrays, compiled
alone and interleaved:

- ``erf``, ``exp`` and both, elementwise (each result written out);
- the same summed over every element by a reduction (``jnp.sum``: XLA
  fuses the transcendental into the reduction) and by a contraction with
  vectors of ones (the elementwise result written, then read by a
  matrix-vector product);
- a multiply-add, as the memory pass every fusion pays at least.

The nanoseconds per element are the floor any step that evaluates these
functions pays per term; the difference between the reduction and the
contraction is what XLA's fused reductions cost beyond it.

Usage::

    python -m benchmarks.transcendentals                   # M = 64, N = 8000
    python -m benchmarks.transcendentals --m 128 --n 10000
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax import random
from jax.scipy.special import erf

from benchmarks.crps_floor import interleaved_medians

__all__ = ["main"]


def _both(x: jax.Array) -> jax.Array:
    return erf(x) + jnp.exp(-x * x)


def _contract(x: jax.Array) -> jax.Array:
    return jnp.ones(x.shape[0], x.dtype) @ x @ jnp.ones(x.shape[1], x.dtype)


#: name -> function of the ``(M, N)`` array.
CASES: dict[str, Callable[[jax.Array], jax.Array]] = {
    "multiply-add": lambda x: 2.0 * x + 1.0,
    "erf": erf,
    "exp": jnp.exp,
    "erf + exp": _both,
    "sum(erf) by reduction": lambda x: jnp.sum(erf(x)),
    "sum(erf) by contraction": lambda x: _contract(erf(x)),
    "sum(erf + exp) by reduction": lambda x: jnp.sum(_both(x)),
    "sum(erf + exp) by contraction": lambda x: _contract(_both(x)),
}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--m", type=int, default=64)
    parser.add_argument("--n", type=int, default=8000)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--block-seconds", type=float, default=0.1)
    args = parser.parse_args(argv)
    x = 2.0 * random.normal(random.PRNGKey(0), (args.m, args.n))
    print(
        f"({args.m}, {args.n}) float32, jax {jax.__version__}, "
        f"load {os.getloadavg()[0]:.2f}"
    )
    thunks = {}
    for name, f in CASES.items():
        g = jax.jit(f)
        thunks[name] = lambda g=g: g(x)
    medians = interleaved_medians(thunks, args.reps, args.block_seconds)
    print("| case | ms | ns per element |")
    print("|---|---:|---:|")
    for name, ms in medians.items():
        print(f"| {name} | {ms:.3f} | {ms * 1e6 / x.size:.2f} |")


if __name__ == "__main__":
    main()
