"""PAC^m-Bayes: the per-observation multi-sample bound of Morningstar et al."""

from __future__ import annotations

from collections.abc import Callable

from numpyro_pvi._trace.validation import check_real
from numpyro_pvi.objectives.predictive import PredictiveELBO

__all__ = ["PACmELBO"]


class PACmELBO(PredictiveELBO):
    r"""The PAC\ :sup:`m`-Bayes objective (Morningstar, Alemi & Dillon 2022).

    .. math::

        \mathcal{L}_m(\phi) = -\sum_{i=1}^n \log \frac{1}{m} \sum_{j=1}^m
        p(y_i \mid \theta_j) + \frac{1}{\beta}\, \frac{1}{m} \sum_{j=1}^m
        \big[\log q_\phi(\theta_j) - \log p(\theta_j)\big],
        \qquad \theta_j \sim q_\phi,

    eq. 13 of [1] times :math:`n`, the log-mean-exp per observation. It is
    :class:`~numpyro_pvi.PredictiveELBO` with the log score, the prior
    regularizer and :math:`\lambda = 1/\beta` (with :math:`m = \beta = 1`, the
    negative ELBO).

    :param int num_particles: the number :math:`m` of draws per observation.
    :param float beta: inverse weight :math:`\beta > 0` of the KL term.
    :param data_plate: the plate (or negative batch dimension) that indexes
        observations, as for :class:`~numpyro_pvi.PredictiveELBO`.
    :param vectorize_particles: ``True`` (``vmap``), ``False`` (``lax.map``)
        or a callable, as for :class:`~numpyro.infer.elbo.ELBO`.

    **References**

    1. Morningstar, W. R., Alemi, A. A. & Dillon, J. V. (2022). *PAC^m-Bayes:
       Narrowing the empirical risk gap in the misspecified Bayesian regime*.
       AISTATS 2022.
    """

    def __init__(
        self,
        num_particles: int = 8,
        beta: float = 1.0,
        *,
        data_plate: str | int | None = None,
        vectorize_particles: bool | Callable = True,
    ) -> None:
        self.beta = check_real(beta, "beta", "PACmELBO", low=0.0, low_open=True)
        super().__init__(
            "log",
            num_particles=num_particles,
            regularizer="prior",
            lam=1.0 / beta,
            data_plate=data_plate,
            vectorize_particles=vectorize_particles,
        )

    def __repr__(self) -> str:
        plate = "" if self.data_plate is None else f", data_plate={self.data_plate!r}"
        return (
            f"PACmELBO(num_particles={self.num_particles}, beta={self.beta:g}{plate})"
        )
