"""The vectorised samplers of simulated observations, by the NumPyro
sampler they replace: Normal laws with their deviates drawn flat
(:mod:`~numpyro_pvi._core.normal_draws`), Student-t laws by Bailey's polar
method (:mod:`~numpyro_pvi._core.student_draws`) and the other Gamma-based
laws by Marsaglia and Tsang's method as array operations
(:mod:`~numpyro_pvi._core.gamma_draws`). Each draws the law of NumPyro's
own sampler; a subclass that replaces ``sample`` keeps its own."""

from __future__ import annotations

import jax
from numpyro.distributions import Distribution

from numpyro_pvi._core import gamma_draws, normal_draws, student_draws

__all__ = ["fast_draw", "has_fast_draw"]

#: Samplers by the ``sample`` method they replace: a subclass that keeps
#: NumPyro's sampler (``Chi2`` keeps ``Gamma``'s) is drawn the same way.
_SAMPLERS = {
    **normal_draws.SAMPLERS,
    **student_draws.SAMPLERS,
    **gamma_draws.SAMPLERS,
}


def has_fast_draw(base: Distribution) -> bool:
    """Whether :func:`fast_draw` draws ``base`` (a distribution under no
    wrapper) with a vectorised sampler."""
    return type(base).sample in _SAMPLERS


def fast_draw(base: Distribution, key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """A draw of ``shape`` (``base``'s batch shape broadcast to it, as its
    Expanded, Independent or Masked wrappers draw) from ``base``, a
    distribution for which :func:`has_fast_draw` holds."""
    return _SAMPLERS[type(base).sample](key, base, shape)
