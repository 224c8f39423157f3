r"""Held-out predictive scores of VI and PVI on posteriordb models.

Reproduces the posteriordb experiment of Lai & Yao (2024, §4.3, Tables 2-4,
appendix E): for every model and every random 60/20/20 train / validation /
test split, fit a Gaussian guide by

- VI (``Trace_ELBO``),
- PVI-Log (``PredictiveELBO("log")``),
- PVI-CRPS (``PredictiveELBO("crps")``, continuous outcomes) or PVI-Quad
  (``PredictiveELBO("quadratic")``, finite-support outcomes),

choose the regularizer and its weight :math:`\lambda \in \{0, 0.01, 0.1, 1\}
\times \{\text{prior}, \text{posterior}\}` of each PVI objective by its own
score on the validation split, and report the test log score, CRPS and
quadratic score (sums over the test split; mean and sd over seeds). Every
number is computed with :func:`numpyro_pvi.predictive_score`.

The harness (:func:`benchmarks.harness.run_benchmark`, candidates in
:mod:`benchmarks.candidates`) is model-agnostic: give it a model, a
list of :class:`DataSplit` (one per seed), the objectives as lists of
candidate losses, and the guides::

    from numpyro.infer import Trace_ELBO
    from numpyro.infer.autoguide import AutoNormal

    splits = [random_split(data, num_obs=n, seed=s) for s in range(5)]
    results = run_benchmark(
        my_model,
        splits,
        {
            "VI": Objective([("-", Trace_ELBO(num_particles=100))]),
            "PVI-Log": pvi_objective("log", num_particles=100),
        },
        guides={"diag": AutoNormal},
        scores=("log",),
        num_steps=2000,
    )
    print(format_table(results))

The model takes the data as keyword arguments (``model(**split.train)``);
per-observation arrays of all seeds' splits must have equal shapes so that
the seeds are fitted in one vectorised program (``random_split`` guarantees
it).

Budget: 2000 Adam steps per fit by default, the step size decaying from
0.03 to 0.003 (the paper ran 200,000 steps). This reaches the losses of
4000 steps at 0.01 on every model, and those of 8000 steps on nes and
earnings; kidscore's ill-conditioned interaction regression still improves
slowly (see ``benchmarks/RESULTS.md``). ``--steps`` and ``--lr`` change it.

Command line (the paper's models; the data directory defaults to
``../shared/data/posteriordb`` relative to the repository)::

    python -m benchmarks.posteriordb [DATA_DIR] [--steps N] [--seeds S]

**References**

1. Lai, J. & Yao, Y. (2024). *Predictive variational inference: Learn the
   predictively optimal posterior distribution*. arXiv:2410.14843.
2. Magnusson, M. et al. *posteriordb: a set of posteriors for Bayesian
   inference and probabilistic programming*. github.com/stan-dev/posteriordb.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints
from numpyro.infer import Trace_ELBO
from numpyro.infer.autoguide import AutoNormal

from benchmarks.candidates import Objective, pvi_objective
from benchmarks.cv_harness import format_paired, format_stacked, run_cv_benchmark
from benchmarks.dense_guide import DenseGuide
from benchmarks.harness import (
    DataSplit,
    format_table,
    merge_validation,
    random_split,
    run_benchmark,
)
from numpyro_pvi.scores import get_score

__all__ = ["DenseGuide", "paper_models"]


# --------------------------------------------------------------------------
# the paper's posteriordb models
# --------------------------------------------------------------------------


def _flat(shape: tuple[int, ...] = ()) -> dist.Distribution:
    """The improper flat prior Stan uses for an unbounded parameter."""
    return dist.ImproperUniform(constraints.real, (), shape)


def linear_normal_model(sigma_prior: Callable[[], dist.Distribution]) -> Callable:
    r"""Normal linear regression with flat coefficients (posteriordb style).

    :math:`y_i \sim N(\beta_1 + \sum_k \beta_{k+1} x_{ik}, \sigma)` with an
    improper flat prior on :math:`\beta`. The coefficients are
    parameterised on standardised covariates and outcome,
    :math:`\mu_i = m_y + s_y(\gamma_0 + \sum_k \gamma_k (x_{ik} - m_k)/s_k)`,
    with constants from the training split; this is an affine bijection of
    :math:`\beta` with a constant Jacobian, so under the flat prior the
    posterior predictive is exactly that of the posteriordb program. The
    latent ``sigma`` is on the outcome's scale with the program's prior.

    :param sigma_prior: returns the prior of ``sigma``.
    :return: ``model(x, y, x_loc, x_scale, y_loc, y_scale)``.
    """

    def model(x, y, x_loc, x_scale, y_loc, y_scale):
        z = (x - x_loc) / x_scale
        gamma = numpyro.sample("gamma", _flat((z.shape[-1] + 1,)))
        sigma = numpyro.sample("sigma", sigma_prior())
        mu = y_loc + y_scale * (gamma[0] + z @ gamma[1:])
        with numpyro.plate("obs", y.shape[0]):
            numpyro.sample("y", dist.Normal(mu, sigma), obs=y)

    return model


def _standardise(split: DataSplit) -> DataSplit:
    """Add training-split centring and scaling constants to every part."""
    x, y = np.asarray(split.train["x"]), np.asarray(split.train["y"])
    consts = {
        "x_loc": x.mean(0),
        "x_scale": np.where(x.std(0) > 0, x.std(0), 1.0),
        "y_loc": y.mean(),
        "y_scale": y.std(),
    }
    return DataSplit(*({**part, **consts} for part in split))


def glmm_poisson_model(year_all, idx, C):
    r"""posteriordb ``GLMM_Poisson_model``: Poisson counts with year effects.

    :math:`C_t \sim \text{Poisson}(\exp(\alpha + \beta_1 t + \beta_2 t^2 +
    \beta_3 t^3 + \varepsilon_t))`, :math:`\varepsilon_t \sim N(0, \sigma)`,
    uniform priors on the bounded parameters as in the Stan program. The
    year effects of all years are latent; the observed years are ``idx``, so
    the effects of held-out years are predicted from their prior given
    :math:`\sigma` (through the guide).
    """
    alpha = numpyro.sample("alpha", dist.Uniform(-20.0, 20.0))
    beta = numpyro.sample("beta", dist.Uniform(-10.0, 10.0).expand([3]).to_event(1))
    sigma = numpyro.sample("sigma", dist.Uniform(0.0, 5.0))
    eps = numpyro.sample(
        "eps", dist.Normal(0.0, sigma).expand([year_all.shape[0]]).to_event(1)
    )
    t = year_all[idx]
    log_lambda = alpha + beta[0] * t + beta[1] * t**2 + beta[2] * t**3 + eps[idx]
    with numpyro.plate("obs", idx.shape[0]):
        numpyro.sample("C", dist.Poisson(jnp.exp(log_lambda)), obs=C)


class PaperModel(NamedTuple):
    """One posteriordb posterior of the paper's benchmark."""

    name: str
    posterior: str
    model: Callable
    #: ``splits(seed)``: 60/20/20 train / validation / test; with
    #: ``merged=True`` train and validation are one fitting part (``train``,
    #: ``validation`` empty), as cross-validation uses them.
    splits: Callable[..., DataSplit]
    outcome: str  # "continuous", "count" or "binary"


