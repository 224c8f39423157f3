"""A dense Gaussian guide whose density avoids jaxlib's batched LAPACK
triangular solve, which deadlocked XLA's CPU thread pool when the 45-d glmm
guide was vectorised over grid values, seeds and particles."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpyro.distributions as dist
from numpyro.infer.autoguide import AutoMultivariateNormal

__all__ = ["DenseGuide"]


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
