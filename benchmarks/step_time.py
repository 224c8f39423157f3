"""Step time of each objective relative to ``Trace_ELBO``.

For every (model, guide, number of particles M) the benchmark builds one
``SVI`` per objective plus the ``Trace_ELBO(num_particles=M)`` baseline with
the same model, guide and data, jits ``svi.update``, warms each up (compile
plus a few steps, excluded), and then times blocks of steps in interleaved
repetitions (baseline, objective 1, objective 2, ..., baseline, ...). The
ratio reported is the median step time of the objective divided by the
median step time of the baseline; the spread of the per-repetition ratios
(25%-75%) shows the noise.

Usage::

    python benchmarks/step_time.py                      # everything
    python benchmarks/step_time.py --objectives pvi_log --particles 8 --reps 9
    python benchmarks/step_time.py --models glm --guides AutoNormal

Add an objective by adding an :class:`Objective` to :data:`OBJECTIVES` (a
factory ``num_particles -> loss``, optionally restricted to some models);
add a model by adding a :class:`BenchModel` to :data:`MODELS`.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
import optax
from jax import random
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoMultivariateNormal, AutoNormal
from numpyro.infer.elbo import ELBO

from numpyro_pvi import PACmELBO, PredictiveELBO, SNISForwardKL, SoftCVIELBO

__all__ = [
    "GUIDES",
    "MODELS",
    "OBJECTIVES",
    "BenchModel",
    "Objective",
    "main",
    "time_case",
]


# --------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------


class BenchModel(NamedTuple):
    """A benchmark problem.

    :ivar name: registry key.
    :ivar description: one line for the results table.
    :ivar make: ``rng_key -> (model, args)``: the model and the arguments
        (data) passed to it and to ``svi.update``.
    """

    name: str
    description: str
    make: Callable[[jax.Array], tuple[Callable, tuple]]


def glm_model(x: jax.Array, y: jax.Array) -> None:
    """Linear regression with D coefficients, intercept and noise scale."""
    d = x.shape[1]
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([d]).to_event(1))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Normal(x @ w + b, sigma), obs=y)


def make_glm(rng_key: jax.Array, n: int = 10_000, d: int = 20):
    kx, kw, ke = random.split(rng_key, 3)
    x = random.normal(kx, (n, d))
    w = random.normal(kw, (d,))
    y = x @ w + 0.5 + random.normal(ke, (n,))
    return glm_model, (x, y)


BNN_HIDDEN = 32


def bnn_model(x: jax.Array, y: jax.Array) -> None:
    """One-hidden-layer Bayesian neural network with tanh units."""
    d, h = x.shape[1], BNN_HIDDEN
    w1 = numpyro.sample("w1", dist.Normal(0.0, 1.0).expand([d, h]).to_event(2))
    b1 = numpyro.sample("b1", dist.Normal(0.0, 1.0).expand([h]).to_event(1))
    w2 = numpyro.sample("w2", dist.Normal(0.0, 1.0).expand([h]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    f = jnp.tanh(x @ w1 + b1) @ w2
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Normal(f, sigma), obs=y)


def make_bnn(rng_key: jax.Array, n: int = 10_000, d: int = 20):
    kx, ke = random.split(rng_key)
    x = random.normal(kx, (n, d))
    y = jnp.sin(x[:, 0]) + 0.5 * x[:, 1] * x[:, 2] + 0.3 * random.normal(ke, (n,))
    return bnn_model, (x, y)


#: Benchmark problems.
MODELS: dict[str, BenchModel] = {
    "glm": BenchModel(
        "glm", "linear regression, N=10000, D=20 (cheap likelihood)", make_glm
    ),
    "bnn": BenchModel(
        "bnn",
        f"BNN 20-{BNN_HIDDEN}-1 tanh, N=10000 (likelihood-dominated)",
        make_bnn,
    ),
}

#: Guides, by name.
GUIDES: dict[str, Callable] = {
    "AutoNormal": AutoNormal,
    "AutoMultivariateNormal": AutoMultivariateNormal,
}


# --------------------------------------------------------------------------
# objectives
# --------------------------------------------------------------------------


class Objective(NamedTuple):
    """An objective to time against ``Trace_ELBO``.

    :ivar name: registry key (``--objectives``).
    :ivar make: ``num_particles -> loss``.
    :ivar models: the model names it applies to (``None``: all).
    """

    name: str
    make: Callable[[int], ELBO]
    models: tuple[str, ...] | None = None


def _baseline(num_particles: int) -> ELBO:
    return Trace_ELBO(num_particles=num_particles)


#: Objectives timed against the ``Trace_ELBO`` baseline.
OBJECTIVES: dict[str, Objective] = {
    o.name: o
    for o in [
        Objective("pvi_log", lambda m: PredictiveELBO("log", num_particles=m)),
        Objective("pacm", lambda m: PACmELBO(num_particles=m)),
        Objective("softcvi", lambda m: SoftCVIELBO(num_particles=m, alpha=0.75)),
        Objective("snis_fkl", lambda m: SNISForwardKL(num_particles=m)),
    ]
}


# --------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------


#: The clock of the timed blocks: wall time, or with ``--cpu-time`` the CPU
#: time of this process (all threads), which is robust to waiting for a CPU
#: on a shared machine.
_CLOCK = {"clock": time.perf_counter}


class _Runner:
    """A jitted ``svi.update`` with its state, timed in blocks of steps."""

    def __init__(self, model, guide, loss, args, rng_key, target_seconds):
        svi = SVI(model, guide, optax.adam(1e-3), loss=loss)
        self.args = args
        self.state = svi.init(rng_key, *args)
        self.update = jax.jit(svi.update)
        self._step()  # compile
        clock = _CLOCK["clock"]
        start = clock()
        self._step()
        self._step()
        step = (clock() - start) / 2
        self.steps = max(1, min(200, round(target_seconds / max(step, 1e-6))))
        self.times: list[float] = []

    def _step(self) -> None:
        self.state, loss = self.update(self.state, *self.args)
        loss.block_until_ready()

    def time_block(self) -> float:
        clock = _CLOCK["clock"]
        start = clock()
        for _ in range(self.steps):
            self.state, loss = self.update(self.state, *self.args)
        loss.block_until_ready()
        seconds = (clock() - start) / self.steps
        self.times.append(seconds)
        return seconds


class CaseResult(NamedTuple):
    model: str
    guide: str
    num_particles: int
    baseline_ms: float
    objective: str
    objective_ms: float
    ratio: float
    ratio_q25: float
    ratio_q75: float


def _quantile(xs: Sequence[float], q: float) -> float:
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (pos - lo) * (xs[hi] - xs[lo])


def time_case(
    model_name: str,
    guide_name: str,
    num_particles: int,
    objectives: Sequence[Objective],
    *,
    reps: int = 15,
    target_seconds: float = 0.05,
    seed: int = 0,
) -> list[CaseResult]:
    """Time ``objectives`` against ``Trace_ELBO`` on one model and guide.

    :param model_name: a key of :data:`MODELS`.
    :param guide_name: a key of :data:`GUIDES`.
    :param num_particles: M, the same for every objective and the baseline.
    :param objectives: the objectives to time.
    :param reps: interleaved repetitions.
    :param target_seconds: approximate duration of one timed block.
    :param seed: random seed.
    :return: one :class:`CaseResult` per objective.
    """
    key_data, key_init = random.split(random.PRNGKey(seed))
    model, args = MODELS[model_name].make(key_data)
    guide_cls = GUIDES[guide_name]
    names = ["Trace_ELBO"] + [o.name for o in objectives]
    losses = [_baseline(num_particles)] + [o.make(num_particles) for o in objectives]
    runners = [
        _Runner(model, guide_cls(model), loss, args, key_init, target_seconds)
        for loss in losses
    ]
    for _ in range(reps):
        for runner in runners:
            runner.time_block()
    base = runners[0].times
    base_ms = 1e3 * statistics.median(base)
    results = []
    for name, runner in zip(names[1:], runners[1:], strict=True):
        paired = [t / b for t, b in zip(runner.times, base, strict=True)]
        obj_ms = 1e3 * statistics.median(runner.times)
        results.append(
            CaseResult(
                model_name,
                guide_name,
                num_particles,
                base_ms,
                name,
                obj_ms,
                obj_ms / base_ms,
                _quantile(paired, 0.25),
                _quantile(paired, 0.75),
            )
        )
    return results


def _machine() -> str:
    return (
        f"{platform.machine()} {platform.processor() or ''} "
        f"{os.cpu_count()} logical CPUs, jax {jax.__version__} "
        f"({jax.default_backend()}), numpyro {numpyro.__version__}, "
        f"Python {platform.python_version()}"
    ).replace("  ", " ")


def _load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def _csv(value: str, choices: Sequence[str], option: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in choices]
    if unknown or not names:
        raise SystemExit(
            f"{option}: unknown {unknown or value!r}; choose from {', '.join(choices)}"
        )
    return names


def main(argv: Sequence[str] | None = None) -> list[CaseResult]:
    """Command-line entry point; prints a Markdown table.

    :param argv: command-line arguments (default ``sys.argv[1:]``).
    :return: the results.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--objectives",
        default=",".join(OBJECTIVES),
        help="comma-separated keys of OBJECTIVES (default: %(default)s)",
    )
    parser.add_argument(
        "--particles", default="8,64", help="comma-separated M (default: %(default)s)"
    )
    parser.add_argument("--reps", type=int, default=15, help="interleaved repetitions")
    parser.add_argument(
        "--models", default=",".join(MODELS), help="default: %(default)s"
    )
    parser.add_argument(
        "--guides", default=",".join(GUIDES), help="default: %(default)s"
    )
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time with the process CPU time instead of wall time (shared machines)",
    )
    parser.add_argument(
        "--block-seconds",
        type=float,
        default=0.05,
        help="approximate duration of one timed block of steps",
    )
    args = parser.parse_args(argv)
    _CLOCK["clock"] = time.process_time if args.cpu_time else time.perf_counter
    objective_names = _csv(args.objectives, list(OBJECTIVES), "--objectives")
    model_names = _csv(args.models, list(MODELS), "--models")
    guide_names = _csv(args.guides, list(GUIDES), "--guides")
    try:
        particles = [int(p) for p in args.particles.split(",")]
    except ValueError:
        raise SystemExit(
            f"--particles: integers expected, got {args.particles!r}"
        ) from None
    if args.reps < 1 or any(p < 1 for p in particles):
        raise SystemExit("--reps and --particles must be >= 1")

    print(f"machine: {_machine()}")
    print(f"load average (1/5/15 min) at start: {_load()}")
    print(f"clock: {'process CPU time' if args.cpu_time else 'wall time'}")
    print(
        "| model | guide | M | Trace_ELBO ms/step | objective | ms/step | "
        "ratio (median) | paired ratio 25-75% |"
    )
    print("|---|---|---:|---:|---|---:|---:|---|")
    results = []
    for model_name in model_names:
        objectives = [
            OBJECTIVES[n]
            for n in objective_names
            if OBJECTIVES[n].models is None or model_name in OBJECTIVES[n].models
        ]
        if not objectives:
            continue
        for guide_name in guide_names:
            for m in particles:
                for r in time_case(
                    model_name,
                    guide_name,
                    m,
                    objectives,
                    reps=args.reps,
                    target_seconds=args.block_seconds,
                ):
                    results.append(r)
                    print(
                        f"| {r.model} | {r.guide} | {r.num_particles} | "
                        f"{r.baseline_ms:.3f} | {r.objective} | {r.objective_ms:.3f} | "
                        f"{r.ratio:.3f} | {r.ratio_q25:.2f}-{r.ratio_q75:.2f} |",
                        flush=True,
                    )
    print(f"load average (1/5/15 min) at end: {_load()}")
    for name in model_names:
        print(f"{name}: {MODELS[name].description}")
    return results


if __name__ == "__main__":
    main()
