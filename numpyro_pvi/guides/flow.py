r"""A NumPyro distribution pushed forward through a flowjax bijection.

:class:`FlowDistribution` is :math:`\theta = T(\varepsilon)`,
:math:`\varepsilon \sim \mathcal{N}(0, I_D)`, for any flowjax bijection
:math:`T` of shape ``(D,)`` whose both directions are explicit (coupling
flows, affine maps, their chains). A draw returns its log density as an
intermediate of the same forward pass, and the density at given points is
one inverse pass, so objectives that need :math:`\log q` at their own draws
(:class:`~numpyro.infer.Trace_ELBO`) or at fixed draws
(:class:`~numpyro_pvi.SoftCVIELBO`) never invert and differentiate twice.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import random
from numpyro.distributions import Distribution, constraints

__all__ = ["FlowDistribution"]

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def _standard_normal_log_prob(x: jax.Array) -> jax.Array:
    return -0.5 * jnp.sum(x**2, axis=-1) - x.shape[-1] * _HALF_LOG_2PI


class FlowDistribution(Distribution):
    r"""The push-forward :math:`T_\# \mathcal{N}(0, I_D)` of a flowjax
    bijection :math:`T`, with

    .. math::

        \log q(\theta) = \log \mathcal{N}(T^{-1}(\theta); 0, I_D)
        + \log\lvert\det J_{T^{-1}}(\theta)\rvert .

    :param bijection: a flowjax bijection of shape ``(D,)`` without a
        condition (its ``transform_and_log_det`` and
        ``inverse_and_log_det`` are called on single points and vectorised
        here).
    """

    arg_constraints: dict[str, Any] = {}
    support = constraints.real_vector
    pytree_data_fields = ("bijection",)

    def __init__(self, bijection: Any) -> None:
        if len(bijection.shape) != 1 or bijection.cond_shape is not None:
            raise ValueError(
                "FlowDistribution: the bijection must be unconditional with shape "
                f"(D,), got shape {bijection.shape} and condition shape "
                f"{bijection.cond_shape}."
            )
        self.bijection = bijection
        super().__init__(batch_shape=(), event_shape=tuple(bijection.shape))

    def sample_with_intermediates(
        self, key: jax.Array, sample_shape: tuple[int, ...] = ()
    ) -> tuple[jax.Array, list[jax.Array]]:
        """Draws with their log densities, from one forward pass."""
        shape = tuple(sample_shape) + self.batch_shape
        eps = random.normal(key, shape + self.event_shape)
        flat = eps.reshape((-1,) + self.event_shape)
        theta, log_det = jax.vmap(self.bijection.transform_and_log_det)(flat)
        log_q = _standard_normal_log_prob(flat) - log_det
        return theta.reshape(eps.shape), [log_q.reshape(shape)]

    def sample(self, key: jax.Array, sample_shape: tuple[int, ...] = ()) -> jax.Array:
        return self.sample_with_intermediates(key, sample_shape)[0]

    def log_prob(
        self, value: jax.Array, intermediates: list[jax.Array] | None = None
    ) -> jax.Array:
        """:math:`\\log q` at ``value`` (one inverse pass), or the log
        density recorded when ``value`` was drawn."""
        if intermediates:
            return intermediates[0]
        value = jnp.asarray(value)
        batch = value.shape[:-1]
        flat = value.reshape((-1,) + self.event_shape)
        eps, log_det = jax.vmap(self.bijection.inverse_and_log_det)(flat)
        return (_standard_normal_log_prob(eps) + log_det).reshape(batch)
