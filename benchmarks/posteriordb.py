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

The harness (:func:`run_benchmark`) is model-agnostic: give it a model, a
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
slowly (see ``benchmarks/RESULTS.md``). ``--steps`` and ``--lr`` change it;
the step count is a traced argument, so with ``--jax-cache DIR`` a rerun at
another budget reuses the compiled programs.

Command line (the paper's models; the data directory defaults to
``../shared/data/posteriordb`` relative to the repository)::

    python benchmarks/posteriordb.py [DATA_DIR] [--steps N] [--seeds S]

**References**

1. Lai, J. & Yao, Y. (2024). *Predictive variational inference: Learn the
   predictively optimal posterior distribution*. arXiv:2410.14843.
2. Magnusson, M. et al. *posteriordb: a set of posteriors for Bayesian
   inference and probabilistic programming*. github.com/stan-dev/posteriordb.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
from jax import random
from numpyro.distributions import constraints
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoMultivariateNormal, AutoNormal
from numpyro.infer.elbo import ELBO

from numpyro_pvi import PredictiveELBO, predictive_score
from numpyro_pvi.scores import get_score

__all__ = [
    "BenchmarkResult",
    "DataSplit",
    "DenseGuide",
    "Objective",
    "format_table",
    "paper_models",
    "pvi_objective",
    "random_split",
    "run_benchmark",
]

#: λ grid and regularizers of the paper's validation search.
PAPER_LAMS = (0.0, 0.01, 0.1, 1.0)
PAPER_REGULARIZERS = ("prior", "posterior")
#: Report order and display names of the scores.
SCORE_NAMES = {"log": "log score", "crps": "CRPS", "quadratic": "quadratic"}


# --------------------------------------------------------------------------
# the harness
# --------------------------------------------------------------------------


class DataSplit(NamedTuple):
    """One seed's train / validation / test data, as model keyword arguments.

    Each field maps the model's keyword argument names to arrays; the model
    is called as ``model(**split.train)`` to fit and
    ``model(**split.validation)``, ``model(**split.test)`` to score.
    """

    train: dict[str, Any]
    validation: dict[str, Any]
    test: dict[str, Any]


def random_split(
    data: Mapping[str, Any],
    *,
    num_obs: int,
    seed: int,
    fractions: tuple[float, float, float] = (0.6, 0.2, 0.2),
    per_observation: Sequence[str] | None = None,
) -> DataSplit:
    """Random train / validation / test split of a data set.

    :param data: model keyword arguments; arrays whose leading axis has
        length ``num_obs`` are split (or those named in ``per_observation``),
        everything else is passed unchanged to all three parts.
    :param int num_obs: number of observations.
    :param int seed: seed of the permutation.
    :param fractions: train, validation and test fractions (summing to 1).
    :param per_observation: names of the arrays indexed by observation.
    :return: a :class:`DataSplit`; the part sizes depend only on ``num_obs``
        and ``fractions``, so splits of different seeds stack.
    """
    if len(fractions) != 3 or not math.isclose(sum(fractions), 1.0):
        raise ValueError(
            f"random_split: fractions must be three numbers summing to 1, got "
            f"{fractions!r}."
        )
    n_train = int(round(fractions[0] * num_obs))
    n_val = int(round(fractions[1] * num_obs))
    if min(n_train, n_val, num_obs - n_train - n_val) < 1:
        raise ValueError(
            f"random_split: num_obs={num_obs} is too small for fractions "
            f"{fractions!r} (every part needs an observation)."
        )
    perm = np.random.default_rng(seed).permutation(num_obs)
    parts = np.split(perm, [n_train, n_train + n_val])
    if per_observation is None:
        per_observation = [
            k for k, v in data.items() if np.ndim(v) >= 1 and len(v) == num_obs
        ]
    missing = set(per_observation) - set(data)
    if missing:
        raise ValueError(
            f"random_split: per_observation names {sorted(missing)} are not in data."
        )
    out = []
    for idx in parts:
        out.append(
            {
                k: (np.asarray(v)[idx] if k in per_observation else v)
                for k, v in data.items()
            }
        )
    return DataSplit(*out)


