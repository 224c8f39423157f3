"""The guide side of stratification: :class:`StratifiedGuide`."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import jax

__all__ = ["StratifiedGuide"]


@runtime_checkable
class StratifiedGuide(Protocol):
    """A guide drawn from stratum by stratum (the guide side of stratification).

    The particle machinery draws ``M`` particles from each of the guide's
    ``num_strata`` strata when an objective asks for stratified draws, and
    weights them with :meth:`stratum_log_weights`.
    :class:`~numpyro_pvi.guides.AutoGaussianMixture` implements it.
    """

    @property
    def num_strata(self) -> int:
        """The number ``K`` of strata."""

    def draw_stratum(self, fn: object, component: jax.Array) -> object:
        """``fn`` (this guide, seeded and substituted) drawing its stratified
        site from stratum ``component`` only; that site's log density stays
        the whole guide's."""

    def stratum_log_weights(
        self, params: dict[str, jax.Array]
    ) -> tuple[jax.Array, jax.Array | None]:
        """``(K,)`` log weights of the strata in expectations over the guide,
        and ``(N, K)`` per-observation log weights ``log ω_k(x_i)`` over the
        data plate, or ``None`` when they do not depend on the observation."""

    def entropy_term(self, params: dict[str, jax.Array]) -> jax.Array | None:
        """The guide's entropy (or a bound) in closed form, used in place of
        the Monte Carlo mean of ``-log q``; ``None`` to use the mean."""
