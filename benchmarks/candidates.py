"""Candidate objectives of the held-out benchmark: fixed losses and grids of
PVI settings fitted in one compiled program each."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
from numpyro.infer.elbo import ELBO

from numpyro_pvi import PredictiveELBO

__all__ = [
    "PAPER_LAMS",
    "PAPER_REGULARIZERS",
    "Candidates",
    "Objective",
    "pvi_objective",
]

#: λ grid and regularizers of the paper's validation search.
PAPER_LAMS = (0.0, 0.01, 0.1, 1.0)
PAPER_REGULARIZERS = ("prior", "posterior")


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
            # a traced λ: the regularizer is computed for every grid value
            return PredictiveELBO(
                score, num_particles=num_particles, regularizer=reg, lam=lam, **kwargs
            )

        grids.append(Candidates(labels, tuple(values), make_loss))
    return Objective(grids, select_by=score)