class Candidates(NamedTuple):
    """A grid of settings of one loss, fitted in one compiled program.

    ``make_loss(value)`` is called inside the traced fit with one entry of
    ``values`` as a traced scalar and returns the loss for that setting, so
    all settings of the grid are fitted by one compiled program (a
    ``lax.map`` over ``values`` of fits vectorised over the seeds). A fixed
    loss is ``Candidates((label,), (0.0,), lambda _: loss)`` (see
    :meth:`single`).

    :ivar labels: one label per setting.
    :ivar values: one scalar per setting.
    :ivar make_loss: builds a NumPyro :class:`~numpyro.infer.elbo.ELBO`
        from a (traced) scalar.
    """

    labels: tuple[str, ...]
    values: tuple[float, ...]
    make_loss: Callable[[jax.Array], ELBO]

    @classmethod
    def single(cls, label: str, loss: ELBO) -> Candidates:
        """One fixed loss.

        :param label: its label.
        :param loss: a NumPyro :class:`~numpyro.infer.elbo.ELBO`.
        :return: a one-setting :class:`Candidates`.
        """
        if not isinstance(loss, ELBO):
            raise TypeError(
                f"Candidates.single: {label!r} is {loss!r}, not a "
                "numpyro.infer.elbo.ELBO."
            )
        return cls((label,), (0.0,), lambda _: loss)


@dataclass(frozen=True)
class Objective:
    """An objective and its candidate settings chosen among on validation.

    :param candidates: :class:`Candidates` grids, or ``(label, loss)`` pairs
        (each a fixed NumPyro :class:`~numpyro.infer.elbo.ELBO`), e.g. one
        per :math:`(\\lambda, \\text{regularizer})`.
    :param select_by: the score (name as in :func:`predictive_score`) whose
        validation sum picks the candidate for each seed; ``None`` when there
        is a single candidate.
    """

    candidates: Sequence[Candidates | tuple[str, ELBO]]
    select_by: str | None = None

    def __post_init__(self) -> None:
        grids = tuple(
            c if isinstance(c, Candidates) else Candidates.single(*c)
            for c in self.candidates
        )
        object.__setattr__(self, "candidates", grids)
        if not grids:
            raise ValueError("Objective: candidates must not be empty.")
        for grid in grids:
            if len(grid.labels) != len(grid.values) or not grid.labels:
                raise ValueError(
                    f"Objective: a grid needs one label per value, got "
                    f"{grid.labels!r} and {grid.values!r}."
                )
        if len(set(self.labels)) != len(self.labels):
            raise ValueError(f"Objective: candidate labels repeat: {self.labels}.")
        if len(self.labels) > 1 and self.select_by is None:
            raise ValueError(
                "Objective: several candidates need select_by=<score name> to "
                "choose among them on the validation split."
            )

    @property
    def labels(self) -> list[str]:
        """All candidate labels, grid by grid."""
        return [label for grid in self.candidates for label in grid.labels]


class _GridPredictiveELBO(PredictiveELBO):
    """:class:`~numpyro_pvi.PredictiveELBO` whose λ may be a traced scalar.

    Only for fitting a grid of λ in one program: the regularizer is always
    computed (λ = 0 then multiplies it by zero). The grid's values are
    validated by :func:`pvi_objective` through ``PredictiveELBO`` itself.
    """

    def __init__(self, score: str, *, lam: jax.Array, **kwargs: Any) -> None:
        super().__init__(score, lam=1.0, **kwargs)
        self.lam = lam

    @property
    def _uses_regularizer(self) -> bool:
        return self.regularizer is not None