def _load(data_dir: Path, name: str) -> dict[str, Any]:
    path = data_dir / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(
            f"posteriordb data file {path} not found; pass the directory that "
            "holds the posteriordb JSON data as DATA_DIR."
        )
    return json.loads(path.read_text())


def paper_models(data_dir: str | os.PathLike) -> dict[str, PaperModel]:
    """The paper's posteriordb models whose data are in ``data_dir``.

    :param data_dir: directory with the posteriordb JSON data files
        (``kidiq.json``, ``earnings.json``, ``nes2000.json``,
        ``GLMM_Poisson_data.json``).
    :return: model key -> :class:`PaperModel`, for the files present.
    """
    data_dir = Path(data_dir)
    models: dict[str, PaperModel] = {}

    def regression(raw_x: np.ndarray, y: np.ndarray) -> Callable[[int], DataSplit]:
        data = {"x": raw_x.astype(np.float32), "y": y.astype(np.float32)}

        def split(seed: int, *, merged: bool = False) -> DataSplit:
            parts = random_split(data, num_obs=len(y), seed=seed)
            if merged:
                parts = merge_validation(parts, ("x", "y"))
            return _standardise(parts)

        return split

    if (data_dir / "kidiq.json").exists():
        d = _load(data_dir, "kidiq")
        hs, iq = np.asarray(d["mom_hs"], float), np.asarray(d["mom_iq"], float)
        models["kidscore"] = PaperModel(
            "kidscore",
            "kidiq-kidscore_interaction",
            linear_normal_model(lambda: dist.HalfCauchy(2.5)),
            regression(np.stack([hs, iq, hs * iq], 1), np.asarray(d["kid_score"])),
            "continuous",
        )
    if (data_dir / "earnings.json").exists():
        d = _load(data_dir, "earnings")
        h, male = np.asarray(d["height"], float), np.asarray(d["male"], float)
        models["earnings"] = PaperModel(
            "earnings",
            "earnings-logearn_interaction",
            linear_normal_model(
                lambda: dist.ImproperUniform(constraints.positive, (), ())
            ),
            regression(
                np.stack([h, male, h * male], 1), np.log(np.asarray(d["earn"], float))
            ),
            "continuous",
        )
    if (data_dir / "nes2000.json").exists():
        d = _load(data_dir, "nes2000")
        age = np.asarray(d["age_discrete"])
        cols = [np.asarray(d[k], float) for k in ("real_ideo", "race_adj")]
        cols += [(age == a).astype(float) for a in (2, 3, 4)]
        cols += [np.asarray(d[k], float) for k in ("educ1", "gender", "income")]
        models["nes"] = PaperModel(
            "nes",
            "nes2000-nes",
            linear_normal_model(
                lambda: dist.ImproperUniform(constraints.positive, (), ())
            ),
            regression(np.stack(cols, 1), np.asarray(d["partyid7"], float)),
            "continuous",
        )
    if (data_dir / "GLMM_Poisson_data.json").exists():
        d = _load(data_dir, "GLMM_Poisson_data")
        year = np.asarray(d["year"], np.float32)
        counts = np.asarray(d["C"], np.int32)
        n = len(counts)

        def glmm_split(seed: int, *, merged: bool = False) -> DataSplit:
            split = random_split(
                {"idx": np.arange(n), "C": counts}, num_obs=n, seed=seed
            )
            if merged:
                split = merge_validation(split, ("idx", "C"))
            return DataSplit(*({**p, "year_all": year} for p in split))

        models["glmm"] = PaperModel(
            "glmm",
            "GLMM_Poisson_data-GLMM_Poisson_model",
            glmm_poisson_model,
            glmm_split,
            "count",
        )
    return models


