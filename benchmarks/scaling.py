"""Data-parallel scaling: step time with data sharded over 1, 2 and 4 devices.

Each device count runs in its own process with
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` (host devices share the
machine's cores, so N devices on C cores can at best be min(N, C) times faster
than one). In each process the data of a large synthetic regression are placed
with :func:`numpyro_pvi.sharding.shard_data` and jitted ``svi.update`` steps of
``PredictiveELBO("log")`` and ``PredictiveELBO("crps")`` are timed (warm-up
excluded, median of repetitions).

Usage::

    python benchmarks/scaling.py                  # 1, 2, 4 devices
    python benchmarks/scaling.py --devices 1,2 --n 400000 --reps 7
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

OBJECTIVES = ("log", "crps")


def run_one(n: int, d: int, num_particles: int, reps: int, steps: int) -> dict:
    """Time one process's steps (called inside the child process)."""
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    import optax
    from jax import random
    from numpyro.infer import SVI
    from numpyro.infer.autoguide import AutoNormal

    from numpyro_pvi import PredictiveELBO
    from numpyro_pvi.sharding import shard_data

    def model(x, y):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([d]).to_event(1))
        sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
        with numpyro.plate("data", x.shape[0]):
            numpyro.sample("y", dist.StudentT(4.0, x @ w, sigma), obs=y)

    kx, ky = random.split(random.PRNGKey(0))
    x = random.normal(kx, (n, d))
    y = x @ jnp.linspace(-1, 1, d) + random.normal(ky, (n,))
    xs, ys = shard_data(x, y)
    out = {"devices": len(jax.devices()), "n": n, "d": d, "M": num_particles}
    for score in OBJECTIVES:
        guide = AutoNormal(model)
        svi = SVI(
            model,
            guide,
            optax.adam(1e-3),
            PredictiveELBO(score, num_particles=num_particles),
        )
        state = svi.init(random.PRNGKey(1), xs, ys)
        update = jax.jit(svi.update)
        for _ in range(3):
            state, loss = update(state, xs, ys)
        loss.block_until_ready()
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            for _ in range(steps):
                state, loss = update(state, xs, ys)
            loss.block_until_ready()
            times.append((time.perf_counter() - start) / steps)
        out[score] = statistics.median(times)
    return out


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="1,2,4")
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--d", type=int, default=20)
    parser.add_argument("--particles", type=int, default=16)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        result = run_one(args.n, args.d, args.particles, args.reps, args.steps)
        print(json.dumps(result))
        return [result]
    results = []
    for count in (int(c) for c in args.devices.split(",")):
        env = dict(os.environ)
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={count}"
        env["JAX_PLATFORMS"] = "cpu"
        cmd = [sys.executable, __file__, "--child", "--n", str(args.n)]
        cmd += ["--d", str(args.d), "--particles", str(args.particles)]
        cmd += ["--reps", str(args.reps), "--steps", str(args.steps)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(proc.stderr[-3000:])
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    base = results[0]
    print(f"cores: {os.cpu_count()}, load: {os.getloadavg()[0]:.1f}")
    print(
        f"N = {args.n}, D = {args.d}, M = {args.particles}, Student-t regression, "
        "AutoNormal"
    )
    print(
        "| devices | " + " | ".join(f"{s} step (ms) | {s} speed-up" for s in OBJECTIVES)
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