def pvi_objective(
    score: str,
    *,
    num_particles: int = 100,
    lams: Sequence[float] = PAPER_LAMS,
    regularizers: Sequence[str] = PAPER_REGULARIZERS,
    **kwargs: Any,
) -> Objective:
    """PVI with the paper's validation grid over λ and the regularizer.

    λ = 0 makes the regularizer irrelevant, so it is one candidate (fitted in
    the first regularizer's grid). Each regularizer's λ grid is fitted in
    one compiled program.

    :param score: the scoring rule of :class:`~numpyro_pvi.PredictiveELBO`;
        the same score selects the candidate on validation.
    :param int num_particles: ``M``.
    :param lams: the weights λ.
    :param regularizers: the regularizers.
    :param kwargs: further :class:`~numpyro_pvi.PredictiveELBO` arguments.
    :return: an :class:`Objective`.
    """
    lams = sorted({float(lam) for lam in lams})
    grids = []
    for i, reg in enumerate(regularizers):
        values = [lam for lam in lams if lam > 0 or i == 0]
        if not values:
            continue
        for lam in values:  # validates score, lam, regularizer and kwargs
            PredictiveELBO(
                score, num_particles=num_particles, regularizer=reg, lam=lam, **kwargs
            )
        labels = tuple("lam=0" if lam == 0 else f"{reg} lam={lam:g}" for lam in values)

        def make_loss(lam: jax.Array, reg: str = reg) -> ELBO:
            return _GridPredictiveELBO(
                score, num_particles=num_particles, regularizer=reg, lam=lam, **kwargs
            )

        grids.append(Candidates(labels, tuple(values), make_loss))
    return Objective(grids, select_by=score)


@dataclass
class BenchmarkResult:
    """Scores of one (guide, objective) pair over the seeds.

    :ivar guide: the guide's label.
    :ivar objective: the objective's label.
    :ivar selected: the candidate chosen on validation, per seed.
    :ivar validation: candidate label -> ``(S,)`` validation sums of the
        objective's ``select_by`` score (empty with one candidate).
    :ivar test: score name -> ``(S,)`` test sums of the selected fits.
    :ivar final_loss: candidate label -> ``(S,)`` mean loss over the last
        10% of the steps.
    :ivar params: candidate label -> fitted parameters with a leading seed
        axis.
    :ivar seconds: wall time of the fits and evaluations.
    :ivar cpu_seconds: their CPU time (all threads of the process).
    """

    guide: str
    objective: str
    selected: list[str]
    validation: dict[str, np.ndarray]
    test: dict[str, np.ndarray]
    final_loss: dict[str, np.ndarray]
    params: dict[str, Any] = field(repr=False)
    seconds: float = 0.0
    cpu_seconds: float = 0.0


def _stack(trees: Sequence[Any]) -> Any:
    try:
        return jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *trees)
    except ValueError as err:
        raise ValueError(
            "run_benchmark: the splits of different seeds must have the same "
            "keys and array shapes (use random_split) so the seeds are fitted "
            f"in one vectorised program: {err}"
        ) from None


