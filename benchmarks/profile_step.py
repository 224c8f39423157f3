"""Where the time of one jitted ``svi.update`` goes, stage by stage.

For one model, guide, objective and number of particles the step is compiled
once; XLA's cost analysis gives its floating-point operations and bytes
accessed, and a profiler trace of ``--steps`` steps gives the time of every
compiled operation (its self time: a loop's own bookkeeping, not its body).
Each operation is attributed to a stage by the name scope it was traced in
(the particle machinery and ``PredictiveELBO`` name theirs: ``trace``,
``log_density``, ``log_lik``, ``y_sim``, ``y_loc_scale``, ``log_pmf``,
``pmf``, ``score_<name>``),
forward or backward (operations of a transpose are the gradient), and by the
random-number generator (``_normal``, ``_uniform``, ``threefry``) within
``y_sim``. ``Trace_ELBO`` with the same model, guide and particles is
profiled alongside as the reference.

Usage::

    python -m benchmarks.profile_step --model glm --objective pvi_crps --particles 64
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import re
import tempfile
from collections.abc import Sequence
from typing import NamedTuple

import jax
import optax
from jax import random
from numpyro.infer import SVI

from benchmarks.step_models import GUIDES, MODELS
from benchmarks.step_time import OBJECTIVES, _baseline, _load

__all__ = ["Profile", "main", "profile_step", "stage_of"]

#: Name scopes of the particle machinery and the score, in the order shown.
STAGES = (
    "trace",
    "log_density",
    "log_lik",
    "y_sim",
    "y_loc_scale",
    "log_pmf",
    "pmf",
    "score",
)
_RNG = ("_normal", "_uniform", "threefry", "random_bits", "erf_inv")
_OP = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = .*?op_name=\"([^\"]*)\"")


class Profile(NamedTuple):
    """The profile of one compiled step.

    :ivar flops: XLA's estimate of floating-point operations per step.
    :ivar bytes: XLA's estimate of bytes accessed per step.
    :ivar ms: measured milliseconds per step, by ``(stage, direction)``.
    """

    flops: float
    bytes: float
    ms: dict[tuple[str, str], float]

    @property
    def total_ms(self) -> float:
        return sum(self.ms.values())


def stage_of(op_name: str) -> tuple[str, str]:
    """``(stage, "forward" | "backward")`` of an HLO operation's ``op_name``
    metadata: the innermost known name scope, with random-number generation
    inside ``y_sim`` split out as ``y_sim:rng``."""
    direction = "backward" if "transpose(" in op_name else "forward"
    parts = re.split(r"[/()]", op_name)
    stage = "other"
    for part in parts:
        if part in STAGES or part.startswith("score_"):
            stage = "score" if part.startswith("score_") else part
    if stage in ("y_sim", "other") and any(r in op_name for r in _RNG):
        stage = "y_sim:rng" if stage == "y_sim" else "rng"
    return stage, direction


def _op_names(hlo_text: str) -> dict[str, str]:
    """Instruction name -> ``op_name`` metadata of a compiled HLO module."""
    names = {}
    for line in hlo_text.splitlines():
        match = _OP.match(line)
        if match:
            names[match.group(1)] = match.group(2)
    return names


def _self_times(events: list[dict]) -> dict[str, float]:
    """Microseconds of self time per event name (duration minus nested
    events on the same thread)."""
    by_thread = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and "dur" in e:
            by_thread[(e.get("pid"), e.get("tid"))].append(e)
    totals: collections.Counter = collections.Counter()
    for evs in by_thread.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[list] = []  # [end, name, child time]
        for e in evs:
            while stack and e["ts"] >= stack[-1][0]:
                end, name, child, dur = stack.pop()
                totals[name] += dur - child
            if stack:
                stack[-1][2] += e["dur"]
            stack.append([e["ts"] + e["dur"], e["name"], 0.0, e["dur"]])
        for _end, name, child, dur in stack:
            totals[name] += dur - child
    return totals


def profile_step(
    model_name: str,
    objective: str,
    num_particles: int,
    *,
    guide_name: str = "AutoNormal",
    steps: int = 50,
    seed: int = 0,
) -> Profile:
    """Profile ``steps`` jitted steps of one objective (``"Trace_ELBO"`` for
    the baseline).

    :param model_name: a key of :data:`~benchmarks.step_models.MODELS`.
    :param objective: a key of :data:`~benchmarks.step_time.OBJECTIVES`, or
        ``"Trace_ELBO"``.
    :param num_particles: ``M``.
    :param guide_name: a key of :data:`~benchmarks.step_models.GUIDES`.
    :param steps: profiled steps (after compilation and two warm-up steps).
    :param seed: random seed of data and initial parameters.
    :return: the :class:`Profile`.
    """
    key_data, key_init = random.split(random.PRNGKey(seed))
    model, args = MODELS[model_name].make(key_data)
    if objective == "Trace_ELBO":
        loss = _baseline(num_particles, guide_name)
    else:
        loss = OBJECTIVES[objective].make(num_particles)
    svi = SVI(model, GUIDES[guide_name](model), optax.adam(1e-3), loss=loss)
    state = svi.init(key_init, *args)
    update = jax.jit(svi.update)
    compiled = update.lower(state, *args).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    op_names = _op_names(compiled.as_text())
    for _ in range(3):
        state, value = update(state, *args)
    value.block_until_ready()
    with tempfile.TemporaryDirectory() as tmp:
        jax.profiler.start_trace(tmp, create_perfetto_trace=True)
        for _ in range(steps):
            state, value = update(state, *args)
        value.block_until_ready()
        jax.profiler.stop_trace()
        (path,) = glob.glob(f"{tmp}/**/perfetto_trace.json.gz", recursive=True)
        with gzip.open(path) as f:
            trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    ms: collections.Counter = collections.Counter()
    for name, micros in _self_times(events).items():
        if name in op_names:
            ms[stage_of(op_names[name])] += micros / 1e3 / steps
    return Profile(
        float(cost.get("flops", 0)), float(cost.get("bytes accessed", 0)), ms
    )


def _row(label: str, p: Profile) -> str:
    cells = []
    for stage in (*STAGES, "y_sim:rng", "rng", "other"):
        f, b = p.ms.get((stage, "forward"), 0.0), p.ms.get((stage, "backward"), 0.0)
        cells.append(f"{f:.2f} / {b:.2f}" if f + b >= 0.005 else "")
    return (
        f"| {label} | {p.flops / 1e6:.0f} | {p.bytes / 1e6:.0f} | {p.total_ms:.2f} | "
        + " | ".join(cells)
        + " |"
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry point; prints a Markdown table (ms per step,
    forward / backward, per stage)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="glm", choices=list(MODELS))
    parser.add_argument("--objective", default="pvi_crps")
    parser.add_argument("--particles", default="8,64")
    parser.add_argument("--guide", default="AutoNormal", choices=list(GUIDES))
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args(argv)
    objectives = ["Trace_ELBO"] + [o for o in args.objective.split(",") if o]
    print(f"load average (1/5/15 min) at start: {_load()}")
    stages = (*STAGES, "y_sim:rng", "rng", "other")
    print("| case | MFLOP | MB accessed | ms/step | " + " | ".join(stages) + " |")
    print("|---|---:|---:|---:|" + "---:|" * len(stages))
    for m in (int(p) for p in args.particles.split(",")):
        for objective in objectives:
            p = profile_step(
                args.model, objective, m, guide_name=args.guide, steps=args.steps
            )
            print(_row(f"{args.model} M={m} {objective}", p), flush=True)
    print(f"load average (1/5/15 min) at end: {_load()}")


if __name__ == "__main__":
    main()
