"""Step time of each objective relative to ``Trace_ELBO``.

For every (model, guide, number of particles M) the benchmark builds one
``SVI`` per objective plus the ``Trace_ELBO(num_particles=M)`` baseline
(``StratifiedELBO(num_particles=M)`` for the mixture guide: ``M`` draws from
each component, as the objectives take them) with the same model, guide and
data, jits ``svi.update``, warms each up (compile
plus a few steps, excluded), and then times blocks of steps in interleaved
repetitions (baseline, objective 1, objective 2, ..., baseline, ...). The
ratio reported is the median step time of the objective divided by the
median step time of the baseline; the spread of the per-repetition ratios
(25%-75%) shows the noise.

Usage::

    python -m benchmarks.step_time                      # everything
    python -m benchmarks.step_time --objectives pvi_log --particles 8 --reps 9
    python -m benchmarks.step_time --models glm --guides AutoNormal
    python -m benchmarks.step_time --models bnn,glm --guides AutoGaussianMixture
    python -m benchmarks.step_time --crps-scaling       # package vs naive CRPS

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
import optax
from jax import random
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.elbo import ELBO

from benchmarks.step_models import GUIDES, MIXTURE_GUIDES, MODELS
from numpyro_pvi import (
    PACmELBO,
    PredictiveELBO,
    SNISForwardKL,
    SoftCVIELBO,
    StratifiedELBO,
)
from numpyro_pvi.objectives.svi_scan import svi_scan
from numpyro_pvi.scores import CRPS, QuadraticScore

__all__ = ["GUIDES", "MODELS", "OBJECTIVES", "Objective", "main", "time_case"]


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


def _baseline(num_particles: int, guide_name: str = "AutoNormal") -> ELBO:
    """``Trace_ELBO``, or ``StratifiedELBO`` for a guide with components (the
    same draws per component as the objectives)."""
    if guide_name in MIXTURE_GUIDES:
        return StratifiedELBO(num_particles=num_particles)
    return Trace_ELBO(num_particles=num_particles)


#: The models with a finite support (the quadratic score's).
FINITE_SUPPORT = (
    "logistic",
    "softmax",
    "binomial",
    "binomial_counts",
    "binomial_40",
    "binomial_200",
    "binomial_200_counts",
)

#: The models with a finite support of ordered values (the CRPS's from the
#: pmf by default; a Categorical's classes need not be ordered).
ORDERED_FINITE = tuple(m for m in FINITE_SUPPORT if m != "softmax")

#: The models with a reparameterised likelihood (the CRPS's and the energy
#: score's; from "student" on, simulated through Student-t or Gamma laws).
REPARAMETERISED = (
    "glm",
    "bnn",
    "bnn_example",
    "hetero",
    "student",
    "student_df",
    "volatility",
    "gamma",
    "beta",
)

#: The models whose likelihood has a closed-form CRPS without a
#: reparameterised sampler (a Normal mixture, Poisson and negative-binomial
#: counts).
CLOSED_FORM_ONLY = (
    "mixture_regression",
    "poisson",
    "negative_binomial",
    "zero_inflated",
)

#: Objectives timed against the ``Trace_ELBO`` baseline.
OBJECTIVES: dict[str, Objective] = {
    o.name: o
    for o in [
        Objective("pvi_log", lambda m: PredictiveELBO("log", num_particles=m)),
        Objective("pacm", lambda m: PACmELBO(num_particles=m)),
        Objective(
            "pvi_crps",
            lambda m: PredictiveELBO("crps", num_particles=m),
            models=(*REPARAMETERISED, *CLOSED_FORM_ONLY, *ORDERED_FINITE),
        ),
        Objective(
            "pvi_crps_derangement",
            lambda m: PredictiveELBO(CRPS(estimator="derangement"), num_particles=m),
            models=("glm", "bnn", "bnn_example", "hetero"),
        ),
        Objective(
            "pvi_crps_all_pairs",
            lambda m: PredictiveELBO(CRPS(estimator="all-pairs"), num_particles=m),
            models=("glm", "bnn", "bnn_example", "hetero"),
        ),
        Objective(
            "pvi_energy",
            lambda m: PredictiveELBO("energy", num_particles=m),
            models=(*REPARAMETERISED, *CLOSED_FORM_ONLY, *ORDERED_FINITE, "trivariate"),
        ),
        Objective(
            "pvi_quadratic",
            lambda m: PredictiveELBO("quadratic", num_particles=m),
            models=FINITE_SUPPORT,
        ),
        Objective(
            "pvi_quadratic_all_pairs",
            lambda m: PredictiveELBO(
                QuadraticScore(estimator="all-pairs"), num_particles=m
            ),
            models=FINITE_SUPPORT,
        ),
        Objective(
            "pvi_quadratic_derangement",
            lambda m: PredictiveELBO(
                QuadraticScore(estimator="derangement"), num_particles=m
            ),
            models=FINITE_SUPPORT,
        ),
        Objective(
            "pvi_crps_pmf",
            lambda m: PredictiveELBO(CRPS(estimator="pmf"), num_particles=m),
            models=FINITE_SUPPORT,
        ),
        Objective("softcvi", lambda m: SoftCVIELBO(num_particles=m, alpha=0.75)),
        Objective("snis_fkl", lambda m: SNISForwardKL(num_particles=m)),
    ]
}


# --------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------


class _Runner:
    """A jitted ``svi.update`` with its state, timed in blocks of steps.

    ``loop="call"``: one call of the jitted update per step, as ``SVI.run``
    runs with its progress bar (the default). ``loop="scan"``: the block's
    steps inside one jitted ``lax.scan``, as ``SVI.run(progress_bar=False)``
    runs them: XLA allocates the program's temporary buffers once per call,
    so the two differ by the cost of that allocation (page faults on fresh
    memory once the buffers outgrow glibc's largest reused block,
    ``benchmarks/RESULTS.md``, "Steps with more than 32 MiB of
    temporaries").
    """

    def __init__(
        self, model, guide, loss, args, rng_key, target_seconds, clock, loop="call"
    ):
        svi = SVI(model, guide, optax.adam(1e-3), loss=loss)
        self.clock = clock
        self.args = args
        self.state = svi.init(rng_key, *args)
        self.update = jax.jit(svi.update)
        self._step()  # compile
        clock = self.clock
        start = clock()
        self._step()
        self._step()
        step = (clock() - start) / 2
        self.steps = max(1, min(200, round(target_seconds / max(step, 1e-6))))
        self.times: list[float] = []
        self.scan = None
        if loop == "scan":
            steps = self.steps
            self.scan = jax.jit(
                lambda state, *a: svi_scan(svi, state, num_steps=steps, args=a)
            )
            self.state, losses = self.scan(self.state, *args)  # compile
            losses.block_until_ready()

    def _step(self) -> None:
        self.state, loss = self.update(self.state, *self.args)
        loss.block_until_ready()

    def time_block(self) -> float:
        clock = self.clock
        start = clock()
        if self.scan is not None:
            self.state, loss = self.scan(self.state, *self.args)
        else:
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
    clock: Callable[[], float] = time.perf_counter,
    loop: str = "call",
) -> list[CaseResult]:
    """Time ``objectives`` against ``Trace_ELBO`` on one model and guide.

    :param model_name: a key of :data:`MODELS`.
    :param guide_name: a key of :data:`GUIDES`.
    :param num_particles: M, the same for every objective and the baseline.
    :param objectives: the objectives to time.
    :param reps: interleaved repetitions.
    :param target_seconds: approximate duration of one timed block.
    :param seed: random seed.
    :param clock: the clock of the timed blocks: wall time, or the CPU time
        of this process (``time.process_time``, robust to waiting for a CPU
        on a shared machine).
    :param loop: ``"call"`` (one call of the jitted update per step, as
        ``SVI.run`` with its progress bar) or ``"scan"`` (the steps of a
        block inside one ``lax.scan``, as ``SVI.run(progress_bar=False)``).
    :return: one :class:`CaseResult` per objective.
    """
    key_data, key_init = random.split(random.PRNGKey(seed))
    model, args = MODELS[model_name].make(key_data)
    guide_cls = GUIDES[guide_name]
    names = ["Trace_ELBO"] + [o.name for o in objectives]
    losses = [_baseline(num_particles, guide_name)] + [
        o.make(num_particles) for o in objectives
    ]
    runners = [
        _Runner(
            model, guide_cls(model), loss, args, key_init, target_seconds, clock, loop
        )
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


# --------------------------------------------------------------------------
# CRPS scaling in M: the package's pair sum (vectorised O(M^2) sign sums up to
# M = 1024, an O(M log M) sort beyond) vs the naive (M, M) pair array
# --------------------------------------------------------------------------


def naive_crps(samples: jax.Array, y: jax.Array) -> jax.Array:
    """The fair CRPS with the all-pairs sum taken literally, O(M^2 b).

    :param samples: ``(M, b)`` draws.
    :param y: ``(b,)`` observations.
    :return: ``(b,)`` negatively oriented CRPS.
    """
    m = samples.shape[0]
    abs_err = jnp.mean(jnp.abs(samples - y), axis=0)
    pairs = jnp.sum(jnp.abs(samples[:, None] - samples[None]), axis=(0, 1))
    return abs_err - pairs / (2 * m * (m - 1))


def crps_scaling(
    particles: Sequence[int] = (64, 256, 1024),
    *,
    num_obs: int = 100,
    reps: int = 15,
    target_seconds: float = 0.05,
    seed: int = 0,
) -> list[tuple[int, float, float]]:
    """Time the package's CRPS estimator and the naive one (value and gradient).

    The package's pair sum is computed by vectorised sign sums, O(M^2) work
    and O(M) memory, for M <= 1024, and by an O(M log M) sort beyond; the
    naive one forms the (M, M) pair array.

    Both are jitted ``value_and_grad`` of the summed score over ``num_obs``
    observations, with the same draws; blocks of calls are timed in
    interleaved repetitions (package, naive, package, ...), medians reported.

    :param particles: the values of ``M``.
    :param num_obs: ``b``, the number of observations.
    :param reps: interleaved repetitions.
    :param target_seconds: approximate duration of one timed block.
    :param seed: random seed.
    :return: ``(M, package ms, naive ms)`` per ``M``.
    """
    from numpyro_pvi.scores import crps_fair

    rows = []
    for m in particles:
        kx, ky = random.split(random.PRNGKey(seed + m))
        x = random.normal(kx, (m, num_obs))
        y = random.normal(ky, (num_obs,))
        fns = [
            jax.jit(jax.value_and_grad(lambda x, f=f, y=y: jnp.sum(f(x, y))))
            for f in (crps_fair, naive_crps)
        ]
        value_sorted, value_naive = (float(f(x)[0]) for f in fns)  # compile
        if abs(value_sorted - value_naive) > 1e-3 * max(1.0, abs(value_naive)):
            raise RuntimeError(f"M={m}: package and naive CRPS disagree")
        counts = []
        for f in fns:
            start = time.perf_counter()
            jax.block_until_ready(f(x))
            once = time.perf_counter() - start
            counts.append(max(1, min(1000, round(target_seconds / max(once, 1e-6)))))
        times: list[list[float]] = [[], []]
        for _ in range(reps):
            for f, n, out in zip(fns, counts, times, strict=True):
                start = time.perf_counter()
                for _ in range(n):
                    res = f(x)
                jax.block_until_ready(res)
                out.append((time.perf_counter() - start) / n)
        rows.append(
            (m, 1e3 * statistics.median(times[0]), 1e3 * statistics.median(times[1]))
        )
    return rows


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


_DEFAULT_PARTICLES = "8,64"


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--objectives",
        default=",".join(OBJECTIVES),
        help="comma-separated keys of OBJECTIVES (default: %(default)s)",
    )
    parser.add_argument(
        "--particles",
        default=_DEFAULT_PARTICLES,
        help="comma-separated M (default: %(default)s)",
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
    parser.add_argument(
        "--loop",
        choices=("call", "scan"),
        default="call",
        help="call: one jitted update per step (SVI.run with its progress bar); "
        "scan: a block of steps in one lax.scan (SVI.run(progress_bar=False))",
    )
    parser.add_argument(
        "--crps-scaling",
        action="store_true",
        help="time the package's CRPS against a naive (M, M) one for M in "
        "--particles (default 64,256,1024) instead of the step-time table",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> list[CaseResult]:
    """Command-line entry point; prints a Markdown table.

    :param argv: command-line arguments (default ``sys.argv[1:]``).
    :return: the results.
    """
    args = _parse_args(argv)
    clock = time.process_time if args.cpu_time else time.perf_counter
    if args.crps_scaling:
        if args.particles == _DEFAULT_PARTICLES:
            args.particles = "64,256,1024"
        ms = [int(p) for p in args.particles.split(",")]
        print(f"machine: {_machine()}")
        print(f"load average (1/5/15 min) at start: {_load()}")
        print("| M | package CRPS ms | naive (M, M) ms | naive / package |")
        print("|---:|---:|---:|---:|")
        for m, t_sorted, t_naive in crps_scaling(ms, reps=args.reps):
            print(
                f"| {m} | {t_sorted:.3f} | {t_naive:.3f} | {t_naive / t_sorted:.1f} |",
                flush=True,
            )
        print(f"load average (1/5/15 min) at end: {_load()}")
        print("value and gradient of the summed CRPS of b=100 observations")
        return []
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
    print(f"steps: {'one call each' if args.loop == 'call' else 'lax.scan blocks'}")
    print(
        "| model | guide | M | baseline ms/step | objective | ms/step | "
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
                    clock=clock,
                    loop=args.loop,
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