def _fitter(
    model: Callable,
    guide: Callable,
    make_loss: Callable[[jax.Array], ELBO],
    learning_rate: float,
) -> Callable:
    """``jit`` of SVI runs, mapped over the grid values (outer axis, a
    ``lax.map``) and vectorised over the seeds (inner axis, ``vmap``; the same
    keys for every value).

    The grid is a sequential ``lax.map``, not a second ``vmap``: the extra
    vectorisation bought little (the dense guide's LAPACK deadlock is avoided
    by :class:`DenseGuide`).

    The number of steps is a traced argument (a ``fori_loop``), so one
    compiled program serves every budget. Adam's step size decays from
    ``learning_rate`` to a tenth of it on a cosine over the budget. Returns
    the parameters and the mean loss over the last 10% of the steps.
    """

    def one(value: jax.Array, key: jax.Array, data: dict, num_steps: jax.Array):
        def schedule(t: jax.Array) -> jax.Array:
            frac = jnp.minimum(t / num_steps, 1.0)
            return learning_rate * (0.1 + 0.45 * (1.0 + jnp.cos(jnp.pi * frac)))

        svi = SVI(model, guide, optax.adam(schedule), loss=make_loss(value))
        state = svi.init(key, **data)
        tail_start = num_steps - jnp.maximum(1, num_steps // 10)

        def step(i: jax.Array, carry: tuple) -> tuple:
            state, acc = carry
            state, loss = svi.update(state, **data)
            return state, acc + jnp.where(i >= tail_start, loss, 0.0)

        state, acc = jax.lax.fori_loop(0, num_steps, step, (state, jnp.zeros(())))
        return svi.get_params(state), acc / (num_steps - tail_start)

    over_seeds = jax.vmap(one, in_axes=(None, 0, 0, None))

    def over_grid(values: jax.Array, keys: jax.Array, data: dict, num_steps):
        return jax.lax.map(lambda v: over_seeds(v, keys, data, num_steps), values)

    return jax.jit(over_grid)


def _scorer(model: Callable, guide: Callable, score: str, num_draws: int) -> Callable:
    """``jit(vmap)`` over seeds of the summed ``predictive_score``."""

    def one(key: jax.Array, params: Any, data: dict[str, Any]) -> jax.Array:
        return jnp.sum(
            predictive_score(
                key, params, model, guide, score=score, num_draws=num_draws, **data
            )
        )

    return jax.jit(jax.vmap(one))


class _Scorers:
    """Compiled scorers of one model and guide, one per score name."""

    def __init__(self, model: Callable, guide: Callable, num_draws: int) -> None:
        self.model, self.guide, self.num_draws = model, guide, num_draws
        self.compiled: dict[str, Callable] = {}

    def __call__(self, name: str) -> Callable:
        if name not in self.compiled:
            self.compiled[name] = _scorer(self.model, self.guide, name, self.num_draws)
        return self.compiled[name]


def _pick(best: np.ndarray, candidates: list[Any]) -> Any:
    """Stack candidate ``best[s]``'s parameters of seed ``s`` over seeds."""
    return jax.tree.map(
        lambda *xs: jnp.stack([xs[c][s] for s, c in enumerate(best)]), *candidates
    )


def run_benchmark(
    model: Callable,
    splits: Sequence[DataSplit],
    objectives: Mapping[str, Objective],
    guides: Mapping[str, Callable[[Callable], Callable]],
    *,
    scores: Sequence[str] = ("log",),
    num_steps: int = 2000,
    learning_rate: float = 3e-2,
    num_draws: int = 1000,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> list[BenchmarkResult]:
    r"""Fit every objective with every guide on every split and score it.

    For each guide and objective, every candidate loss is fitted on the
    training part of all splits at once (``vmap`` over the seeds, ``lax.map``
    over the values of a :class:`Candidates` grid, inside one ``jit``) with Adam
    whose step size decays from ``learning_rate`` to a tenth of it (cosine
    schedule). The candidate with the largest validation
    sum of the objective's ``select_by`` score is kept per seed, and its
    test sums of every score in ``scores`` are returned. All scores are
    :func:`numpyro_pvi.predictive_score` sums (positively oriented: higher
    is better; the CRPS is reported as :math:`-\sum_i S_{\rm CRPS}`
    by :func:`format_table`).

    :param model: NumPyro model taking the data as keyword arguments.
    :param splits: one :class:`DataSplit` per seed, with equal shapes.
    :param objectives: label -> :class:`Objective`.
    :param guides: label -> guide constructor called with the model, e.g.
        ``AutoNormal``.
    :param scores: scores evaluated on the test split.
    :param int num_steps: optimisation steps of each fit.
    :param float learning_rate: initial Adam step size.
    :param int num_draws: guide draws of each :func:`predictive_score`.
    :param int seed: seed of the optimisation and evaluation keys.
    :param progress: optional callable receiving one line per fitted
        candidate.

    The keys are ``random.split(PRNGKey(k), S)`` for the ``S`` seeds, with
    ``k = seed`` for the fits (the same for every candidate), ``seed + 1``
    for validation and ``seed + 2`` for the test scores, so a test number is
    ``predictive_score(test_keys[s], params, model, guide, **split.test)``
    summed.
    :return: one :class:`BenchmarkResult` per (guide, objective).
    """
    if not splits:
        raise ValueError("run_benchmark: splits must not be empty.")
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(
            f"run_benchmark: num_steps must be a positive int, got {num_steps!r}."
        )
    train = _stack([s.train for s in splits])
    validation = _stack([s.validation for s in splits])
    test = _stack([s.test for s in splits])
    num_seeds = len(splits)
    steps = jnp.asarray(num_steps, dtype=jnp.int32)
    fit_keys = random.split(random.PRNGKey(seed), num_seeds)
    val_keys = random.split(random.PRNGKey(seed + 1), num_seeds)
    test_keys = random.split(random.PRNGKey(seed + 2), num_seeds)

    results = []
    for guide_label, make_guide in guides.items():
        guide = make_guide(model)
        # Build the guide's prototype once, eagerly, on the first training
        # split, so that the vectorised fits share it.
        SVI(model, guide, optax.adam(learning_rate), loss=Trace_ELBO()).init(
            random.PRNGKey(seed), **splits[0].train
        )
        scorers = _Scorers(model, guide, num_draws)
        for obj_label, objective in objectives.items():
            start, cpu_start = time.perf_counter(), time.process_time()
            params, final_loss, val = {}, {}, {}
            select = objective.select_by if len(objective.labels) > 1 else None
            for grid in objective.candidates:
                fit = _fitter(model, guide, grid.make_loss, learning_rate)
                values = jnp.asarray(grid.values, dtype=jnp.result_type(float))
                grid_params, last = fit(values, fit_keys, train, steps)
                for c, label in enumerate(grid.labels):
                    params[label] = jax.tree.map(lambda x, c=c: x[c], grid_params)
                    final_loss[label] = np.asarray(last[c])
                    if select is not None:
                        val[label] = np.asarray(
                            scorers(select)(val_keys, params[label], validation)
                        )
                    if progress is not None:
                        progress(
                            f"{guide_label:>6} {obj_label:<9} {label:<20} "
                            f"loss {np.mean(final_loss[label]):12.3f}"
                            + (f"  val {np.mean(val[label]):10.2f}" if val else "")
                            + f"  [{time.perf_counter() - start:6.1f}s]"
                        )
            labels = objective.labels
            if val:
                table = np.stack([val[label] for label in labels])  # (C, S)
                best = np.argmax(np.where(np.isnan(table), -np.inf, table), axis=0)
            else:
                best = np.zeros(num_seeds, dtype=int)
            selected = [labels[c] for c in best]
            chosen = _pick(best, [params[label] for label in labels])
            test_scores = {
                name: np.asarray(scorers(name)(test_keys, chosen, test))
                for name in scores
            }
            results.append(
                BenchmarkResult(
                    guide=guide_label,
                    objective=obj_label,
                    selected=selected,
                    validation=val,
                    test=test_scores,
                    final_loss=final_loss,
                    params=params,
                    seconds=time.perf_counter() - start,
                    cpu_seconds=time.process_time() - cpu_start,
                )
            )
    return results


def format_table(
    results: Sequence[BenchmarkResult], *, title: str | None = None
) -> str:
    """Markdown table of test scores: mean (sd) over seeds.

    The log and quadratic scores are shown as sums of positively oriented
    scores (higher is better); the CRPS is shown as the sum of the CRPS
    (lower is better).

    :param results: the output of :func:`run_benchmark`.
    :param title: optional first column value (e.g. the model name).
    :return: the table as a string.
    """
    names = []
    for r in results:
        names += [n for n in r.test if n not in names]
    head = (
        ["model", "guide", "method"]
        + [SCORE_NAMES.get(n, n) + (" ↓" if n == "crps" else " ↑") for n in names]
        + ["selected (per seed)"]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        cells = [title or "", r.guide, r.objective]
        for n in names:
            if n not in r.test:
                cells.append("—")
                continue
            x = -r.test[n] if n == "crps" else r.test[n]
            sd = np.std(x, ddof=1) if len(x) > 1 else float("nan")
            cells.append(f"{np.mean(x):.1f} ({sd:.1f})")
        sel = sorted(set(r.selected), key=r.selected.index)
        cells.append(", ".join(f"{s}×{r.selected.count(s)}" for s in sel))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------
# the dense guide
# --------------------------------------------------------------------------


def _forward_substitution(scale_tril: jax.Array, b: jax.Array) -> jax.Array:
    """``L^{-1} b`` for lower-triangular ``L`` by a ``fori_loop`` over rows."""
    batch = jnp.broadcast_shapes(scale_tril.shape[:-2], b.shape[:-1])
    d = b.shape[-1]
    tril = jnp.broadcast_to(scale_tril, batch + (d, d))
    b = jnp.broadcast_to(b, batch + (d,))

    def row(i: jax.Array, z: jax.Array) -> jax.Array:
        l_i = jax.lax.dynamic_index_in_dim(tril, i, -2, keepdims=False)
        l_ii = jax.lax.dynamic_index_in_dim(l_i, i, -1, keepdims=False)
        b_i = jax.lax.dynamic_index_in_dim(b, i, -1, keepdims=False)
        z_i = (b_i - jnp.sum(l_i * z, axis=-1)) / l_ii  # z[i:] is still 0
        return jax.lax.dynamic_update_index_in_dim(z, z_i, i, -1)

    return jax.lax.fori_loop(0, d, row, jnp.zeros_like(b))


class _MultivariateNormalSubstitution(dist.MultivariateNormal):
    """:class:`~numpyro.distributions.MultivariateNormal` whose ``log_prob``
    solves the triangular system by forward substitution in XLA instead of
    LAPACK's ``trsm``.

    On CPU, jaxlib runs batched ``trsm`` calls on XLA's intra-op thread pool
    from inside that pool; with the dense glmm guide (45 dimensions, batched
    over seeds and particles) this deadlocked the pool on 2 cores in every
    run we made (native stacks: both pool threads waiting in
    ``TriMatrixEquationSolver``). The density is the same.
    """

    def log_prob(self, value: jax.Array) -> jax.Array:
        if self._validate_args:
            self._validate_sample(value)
        z = _forward_substitution(self.scale_tril, value - self.loc)
        half_log_det = jnp.sum(
            jnp.log(jnp.diagonal(self.scale_tril, axis1=-2, axis2=-1)), -1
        )
        d = self.event_shape[0]
        return -0.5 * jnp.sum(z**2, -1) - half_log_det - 0.5 * d * math.log(2 * math.pi)


class DenseGuide(AutoMultivariateNormal):
    """:class:`~numpyro.infer.autoguide.AutoMultivariateNormal` (the "dense"
    guide) with a LAPACK-free density (see :class:`_MultivariateNormalSubstitution`);
    same parameters, draws and density."""

    def _get_posterior(self) -> dist.Distribution:
        base = super()._get_posterior()
        return _MultivariateNormalSubstitution(base.loc, scale_tril=base.scale_tril)


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
    splits: Callable[[int], DataSplit]
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

        def split(seed: int) -> DataSplit:
            return _standardise(random_split(data, num_obs=len(y), seed=seed))

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

        def glmm_split(seed: int) -> DataSplit:
            split = random_split(
                {"idx": np.arange(n), "C": counts}, num_obs=n, seed=seed
            )
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


def main(argv: Sequence[str] | None = None) -> None:
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
    parser.add_argument("--json", default=None, help="write the raw results here")
    parser.add_argument(
        "--jax-cache",
        default=None,
        metavar="DIR",
        help="persistent JAX compilation cache (reused by later "
        "runs, whatever their --steps)",
    )
    args = parser.parse_args(argv)
    if args.jax_cache:
        jax.config.update("jax_compilation_cache_dir", args.jax_cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)

    data_dir = Path(args.data_dir)
    if not data_dir.is_dir():
        parser.error(f"data directory {data_dir} does not exist")
    available = paper_models(data_dir)
    wanted = [m for m in args.models.split(",") if m]
    unknown = set(wanted) - {"kidscore", "earnings", "nes", "glmm"}
    if unknown:
        parser.error(f"unknown models {sorted(unknown)}")
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
        print(
            f"{key}: {time.perf_counter() - t0:.0f}s wall, "
            f"{time.process_time() - c0:.0f}s CPU, load "
            f"{os.getloadavg()[0]:.2f}\n{table}\n",
            flush=True,
        )
        tables.append(table)
        raw[key] = [
            {
                "guide": r.guide,
                "objective": r.objective,
                "selected": r.selected,
                "test": {k: v.tolist() for k, v in r.test.items()},
                "validation": {k: v.tolist() for k, v in r.validation.items()},
                "final_loss": {k: v.tolist() for k, v in r.final_loss.items()},
                "seconds": r.seconds,
                "cpu_seconds": r.cpu_seconds,
            }
            for r in results
        ]
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
        Path(args.json).write_text(
            json.dumps(
                {
                    "args": vars(args),
                    "seconds": total,
                    "cpu_seconds": cpu,
                    "results": raw,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
