r"""Demo: predictive objectives on a misspecified regression (``make demo``).

Heteroskedastic data, :math:`y_i = 1 + \tfrac12 x_i + \sqrt{1 + (0.8 x_i)^2}\,
\varepsilon_i`, are fitted with a homoskedastic linear regression. The ELBO's
predictive bands are too narrow at the edges; the predictive objectives widen
them. Prints each objective's held-out log score and posterior summary, writes
a PNG of the 90% predictive bands and ends with each fit's report. Objectives
are the entries of :data:`METHODS`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
from jax import random
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal
from numpyro.infer.elbo import ELBO

from numpyro_pvi.diagnostics.report import report
from numpyro_pvi.evaluation.scoring import predictive_score
from numpyro_pvi.objectives.pacm import PACmELBO
from numpyro_pvi.objectives.predictive import PredictiveELBO
from numpyro_pvi.objectives.softcvi import SoftCVIELBO

__all__ = [
    "METHODS",
    "FitResult",
    "Method",
    "main",
    "model",
    "noise_sd",
    "run_demo",
    "simulate",
]

#: Parameters of the simulated data: intercept, slope, noise growth.
TRUE_INTERCEPT, TRUE_SLOPE, NOISE_GROWTH = 1.0, 0.5, 0.8
X_RANGE = 3.0


class Method(NamedTuple):
    """One objective of the demo.

    :ivar name: the label in the table and the plot.
    :ivar make_loss: builds the loss passed to :class:`~numpyro.infer.SVI`.
    """

    name: str
    make_loss: Callable[[], ELBO]


#: The objectives compared by the demo; append entries to extend it.
METHODS: list[Method] = [
    Method("Trace_ELBO", lambda: Trace_ELBO(num_particles=1)),
    Method("PACmELBO", lambda: PACmELBO(num_particles=8)),
    Method("PredictiveELBO", lambda: PredictiveELBO("log", num_particles=32)),
    Method("SoftCVIELBO", lambda: SoftCVIELBO(num_particles=8, alpha=0.75)),
]


class FitResult(NamedTuple):
    """What the demo reports for one objective.

    :ivar name: the method's name.
    :ivar heldout_log_score: mean held-out log predictive density per
        observation (higher is better).
    :ivar posterior_mean: posterior mean of each latent site.
    :ivar posterior_sd: posterior standard deviation of each latent site.
    :ivar seconds: wall-clock time of the SVI fit (including compilation).
    """

    name: str
    heldout_log_score: float
    posterior_mean: dict[str, float]
    posterior_sd: dict[str, float]
    seconds: float


def noise_sd(x: jax.Array) -> jax.Array:
    """Standard deviation of the simulated noise at ``x``."""
    return jnp.sqrt(1.0 + (NOISE_GROWTH * x) ** 2)


def simulate(rng_key: jax.Array, n: int) -> tuple[jax.Array, jax.Array]:
    """Draw ``n`` points ``(x, y)`` of the heteroskedastic regression.

    :param rng_key: random key.
    :param int n: number of observations.
    :return: covariates ``x`` and responses ``y``, each of shape ``(n,)``.
    """
    key_x, key_e = random.split(rng_key)
    x = random.uniform(key_x, (n,), minval=-X_RANGE, maxval=X_RANGE)
    eps = random.normal(key_e, (n,))
    return x, TRUE_INTERCEPT + TRUE_SLOPE * x + noise_sd(x) * eps


def model(x: jax.Array, y: jax.Array | None = None) -> None:
    """Homoskedastic linear regression (misspecified for :func:`simulate`).

    :param x: covariates, shape ``(n,)``.
    :param y: responses, shape ``(n,)``, or ``None`` to simulate.
    """
    a = numpyro.sample("a", dist.Normal(0.0, 5.0))
    b = numpyro.sample("b", dist.Normal(0.0, 5.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(3.0))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Normal(a + b * x, sigma), obs=y)


def _fit(
    method: Method,
    rng_key: jax.Array,
    x: jax.Array,
    y: jax.Array,
    *,
    steps: int,
    learning_rate: float,
    progress_bar: bool,
) -> tuple[AutoNormal, dict[str, jax.Array], ELBO]:
    guide = AutoNormal(model)
    loss = method.make_loss()
    svi = SVI(model, guide, optax.adam(learning_rate), loss=loss)
    result = svi.run(rng_key, steps, x, y, progress_bar=progress_bar)
    return guide, result.params, loss


def run_demo(
    *,
    steps: int = 2000,
    num_train: int = 500,
    num_test: int = 2000,
    seed: int = 0,
    out: str | None = "demo_output",
    methods: Sequence[Method] | None = None,
    learning_rate: float = 0.02,
    num_draws: int = 1000,
    progress_bar: bool = False,
    report_fits: bool = True,
    stream: Any = sys.stdout,
) -> list[FitResult]:
    """Fit every method, print the comparison table and write the plot.

    :param int steps: SVI steps per fit.
    :param int num_train: number of training observations.
    :param int num_test: number of held-out observations.
    :param int seed: random seed of data, fits and evaluation.
    :param out: directory for ``predictive_bands.png``, or ``None`` for no plot.
    :param methods: the objectives to compare (default :data:`METHODS`).
    :param float learning_rate: Adam step size.
    :param int num_draws: posterior draws for scores, moments and bands.
    :param bool progress_bar: show SVI's progress bar for each fit.
    :param bool report_fits: end with :func:`numpyro_pvi.diagnostics.report`
        of every fit (does it work, read for its objective).
    :param stream: where to print progress and the table.
    :return: one :class:`FitResult` per method, in order.
    """
    methods = list(METHODS if methods is None else methods)
    key_train, key_test, key_fit, key_eval = random.split(random.PRNGKey(seed), 4)
    x, y = simulate(key_train, num_train)
    x_test, y_test = simulate(key_test, num_test)
    x_grid = jnp.linspace(-X_RANGE, X_RANGE, 121)

    results, bands, fits = [], [], []
    for method in methods:
        start = time.perf_counter()
        guide, params, loss = _fit(
            method,
            key_fit,
            x,
            y,
            steps=steps,
            learning_rate=learning_rate,
            progress_bar=progress_bar,
        )
        seconds = time.perf_counter() - start
        scores = predictive_score(
            key_eval, params, model, guide, x_test, y_test, num_draws=num_draws
        )
        latents = guide.sample_posterior(key_eval, params, sample_shape=(num_draws,))
        results.append(
            FitResult(
                name=method.name,
                heldout_log_score=float(np.mean(scores.score)),
                posterior_mean={k: float(jnp.mean(v)) for k, v in latents.items()},
                posterior_sd={k: float(jnp.std(v)) for k, v in latents.items()},
                seconds=seconds,
            )
        )
        bands.append(_predictive_bands(key_eval, latents, x_grid))
        fits.append((guide, params, loss))
        print(
            f"fitted {method.name:<24} {steps} steps in {seconds:5.1f} s", file=stream
        )

    print(_table(results, num_test), file=stream)
    if out is not None:
        path = _plot(results, bands, x, y, x_grid, out)
        print(f"wrote {path}", file=stream)
    if report_fits:
        for method, (guide, params, loss) in zip(methods, fits, strict=True):
            result = report(
                key_eval,
                params,
                model,
                guide,
                x,
                y,
                loss=loss,
                num_draws=num_draws,
                show=False,
            )
            print(f"\n--- {method.name}\n{result.attrs['report']}", file=stream)
    return results


def _predictive_bands(
    rng_key: jax.Array, latents: dict[str, jax.Array], x_grid: jax.Array
) -> jax.Array:
    """5%, 50% and 95% quantiles of the posterior predictive of :func:`model`
    at ``x_grid``, shape ``(3, len(x_grid))``."""
    a, b, sigma = (latents[k][:, None] for k in ("a", "b", "sigma"))
    eps = random.normal(rng_key, (a.shape[0], x_grid.shape[0]))
    y = a + b * x_grid + sigma * eps
    return jnp.quantile(y, jnp.array([0.05, 0.5, 0.95]), axis=0)


def _table(results: Sequence[FitResult], num_test: int) -> str:
    sites = list(results[0].posterior_mean)
    head = f"{'method':<24} {'held-out log score':>19}"
    head += "".join(f" {s + ' mean':>9} {s + ' sd':>8}" for s in sites)
    lines = [
        f"Held-out log predictive density per observation ({num_test} points; "
        "higher is better)",
        head,
        "-" * len(head),
    ]
    for r in results:
        row = f"{r.name:<24} {r.heldout_log_score:>19.4f}"
        row += "".join(
            f" {r.posterior_mean[s]:>9.3f} {r.posterior_sd[s]:>8.3f}" for s in sites
        )
        lines.append(row)
    lines.append(
        f"(true slope {TRUE_SLOPE}; the true predictive is matched by slope sd "
        f"{NOISE_GROWTH} and sigma 1)"
    )
    return "\n".join(lines)


def _plot(
    results: Sequence[FitResult],
    bands: Sequence[jax.Array],
    x: jax.Array,
    y: jax.Array,
    x_grid: jax.Array,
    out: str,
) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out, exist_ok=True)
    n = len(results)
    fig, axes = plt.subplots(1, n, figsize=(4 * n, 3.6), sharey=True, squeeze=False)
    mean = TRUE_INTERCEPT + TRUE_SLOPE * x_grid
    half = 1.6449 * noise_sd(x_grid)
    for ax, r, band in zip(axes[0], results, bands, strict=True):
        ax.scatter(np.asarray(x), np.asarray(y), s=4, color="0.6", label="data")
        ax.fill_between(
            np.asarray(x_grid),
            np.asarray(band[0]),
            np.asarray(band[2]),
            alpha=0.35,
            color="C0",
            label="90% predictive",
        )
        ax.plot(np.asarray(x_grid), np.asarray(band[1]), color="C0")
        for sign in (-1, 1):
            ax.plot(
                np.asarray(x_grid),
                np.asarray(mean + sign * half),
                "k--",
                lw=1,
                label="true 90%" if sign < 0 else None,
            )
        ax.set_title(f"{r.name}\nheld-out log score {r.heldout_log_score:.3f}")
        ax.set_xlabel("x")
    axes[0, 0].set_ylabel("y")
    axes[0, 0].legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path = os.path.join(out, "predictive_bands.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> list[FitResult]:
    """Command-line entry point (``python tutorials/demo.py``).

    :param argv: command-line arguments (default ``sys.argv[1:]``).
    :return: the :class:`FitResult` of each method.
    """
    parser = argparse.ArgumentParser(
        prog="python tutorials/demo.py",
        description="Compare ELBO and predictive objectives on a misspecified "
        "regression: held-out log score, posterior scales, predictive bands.",
    )
    parser.add_argument("--steps", type=int, default=2000, help="SVI steps per fit")
    parser.add_argument(
        "--out",
        default="demo_output",
        help="directory for the PNG (default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    parser.add_argument(
        "--num-draws",
        type=int,
        default=1000,
        help="posterior draws for scores and bands (default: %(default)s)",
    )
    parser.add_argument(
        "--methods",
        default=None,
        help="comma-separated subset of: " + ", ".join(m.name for m in METHODS),
    )
    parser.add_argument(
        "--progress-bar", action="store_true", help="show SVI's progress bar"
    )
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if args.num_draws < 1:
        parser.error(f"--num-draws must be >= 1, got {args.num_draws}")
    methods = METHODS
    if args.methods is not None:
        by_name = {m.name: m for m in METHODS}
        names = [n.strip() for n in args.methods.split(",") if n.strip()]
        unknown = [n for n in names if n not in by_name]
        if unknown or not names:
            parser.error(
                f"--methods: unknown {unknown or args.methods!r}; choose from "
                + ", ".join(by_name)
            )
        methods = [by_name[n] for n in names]
    return run_demo(
        steps=args.steps,
        seed=args.seed,
        out=args.out,
        methods=methods,
        num_draws=args.num_draws,
        progress_bar=args.progress_bar,
    )


if __name__ == "__main__":
    main()
