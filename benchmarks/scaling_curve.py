"""Step time of each objective against ``Trace_ELBO`` as the data (N) and
the particles (M) grow.

A Normal linear regression (D = 10, AutoNormal); jitted ``svi.update`` steps
(Adam), warm-up excluded; at each size every objective and ``Trace_ELBO``
are built in one process and timed in interleaved blocks (at least
``--steps`` steps and ``--block-seconds`` each), the median of ``--reps``
blocks. Two sweeps: N from 10³ to 10⁶ at M = 16, and M from 1 to 1024 at
N = 10⁴. Sizes whose per-particle arrays exceed ``--max-elements`` (M × N)
are skipped and reported as such (that is where memory takes over on this
machine). Writes a table and a plot (step time relative to ``Trace_ELBO``,
and absolute).

Usage::

    python benchmarks/scaling_curve.py --png benchmarks/scaling_curve.png
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence

__all__ = ["main"]

N_SWEEP = (1_000, 10_000, 100_000, 1_000_000)
M_SWEEP = (1, 4, 16, 64, 256, 1024)


def _objectives() -> dict[str, Callable[[int], object]]:
    from numpyro.infer import Trace_ELBO

    from numpyro_pvi import PACmELBO, PredictiveELBO, SoftCVIELBO

    return {
        "Trace_ELBO": lambda m: Trace_ELBO(num_particles=m),
        "PVI-log": lambda m: PredictiveELBO("log", num_particles=m),
        "PVI-CRPS": lambda m: PredictiveELBO("crps", num_particles=max(m, 2)),
        "PAC^m": lambda m: PACmELBO(num_particles=m),
        "SoftCVI": lambda m: SoftCVIELBO(num_particles=max(m, 2)),
    }


def _data(n: int) -> tuple:
    import jax.numpy as jnp
    from jax import random

    kx, ky = random.split(random.PRNGKey(0))
    x = random.normal(kx, (n, 10))
    return x, x @ jnp.linspace(-1.0, 1.0, 10) + random.normal(ky, (n,))


def _stepper(loss, data: tuple) -> Callable[[int], None]:
    """``run(k)``: ``k`` jitted SVI steps of ``loss`` (compiled and warmed up
    here), blocking until the last is done."""
    import jax
    import numpyro
    import numpyro.distributions as dist
    import optax
    from jax import random
    from numpyro.infer import SVI
    from numpyro.infer.autoguide import AutoNormal

    def model(x, y):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([10]).to_event(1))
        sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
        with numpyro.plate("data", x.shape[0]):
            numpyro.sample("y", dist.Normal(x @ w, sigma), obs=y)

    svi = SVI(model, AutoNormal(model), optax.adam(1e-3), loss)
    update = jax.jit(svi.update)
    box = [svi.init(random.PRNGKey(1), *data)]

    def run(k: int) -> None:
        state = box[0]
        for _ in range(k):
            state, value = update(state, *data)
        value.block_until_ready()
        box[0] = state

    run(2)
    return run


def _time_size(
    n: int, m: int, skip: bool, reps: int, steps: int, block_seconds: float
) -> dict[str, float | None]:
    """Seconds per step of every objective at ``(N, M)``, timed in
    interleaved blocks (``Trace_ELBO``, the objectives, ``Trace_ELBO``, ...)
    of at least ``steps`` steps and ``block_seconds``; the median block."""
    if skip:
        return {name: None for name in _objectives()}
    data = _data(n)
    runs = {name: _stepper(make(m), data) for name, make in _objectives().items()}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(reps):
        for name, run in runs.items():
            done, start = 0, time.perf_counter()
            while done < steps or time.perf_counter() - start < block_seconds:
                run(steps)
                done += steps
            times[name].append((time.perf_counter() - start) / done)
    return {name: statistics.median(t) for name, t in times.items()}


def sweep(max_elements: int, reps: int, steps: int, block_seconds: float) -> list[dict]:
    """Every (sweep, size, objective): the step time or ``None`` (skipped)."""
    rows = []
    sizes = [("N", n, 16) for n in N_SWEEP] + [("M", 10_000, m) for m in M_SWEEP]
    for axis, n, m in sizes:
        skip = n * max(m, 2) > max_elements
        timed = _time_size(n, m, skip, reps, steps, block_seconds)
        for name, seconds in timed.items():
            rows.append({"sweep": axis, "N": n, "M": m, "objective": name,
                         "seconds": seconds})  # fmt: skip
            shown = "skipped (memory)" if seconds is None else f"{1e3 * seconds:.2f} ms"
            print(f"{axis}-sweep N={n:>8} M={m:>5} {name:<10} {shown}", flush=True)
    return rows


def table(rows: list[dict]) -> str:
    """Markdown: step time (ms) and ratio to Trace_ELBO at each size."""
    names = list(_objectives())
    lines = [
        "| sweep | N | M | " + " | ".join(names) + " |",
        "|---|---|---|" + "---|" * len(names),
    ]
    keys = sorted({(r["sweep"], r["N"], r["M"]) for r in rows},
                  key=lambda k: (k[0] != "N", k[1], k[2]))  # fmt: skip
    for key in keys:
        at = {r["objective"]: r["seconds"] for r in rows
              if (r["sweep"], r["N"], r["M"]) == key}  # fmt: skip
        base = at["Trace_ELBO"]
        cells = []
        for name in names:
            t = at[name]
            if t is None:
                cells.append("—")
            elif name == "Trace_ELBO" or base is None:
                cells.append(f"{1e3 * t:.2f} ms")
            else:
                cells.append(f"{1e3 * t:.2f} ms ({t / base:.2f}×)")
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
    """Step time against N and M, absolute and relative to Trace_ELBO."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharex="col")
    for col, (axis, label) in enumerate((("N", "N (M = 16)"), ("M", "M (N = 10⁴)"))):
        base = {r[axis]: r["seconds"] for r in rows
                if r["sweep"] == axis and r["objective"] == "Trace_ELBO"}  # fmt: skip
        for name in _objectives():
            pts = [(r[axis], r["seconds"]) for r in rows
                   if r["sweep"] == axis and r["objective"] == name
                   and r["seconds"] is not None]  # fmt: skip
            if not pts:
                continue
            xs, ts = zip(*pts, strict=True)
            axes[0, col].plot(xs, [1e3 * t for t in ts], "o-", label=name)
            ratio = [t / base[x] for x, t in pts if base.get(x)]
            axes[1, col].plot(xs[: len(ratio)], ratio, "o-", label=name)
        axes[0, col].set(xscale="log", yscale="log", ylabel="step (ms)")
        axes[1, col].set(xscale="log", xlabel=label, ylabel="× Trace_ELBO")
        axes[1, col].axhline(1.0, color="0.5", lw=0.8)
    axes[0, 0].legend(fontsize="small")
    fig.suptitle(f"Step time on this CPU ({os.cpu_count()} cores), Normal GLM D = 10")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="at least, per block")
    parser.add_argument("--block-seconds", type=float, default=0.2)
    parser.add_argument("--max-elements", type=int, default=100_000_000)
    parser.add_argument("--png", default=None, help="write the plot here")
    parser.add_argument("--json", default=None, help="write the raw rows here")
    args = parser.parse_args(argv)
    print(f"cores: {os.cpu_count()}, load: {os.getloadavg()[0]:.2f}", flush=True)
    rows = sweep(args.max_elements, args.reps, args.steps, args.block_seconds)
    print(f"load at the end: {os.getloadavg()[0]:.2f}")
    print(table(rows))
    if args.png:
        plot(rows, args.png)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
