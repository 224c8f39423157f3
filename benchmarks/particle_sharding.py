"""Particle-parallel scaling: step time of a BNN with M = 256 particles split
over 1 and 2 devices (:func:`numpyro_pvi.shard_particles`).

Each device count runs in its own process with
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` (host devices share
the machine's cores: N devices on C cores can at best be min(N, C) times
faster than one). In each process jitted ``svi.update`` steps of
``Trace_ELBO`` and ``PredictiveELBO`` (log, CRPS) are timed with the
particles vectorized on one device and split over all of them (warm-up
excluded, median of repetitions).

Usage::

    python benchmarks/particle_sharding.py                 # 1 and 2 devices
    python benchmarks/particle_sharding.py --devices 1,2,4 --particles 512
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

__all__ = ["main", "run_one"]

OBJECTIVES = ("trace_elbo", "pvi-log", "pvi-crps")


def run_one(n: int, hidden: int, num_particles: int, reps: int, steps: int) -> dict:
    """Time one process's steps (called inside the child process)."""
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    import optax
    from jax import random
    from numpyro.infer import SVI, Trace_ELBO
    from numpyro.infer.autoguide import AutoNormal

    from numpyro_pvi import PredictiveELBO, shard_particles

    def bnn(x, y):  # NumPyro's examples/bnn.py, two tanh layers
        d = x.shape[1]
        w1 = numpyro.sample("w1", dist.Normal(jnp.zeros((d, hidden)), 1.0))
        w2 = numpyro.sample("w2", dist.Normal(jnp.zeros((hidden, hidden)), 1.0))
        w3 = numpyro.sample("w3", dist.Normal(jnp.zeros((hidden, 1)), 1.0))
        prec = numpyro.sample("prec", dist.Gamma(3.0, 1.0))
        z = jnp.tanh(jnp.tanh(x @ w1) @ w2) @ w3
        with numpyro.plate("data", x.shape[0]):
            numpyro.sample("y", dist.Normal(z[:, 0], 1 / jnp.sqrt(prec)), obs=y)

    kx, ky = random.split(random.PRNGKey(0))
    x = random.normal(kx, (n, 10))
    y = jnp.sin(x[:, 0]) + 0.1 * random.normal(ky, (n,))
    losses = {
        "trace_elbo": lambda v: Trace_ELBO(num_particles, vectorize_particles=v),
        "pvi-log": lambda v: PredictiveELBO(
            "log", num_particles=num_particles, vectorize_particles=v
        ),
        "pvi-crps": lambda v: PredictiveELBO(
            "crps", num_particles=num_particles, vectorize_particles=v
        ),
    }
    out = {"devices": len(jax.devices()), "n": n, "M": num_particles}
    sharded = shard_particles() if len(jax.devices()) > 1 else True
    for name, make in losses.items():
        svi = SVI(bnn, AutoNormal(bnn), optax.adam(1e-3), make(sharded))
        state = svi.init(random.PRNGKey(1), x, y)
        update = jax.jit(svi.update)
        for _ in range(3):
            state, loss = update(state, x, y)
        loss.block_until_ready()
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            for _ in range(steps):
                state, loss = update(state, x, y)
            loss.block_until_ready()
            times.append((time.perf_counter() - start) / steps)
        out[name] = statistics.median(times)
    return out


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="1,2")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--particles", type=int, default=256)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = ["--n", str(args.n), "--hidden", str(args.hidden)]
    sizes += ["--particles", str(args.particles)]
    sizes += ["--reps", str(args.reps), "--steps", str(args.steps)]
    if args.child:
        result = run_one(args.n, args.hidden, args.particles, args.reps, args.steps)
        print(json.dumps(result))
        return [result]
    results = []
    for count in (int(c) for c in args.devices.split(",")):
        env = dict(os.environ)
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={count}"
        env["JAX_PLATFORMS"] = "cpu"
        proc = subprocess.run(
            [sys.executable, __file__, "--child", *sizes],
            env=env,
            capture_output=True,
            text=True,
        )
        if proc.returncode:
            raise RuntimeError(proc.stderr[-3000:])
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    base = results[0]
    print(f"cores: {os.cpu_count()}, load: {os.getloadavg()[0]:.2f}")
    print(
        f"BNN (10 -> {args.hidden} -> {args.hidden} -> 1, tanh), N = {args.n}, "
        f"M = {args.particles}, AutoNormal; particles split by shard_particles"
    )
    print(
        "| devices | "
        + " | ".join(f"{s} step (ms) | {s} speed-up" for s in OBJECTIVES)
        + " |"
    )
    print("| --- " * (1 + 2 * len(OBJECTIVES)) + "|")
    for r in results:
        cells = []
        for s in OBJECTIVES:
            cells += [f"{1e3 * r[s]:.1f}", f"{base[s] / r[s]:.2f}x"]
        print(f"| {r['devices']} | " + " | ".join(cells) + " |")
    return results


if __name__ == "__main__":
    main()
