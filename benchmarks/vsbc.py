"""VSBC throughput: replications per second, sequential vs vectorized vs sharded.

Eight schools (non-centred) with ``AutoNormal`` and ``Trace_ELBO``: 200
replications of 1000 SVI steps and 1000 guide draws each. Every host device
count (1, 2, 4) runs in its own process
(``XLA_FLAGS=--xla_force_host_platform_device_count=N``); inside a process the
methods are timed side by side, interleaved (A, B, C, A, B, C, ...), after one
compiling call each, and the median is reported. Within each process
``vectorized`` runs on one device, so ``sharded / vectorized`` is the speed-up
from using N devices measured in one process.

Usage::

    python benchmarks/vsbc.py [--replications 200] [--steps 1000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

__all__ = ["main"]

SIGMA = [15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0]


def _worker(args: argparse.Namespace) -> dict:
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    import optax
    from numpyro.infer import Trace_ELBO
    from numpyro.infer.autoguide import AutoNormal

    from numpyro_pvi import Replications
    from numpyro_pvi.diagnostics._replications import dispatcher
    from numpyro_pvi.diagnostics.vsbc import _setup

    sigma = jnp.asarray(SIGMA)

    def eight_schools(sigma, y=None):
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
        with numpyro.plate("school", sigma.shape[0]):
            eta = numpyro.sample("eta", dist.Normal(0.0, 1.0))
            numpyro.sample("y", dist.Normal(mu + tau * eta, sigma), obs=y)

    one, inputs, *_ = _setup(
        jax.random.PRNGKey(0),
        (eight_schools, AutoNormal(eight_schools), optax.adam(0.05), Trace_ELBO()),
        (sigma,),
        {},
        Replications(
            num_simulations=args.replications,
            num_svi_steps=args.steps,
            num_draws=args.draws,
        ),
        ["y"],
        {"log_likelihood": None},  # the parameters only, as the recorded timings
    )
    devices = jax.local_device_count()
    methods = ["vectorized", "sharded"]
    if devices == 1:
        methods.insert(0, "sequential")
    if args.replications % devices:
        raise SystemExit("--replications must be a multiple of the device count")
    runs, compile_s = {}, {}
    for m in methods:
        runs[m] = dispatcher(one, m)
        start = time.perf_counter()
        jax.block_until_ready(runs[m](inputs))
        compile_s[m] = time.perf_counter() - start
    times: dict[str, list[float]] = {m: [] for m in methods}
    for _ in range(args.repeats):
        for m in methods:
            start = time.perf_counter()
            jax.block_until_ready(runs[m](inputs))
            times[m].append(time.perf_counter() - start)
    return {
        "devices": devices,
        "replications_per_s": {
            m: args.replications / statistics.median(t) for m, t in times.items()
        },
        "seconds": times,
        "first_call_s": compile_s,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replications", type=int, default=200)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print("RESULT" + json.dumps(_worker(args)), flush=True)
        return {}

    results = {}
    for n in args.devices:
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        env["XLA_FLAGS"] = (
            env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={n}"
        )
        cmd = [sys.executable, __file__, "--worker"]
        cmd += ["--replications", str(args.replications), "--steps", str(args.steps)]
        cmd += ["--draws", str(args.draws), "--repeats", str(args.repeats)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(proc.stderr[-3000:])
        line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))
        results[n] = json.loads(line[len("RESULT") :])

    try:
        load = "load average (1, 5, 15 min): {:.1f} {:.1f} {:.1f}".format(
            *os.getloadavg()
        )
    except OSError:
        load = "load average unavailable"
    print(
        f"VSBC throughput, eight schools (non-centred, AutoNormal, Trace_ELBO): "
        f"{args.replications} replications x {args.steps} steps, {args.draws} "
        f"draws; median of {args.repeats} interleaved repeats; {load}"
    )
    print(f"{'devices':>7} {'method':>11} {'rep/s':>8} {'first call s':>13}")
    for n, r in results.items():
        for m, rate in r["replications_per_s"].items():
            print(f"{n:>7} {m:>11} {rate:>8.1f} {r['first_call_s'][m]:>13.1f}")
    one = results.get(1)
    if one is not None and "sequential" in one["replications_per_s"]:
        rates = one["replications_per_s"]
        ratio = rates["vectorized"] / rates["sequential"]
        print(f"vectorized / sequential (1 device): {ratio:.2f}  (goal >= 3)")
    for n, r in results.items():
        rates = r["replications_per_s"]
        ratio = rates["sharded"] / rates["vectorized"]
        print(f"sharded on {n} devices / vectorized on 1 (same process): {ratio:.2f}")
    if 1 in results:
        base = results[1]["replications_per_s"]["vectorized"]
        for n, r in results.items():
            ratio = r["replications_per_s"]["sharded"] / base
            print(
                f"sharded on {n} devices / vectorized in the 1-device process: "
                f"{ratio:.2f}" + ("  (goal >= 1.5)" if n == 2 else "")
            )
    return results


if __name__ == "__main__":
    main()