def _has_score(name: str) -> bool:
    try:
        get_score(name)
    except ValueError:
        return False
    return True


def paper_objectives(outcome: str, num_particles: int) -> dict[str, Objective]:
    """VI, PVI-Log and the outcome's second PVI score, as in the paper."""
    objectives = {
        "VI": Objective([("-", Trace_ELBO(num_particles=num_particles))]),
        "PVI-Log": pvi_objective("log", num_particles=num_particles),
    }
    second = {"continuous": "crps", "binary": "quadratic"}.get(outcome)
    if second is not None and _has_score(second):
        label = {"crps": "PVI-CRPS", "quadratic": "PVI-Quad"}[second]
        objectives[label] = pvi_objective(second, num_particles=num_particles)
    return objectives


def paper_scores(outcome: str) -> tuple[str, ...]:
    """Test scores that exist for the outcome and are registered."""
    wanted = {
        "continuous": ("log", "crps"),
        "binary": ("log", "crps", "quadratic"),
        # the CRPS needs reparameterised simulated counts, which Poisson
        # draws are not
        "count": ("log",),
    }[outcome]
    return tuple(s for s in wanted if _has_score(s))


def _default_data_dir() -> Path:
    return (
        Path(__file__).resolve().parents[1].parent / "shared" / "data" / "posteriordb"
    )


