"""Candidate objectives of a cross-validation: the default grid, labels, and
grids of one objective over λ fitted by one compiled program."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
from numpyro.infer import (
    Trace_ELBO,
    TraceEnum_ELBO,
    TraceGraph_ELBO,
    TraceMeanField_ELBO,
)
from numpyro.infer.elbo import ELBO

from numpyro_pvi._trace.tracing import StratifiedGuide
from numpyro_pvi._trace.validation import check_real_or_array
from numpyro_pvi.objectives.predictive import PredictiveELBO
from numpyro_pvi.objectives.stratified import StratifiedELBO
from numpyro_pvi.scores import Score

#: λ of the default candidates per regularizer: pure prediction (λ = 0), the
#: prior regularizer up to λ = 1, the posterior one up to λ = 10 (near VI).
DEFAULT_LAMS = {"prior": (0.0, 0.01, 0.1, 1.0), "posterior": (0.1, 1.0, 10.0)}
#: The objectives of plain VI (the reference of the paired differences).
VI_OBJECTIVES = (
    Trace_ELBO,
    TraceMeanField_ELBO,
    TraceGraph_ELBO,
    TraceEnum_ELBO,
    StratifiedELBO,
)


def default_candidates(
    guide: Callable,
    score: str | Score = "log",
    *,
    num_particles: int = 32,
    data_plate: str | int | None = None,
    vi: type[ELBO] | None = None,
) -> dict[str, ELBO]:
    """The default candidates of :func:`~numpyro_pvi.selection.cross_validate`:
    :class:`~numpyro_pvi.PredictiveELBO` with ``score`` over λ = 0, the prior
    regularizer with λ ∈ {0.01, 0.1, 1} and the posterior regularizer with
    λ ∈ {0.1, 1, 10}, and VI: ``Trace_ELBO``, or
    :class:`~numpyro_pvi.StratifiedELBO` for a mixture guide (whose weights
    ``Trace_ELBO`` cannot learn), or ``TraceEnum_ELBO`` for a model with
    enumerated sites; each with ``num_particles`` particles.

    **Example**::

        >>> candidates = default_candidates(guide, "crps", num_particles=64)
        >>> cv = cross_validate(key, model, guide, optim, x, y,
        ...                     fit=FitRecipe(num_steps=2000),
        ...                     candidates=candidates, score="crps")

    :param guide: the guide the candidates will fit.
    :param score: the score of the PVI candidates.
    :param num_particles: particles of every candidate.
    :param data_plate: the plate (or negative batch dimension) that indexes
        observations in the PVI candidates, as for
        :class:`~numpyro_pvi.PredictiveELBO` (``cross_validate`` passes its
        own).
    :param vi: the objective of the VI candidate (``None``: ``Trace_ELBO``,
        or ``StratifiedELBO`` for a mixture guide; ``cross_validate`` passes
        ``TraceEnum_ELBO`` for a model with enumerated sites).
    :return: label → objective.
    """
    if vi is None:
        vi = StratifiedELBO if isinstance(guide, StratifiedGuide) else Trace_ELBO
    out: dict[str, ELBO] = {"VI": vi(num_particles=num_particles)}
    for reg, lams in DEFAULT_LAMS.items():
        for lam in lams:
            loss = PredictiveELBO(
                score,
                num_particles=num_particles,
                regularizer=reg,
                lam=lam,
                data_plate=data_plate,
            )
            out[_pvi_label(loss)] = loss
    return out


def _pvi_label(loss: PredictiveELBO) -> str:
    if loss.regularizer is None or loss.lam == 0:
        return "lam=0"
    return f"{loss.regularizer} lam={float(loss.lam):g}"


def _label(loss: ELBO, *, with_score: bool = False) -> str:
    if isinstance(loss, VI_OBJECTIVES):
        return "VI"
    if not isinstance(loss, PredictiveELBO):
        return type(loss).__name__
    label = _pvi_label(loss)
    if with_score:
        label = f"{loss.score.name} {label}"
    if type(loss) is not PredictiveELBO:
        label = f"{type(loss).__name__} {label}"
    return label


def labelled(candidates: Mapping[str, ELBO] | Sequence[ELBO]) -> dict[str, ELBO]:
    """The candidates as ``label -> loss``, each checked to be an ELBO.

    :param candidates: a mapping (labels kept) or a sequence (labelled by
        objective and λ, and by score where PVI candidates differ in it;
        repeated labels numbered).
    """
    items: list[tuple[str, Any]]
    if isinstance(candidates, Mapping):
        items = [(str(k), v) for k, v in candidates.items()]
    else:
        items, candidates = [], list(candidates)
        seen: dict[str, int] = {}
        scores = {c.score.name for c in candidates if isinstance(c, PredictiveELBO)}
        for loss in candidates:
            label = (
                _label(loss, with_score=len(scores) > 1)
                if isinstance(loss, ELBO)
                else repr(loss)
            )
            seen[label] = seen.get(label, 0) + 1
            items.append(
                (label if seen[label] == 1 else f"{label} #{seen[label]}", loss)
            )
    if not items:
        raise ValueError(
            "cross_validate: candidates is empty; pass objectives to compare, "
            "or candidates=None for the default PVI grid and Trace_ELBO."
        )
    for label, loss in items:
        if not isinstance(loss, ELBO):
            raise TypeError(
                f"cross_validate: candidate {label!r} is {loss!r}, not a NumPyro "
                "objective (numpyro.infer.elbo.ELBO)."
            )
    return dict(items)


class Grid(NamedTuple):
    """Candidates that differ only in λ, fitted by one compiled program:
    ``make_loss(lam)`` builds the loss for a (traced) scalar λ."""

    labels: tuple[str, ...]
    values: np.ndarray
    make_loss: Callable[[jax.Array], ELBO]


def _constant(loss: Any, _: Any) -> Any:
    """The grid of a candidate without λ: ``loss`` whatever the value."""
    return loss


def grids(candidates: Mapping[str, ELBO]) -> list[Grid]:
    """Group the candidates into :class:`Grid` s: PVI objectives equal but for
    λ and the choice of the prior or posterior regularizer share one (both
    traced); every other candidate is a grid of one."""
    groups: list[list[tuple[str, ELBO]]] = []
    for label, loss in candidates.items():
        home = next((g for g in groups if _same_grid(loss, g[0][1])), None)
        if home is None:
            groups.append([(label, loss)])
        else:
            home.append((label, loss))
    out = []
    for group in groups:
        labels = tuple(label for label, _ in group)
        first = group[0][1]
        if not isinstance(first, PredictiveELBO):
            out.append(Grid(labels, np.zeros(1), functools.partial(_constant, first)))
            continue
        lams = np.asarray([float(loss.lam) for _, loss in group])
        posterior = [loss.regularizer == "posterior" for _, loss in group]
        if len(set(posterior)) == 1:  # one regularizer: λ alone is traced
            out.append(Grid(labels, lams, functools.partial(with_lam, first)))
        else:
            values = np.stack([lams, np.asarray(posterior, float)], axis=1)
            out.append(Grid(labels, values, functools.partial(_both, first)))
    return out


def with_lam(
    loss: PredictiveELBO, lam: float | jax.Array, *, posterior: jax.Array | None = None
) -> PredictiveELBO:
    """``loss`` with the regularizer's weight :math:`\\lambda` set to ``lam``,
    every other option kept. ``lam`` may be traced (inside ``jit`` or
    ``vmap``): one compiled program then fits a whole grid of
    :math:`\\lambda`. With ``posterior`` (a traced 0/1 scalar) the
    regularizer is the posterior one where it is 1 and the prior one where
    it is 0: one program fits the grids of both regularizers."""
    name = f"{type(loss).__name__}.with_lam"
    if not isinstance(lam, jax.Array):
        lam = check_real_or_array(lam, "lam", name, low=0.0)
    new = copy.copy(loss)
    new.lam = lam
    if posterior is not None:
        if loss.regularizer is None:
            raise ValueError(
                f"{name}: posterior= chooses between the prior and the "
                "posterior regularizer; this objective has none (regularizer=None)."
            )
        new.regularizer = "posterior"
        new._posterior = posterior
    return new


def differs_only_in_lam(loss: object, other: object) -> bool:
    """Whether ``other`` is ``loss`` but for :math:`\\lambda` (the same class,
    every other option equal): then ``with_lam(loss, other.lam)`` is
    ``other``."""
    return _same_but(loss, other, ("lam",))


def differs_only_in_regularization(loss: object, other: object) -> bool:
    """Whether ``other`` is ``loss`` but for :math:`\\lambda` and the choice
    between the prior and the posterior regularizer."""
    if None in (
        getattr(loss, "regularizer", None),
        getattr(other, "regularizer", None),
    ):
        return False
    return _same_but(loss, other, ("lam", "regularizer"))


def _same_but(loss: object, other: object, skip: tuple[str, ...]) -> bool:
    if not isinstance(loss, PredictiveELBO) or type(other) is not type(loss):
        return False
    mine = {k: v for k, v in vars(loss).items() if k not in skip}
    theirs = {k: v for k, v in vars(other).items() if k not in skip}
    try:
        return bool(mine == theirs)
    except (TypeError, ValueError):  # array-valued options: not comparable
        return False


def _same_grid(loss: ELBO, first: ELBO) -> bool:
    return differs_only_in_lam(loss, first) or differs_only_in_regularization(
        loss, first
    )


def _both(first: PredictiveELBO, value: jax.Array) -> ELBO:
    """The grid of both regularizers: ``value`` is ``(λ, posterior)``."""
    return with_lam(first, value[0], posterior=value[1])


def reference_label(candidates: Mapping[str, ELBO]) -> str | None:
    """The label of the first plain-VI candidate, if any."""
    return next(
        (k for k, v in candidates.items() if isinstance(v, VI_OBJECTIVES)), None
    )


def lam_coordinates(candidates: Mapping[str, ELBO]) -> tuple[list[str], list[float]]:
    """Per candidate its regularizer (``""`` for none) and λ (NaN for none)."""
    regs, lams = [], []
    for loss in candidates.values():
        if isinstance(loss, PredictiveELBO):
            lam = float(loss.lam)
            regs.append(
                "" if loss.regularizer is None or lam == 0 else loss.regularizer
            )
            lams.append(lam if loss.regularizer is not None else 0.0)
        else:
            regs.append("")
            lams.append(float("nan"))
    return regs, lams
