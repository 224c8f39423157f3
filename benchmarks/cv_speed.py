"""Wall time of :func:`numpyro_pvi.selection.cross_validate` against the
same fits done one by one with ``SVI.run``.

5-fold cross-validation of the 8 default candidates (VI and the PVI λ grid)
on one posteriordb model is 40 fits and 40 held-out scores. The baseline
does exactly these fits and scores with what a user would write without the
library: for every candidate and fold ``SVI(mask_observations(model, ...),
...).run(...)`` — with its default progress bar (one dispatched step at a
time), and without it (one compiled loop per call) — and
:func:`~numpyro_pvi.predictive_score` of the held-out fold. All runs are in
one process, from a cold compilation cache (no persistent cache), run in
alternation ``--reps`` times; wall times include compilation, as a user
waits for it. With ``--warm`` a persistent compilation cache (a temporary
directory) is filled by one untimed run of each first, as when a user runs
the same notebook again: every program is kept in it, however quickly it
compiled; with ``--default-thresholds`` too, only those JAX keeps by
default (the ones that took a second or more to compile), as for a user
who sets only ``jax_compilation_cache_dir``.

Usage::

    python -m benchmarks.cv_speed [DATA_DIR] [--model nes] [--steps 2000]
        [--warm [--default-thresholds]]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import jax
import numpy as np
from jax import random
from numpyro.infer import SVI
from numpyro.infer.autoguide import AutoNormal

from benchmarks.harness import decaying_adam
from benchmarks.posteriordb import _default_data_dir, paper_models
from numpyro_pvi import FitRecipe, predictive_score
from numpyro_pvi.selection import cross_validate, default_candidates, mask_observations
from numpyro_pvi.selection.fold_ids import fold_ids

__all__ = ["main"]


def _one_by_one(model, data, num_steps, lr, num_particles, *, progress_bar):
    """The 40 fits and held-out scores, each an ``SVI.run`` of its own."""
    guide = AutoNormal(model)
    n = len(data["y"] if "y" in data else data["C"])
    folds = np.asarray(fold_ids(random.PRNGKey(0), n, 5))
    total = 0.0
    for loss in default_candidates(guide, "log", num_particles=num_particles).values():
        for k in range(5):
            masked = mask_observations(model, keep=folds != k, data_plate="obs")
            svi = SVI(masked, guide, decaying_adam(lr, num_steps), loss=loss)
            result = svi.run(
                random.PRNGKey(1), num_steps, progress_bar=progress_bar, **data
            )
            scores = predictive_score(
                random.PRNGKey(2), result.params, model, guide, **data
            )
            total += float(np.sum(scores.score[folds == k]))
    return total


def _library(model, data, num_steps, lr, num_particles):
    cv = cross_validate(
        random.PRNGKey(0),
        model,
        AutoNormal(model),
        decaying_adam(lr, num_steps),
        fit=FitRecipe(num_steps=num_steps, progress_bar=False),
        candidates=default_candidates(AutoNormal(model), num_particles=num_particles),
        **data,
    )
    return float(cv.scores["mean"].sum())


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data_dir", nargs="?", default=str(_default_data_dir()))
    parser.add_argument("--model", default="nes")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--num-particles", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-2)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument(
        "--warm",
        action="store_true",
        help="time with a persistent compilation cache filled by a first run",
    )
    parser.add_argument(
        "--default-thresholds",
        action="store_true",
        help="with --warm: JAX's default thresholds of what the cache keeps",
    )
    args = parser.parse_args(argv)
    if args.warm:  # before anything compiles: the cache is set up once
        jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp())
        if not args.default_thresholds:
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
            jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    if not Path(args.data_dir).is_dir():
        raise SystemExit(f"data directory {args.data_dir} does not exist")
    pm = paper_models(args.data_dir)[args.model]
    data = pm.splits(0, merged=True).train
    runs = {
        "cross_validate": lambda: _library(
            pm.model, data, args.steps, args.lr, args.num_particles
        ),
        "40 x SVI.run (progress bar)": lambda: _one_by_one(
            pm.model, data, args.steps, args.lr, args.num_particles, progress_bar=True
        ),
        "40 x SVI.run (no progress bar)": lambda: _one_by_one(
            pm.model, data, args.steps, args.lr, args.num_particles, progress_bar=False
        ),
    }
    print(
        f"model {args.model}: {args.steps} steps, M = {args.num_particles}, 5 folds "
        f"x 8 candidates, jax {jax.__version__}, {os.cpu_count()} cores, "
        f"{'warm' if args.warm else 'cold'} compilation cache"
        + (" (JAX's default thresholds)" if args.default_thresholds else "")
    )
    if args.warm:
        for run in runs.values():
            jax.clear_caches()
            run()
    times: dict[str, list[float]] = {k: [] for k in runs}
    for rep in range(args.reps):
        for label, run in runs.items():
            jax.clear_caches()
            load = os.getloadavg()[0]
            start = time.perf_counter()
            run()
            times[label].append(time.perf_counter() - start)
            print(f"rep {rep} {label:<32} {times[label][-1]:8.1f} s  load {load:.2f}")
    base = np.median(times["cross_validate"])
    for label, t in times.items():
        print(
            f"{label:<32} median {np.median(t):8.1f} s  "
            f"ratio {np.median(t) / base:5.2f}"
        )


if __name__ == "__main__":
    main()