def _as_json(r: Any) -> dict[str, Any]:
    """One :class:`~benchmarks.harness.BenchmarkResult` as JSON values."""
    return {
        "guide": r.guide,
        "objective": r.objective,
        "selected": r.selected,
        "test": {k: v.tolist() for k, v in r.test.items()},
        "validation": {k: v.tolist() for k, v in r.validation.items()},
        "final_loss": {k: v.tolist() for k, v in r.final_loss.items()},
        "seconds": r.seconds,
        "cpu_seconds": r.cpu_seconds,
    }


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "data_dir",
        nargs="?",
        default=str(_default_data_dir()),
        help="directory with the posteriordb JSON data "
        "(default: ../shared/data/posteriordb from the repository)",
    )
    parser.add_argument(
        "--models",
        default="kidscore,earnings,nes,glmm",
        help="comma-separated subset of the models",
    )
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--num-particles", type=int, default=100)
    parser.add_argument("--num-draws", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=3e-2)
    parser.add_argument(
        "--guides",
        default="diag,dense",
        help="comma-separated subset of diag (AutoNormal) and "
        "dense (AutoMultivariateNormal)",
    )
    parser.add_argument(
        "--objectives",
        default="VI,PVI-Log,PVI-CRPS,PVI-Quad",
        help="comma-separated subset of the objectives",
    )
    parser.add_argument(
        "--selection",
        choices=("cv", "split"),
        default="cv",
        help="cv: 5-fold cross-validation (numpyro_pvi.selection) on train + "
        "validation; split: the paper's grid chosen on the validation split",
    )
    parser.add_argument("--json", default=None, help="write the raw results here")
    parser.add_argument(
        "--jax-cache",
        default=None,
        metavar="DIR",
        help="persistent JAX compilation cache (reused by later "
        "runs, at the same --steps)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = _parse_args(argv)
    if args.jax_cache:
        jax.config.update("jax_compilation_cache_dir", args.jax_cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)

    data_dir = Path(args.data_dir)
    if not data_dir.is_dir():
        raise SystemExit(f"data directory {data_dir} does not exist")
    available = paper_models(data_dir)
    wanted = [m for m in args.models.split(",") if m]
    unknown = set(wanted) - {"kidscore", "earnings", "nes", "glmm"}
    if unknown:
        raise SystemExit(f"unknown models {sorted(unknown)}")
    all_guides = {"diag": AutoNormal, "dense": DenseGuide}
    guides = {g: all_guides[g] for g in args.guides.split(",") if g}
    missing = [s for s in ("crps", "quadratic") if not _has_score(s)]
    print(
        f"data: {data_dir}  steps: {args.steps}  seeds: {args.seeds}  "
        f"M: {args.num_particles}  draws: {args.num_draws}  lr: {args.lr}  "
        f"load: {os.getloadavg()[0]:.2f}"
    )
    if missing:
        print(f"scores not available in this version: {missing}")
    tables, raw = [], {}
    start, cpu_start = time.perf_counter(), time.process_time()
    for key in wanted:
        if key not in available:
            print(f"{key}: data not found in {data_dir}, skipped")
            continue
        pm = available[key]
        t0, c0 = time.perf_counter(), time.process_time()
        if args.selection == "cv":
            results = run_cv_benchmark(
                pm.model,
                [pm.splits(s, merged=True) for s in range(args.seeds)],
                guides,
                cv_scores=[s for s in ("log", "crps") if s in paper_scores(pm.outcome)],
                test_scores=paper_scores(pm.outcome),
                num_steps=args.steps,
                learning_rate=args.lr,
                num_particles=args.num_particles,
                num_draws=args.num_draws,
                progress=lambda line, key=key: print(f"{key:>8} {line}", flush=True),
            )
        else:
            results = run_benchmark(
                pm.model,
                [pm.splits(s) for s in range(args.seeds)],
                {
                    k: v
                    for k, v in paper_objectives(pm.outcome, args.num_particles).items()
                    if k in args.objectives.split(",")
                },
                guides,
                scores=paper_scores(pm.outcome),
                num_steps=args.steps,
                learning_rate=args.lr,
                num_draws=args.num_draws,
                progress=lambda line, key=key: print(f"{key:>8} {line}", flush=True),
            )
        table = format_table(results, title=key)
        if args.selection == "cv":
            print(format_paired(results, title=key))
            print(format_stacked(results, title=key))
        print(
            f"{key}: {time.perf_counter() - t0:.0f}s wall, "
            f"{time.process_time() - c0:.0f}s CPU, load "
            f"{os.getloadavg()[0]:.2f}\n{table}\n",
            flush=True,
        )
        tables.append(table)
        raw[key] = [_as_json(r) for r in results]
    total = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    print(
        f"total: {total:.0f}s wall ({total / 60:.1f} min), {cpu:.0f}s CPU "
        f"(all threads), load {os.getloadavg()[0]:.2f}"
    )
    if tables:
        head, *rest = tables
        print("\n".join([head] + [t.split("\n", 2)[2] for t in rest]))
    if args.json:
        record = {"args": vars(args), "seconds": total, "cpu_seconds": cpu}
        Path(args.json).write_text(json.dumps({**record, "results": raw}, indent=1))


if __name__ == "__main__":
    main()
