"""The stopping rule in cross-validation: ``FitRecipe(stop_early=True)``
against fixed-step CV on the posteriordb models of the PVI paper.

For each model (its fitting part of split 0, train and validation merged),
5-fold CV of the default candidates (VI and the PVI λ grid), ``AutoNormal``,
Adam, ``--steps`` the most steps, in one process, the fixed-step run and the
early-stopped run in turn (wall times include compilation, as a user waits
for it). Reported: the wall times and their ratio, the candidate each
chooses (rule ``one_se``), and the largest gap between their CV means in
units of the fixed run's standard error (a false stop would show as a gap
of about one or more).

Usage::

    python -m benchmarks.stopping [DATA_DIR] [--steps 3000] [--model kidscore]
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Sequence

import numpy as np
import optax
from jax import random
from numpyro.infer.autoguide import AutoNormal

from benchmarks.posteriordb import _default_data_dir, paper_models
from numpyro_pvi import FitRecipe
from numpyro_pvi.selection import cross_validate


def compare(name: str, model, data: dict, steps: int) -> dict:
    """Fixed-step and early-stopped CV of one model."""
    out = {"model": name}
    for stop in (False, True):
        fit = FitRecipe(
            num_steps=steps, num_draws=500, progress_bar=False, stop_early=stop
        )
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cv = cross_validate(
                random.PRNGKey(0),
                model,
                AutoNormal(model),
                optax.adam(0.01),
                fit=fit,
                **data,
            )
        out["stop" if stop else "fixed"] = (time.perf_counter() - start, cv)
    (t_fixed, fixed), (t_stop, early) = out["fixed"], out["stop"]
    gap = np.abs(early.scores["mean"].values - fixed.scores["mean"].values)
    out.update(
        time_fixed=t_fixed,
        time_stop=t_stop,
        ratio=t_stop / t_fixed,
        chosen_fixed=fixed.best_label,
        chosen_stop=early.best_label,
        gap_in_se=float(np.max(gap / fixed.scores["se"].values)),
    )
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", nargs="?", default=str(_default_data_dir()))
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--model", action="append")
    a = parser.parse_args(argv)
    models = paper_models(a.data_dir)
    print(
        "| model | fixed, s | stop early, s | ratio | chosen (fixed / stop) | "
        "largest CV-mean gap, se |"
    )
    print("|---|---:|---:|---:|---|---:|")
    for name, m in models.items():
        if a.model and name not in a.model:
            continue
        data = m.splits(0, merged=True).train
        r = compare(name, m.model, data, a.steps)
        print(
            f"| {name} | {r['time_fixed']:.1f} | {r['time_stop']:.1f} | "
            f"{r['ratio']:.2f} | {r['chosen_fixed']} / {r['chosen_stop']} | "
            f"{r['gap_in_se']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
