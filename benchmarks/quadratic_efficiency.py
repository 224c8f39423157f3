"""Efficiency of the quadratic score's estimators: gradient variance times
step time (as :mod:`benchmarks.crps_efficiency` for the CRPS).

For each model and number of particles ``M`` the guide is first fitted with
the all-pairs estimator; there the total variance of the loss gradient is
estimated from ``--keys`` gradients per estimator, and the step times are
measured interleaved with ``Trace_ELBO``'s in one process. Estimators:

- ``all-pairs``: ``QuadraticScore(estimator="all-pairs")``, every pair of
  the ``M`` draws (for a Binomial likelihood the pmf's particle sums from
  the logits);
- ``derangement``: ``QuadraticScore(estimator="derangement")``, each draw
  paired with the next (for a Binomial likelihood the overlaps in closed
  form; what the default ``"auto"`` takes for a Binomial of at most 16
  support values).

Usage::

    python -m benchmarks.quadratic_efficiency --models binomial,binomial_counts
"""

from __future__ import annotations

from collections.abc import Sequence

from benchmarks.crps_efficiency import efficiency_main
from numpyro_pvi import PredictiveELBO
from numpyro_pvi.scores import QuadraticScore

__all__ = ["ESTIMATORS", "main"]

#: ``name -> (num_particles -> loss)``, the estimators compared.
ESTIMATORS = {
    name: lambda m, name=name: PredictiveELBO(
        QuadraticScore(estimator=name), num_particles=m
    )
    for name in ("all-pairs", "derangement")
}


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry point; prints a Markdown table."""
    efficiency_main(
        ESTIMATORS, __doc__.split("\n\n")[0], "binomial,binomial_counts", argv
    )


if __name__ == "__main__":
    main()
