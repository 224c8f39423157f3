r"""Simulated observations of Student-t likelihoods by Bailey's polar
method: two uniform deviates a value, no rejection, and a derivative in the
degrees of freedom by the chain rule.

NumPyro's ``StudentT.sample`` draws :math:`Z \sqrt{\nu / V}` with
:math:`V \sim \chi^2_\nu` from :func:`jax.random.gamma` (a rejection loop
per value); a Gamma sampler as array operations still needs three deviates
a value and, where :math:`\nu` is a latent variable, the implicit gradient
of the Gamma draw (:func:`jax.lax.random_gamma_grad`, hundreds of
nanoseconds a value on a CPU). Bailey's polar method is the Box–Muller
transform with the radius of a Student-t: for a point uniform on the unit
disc, at angle :math:`2\pi U_1` and squared radius :math:`W = U_2`
(uniform on :math:`(0, 1)`),

.. math::

    T = \cos(2\pi U_1) \sqrt{\nu\,\bigl(W^{-2/\nu} - 1\bigr)}

is exactly :math:`t_\nu`-distributed, and :math:`\nu \to \infty` gives
Box–Muller's normal deviate. The deviates' law does not depend on
:math:`\nu`, so :math:`T` is a reparameterisation whose derivative in
:math:`\nu` is that of the formula: the pathwise gradient, unbiased, with
no special function. The law of NumPyro's sampler, not its random stream.

The radius is evaluated in log space, :math:`\log(W^{-2/\nu} - 1) = a +
\log(-\mathrm{expm1}(-a))` with :math:`a = -2 \log W / \nu`, so that it
neither cancels for large :math:`\nu` nor overflows for small :math:`\nu`
before the value itself does.

**References**

1. Bailey, R. W. (1994). *Polar generation of random variates with the
   t-distribution*. Mathematics of Computation 62(206), 779–781.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from numpyro.distributions import StudentT

from numpyro_pvi._core.uniforms import uniforms

__all__ = ["SAMPLERS", "standard_t"]


def standard_t(key: jax.Array, df: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    r"""Exact draws of the standard Student-t with ``df`` :math:`\nu > 0`
    degrees of freedom (broadcast to ``shape``), by Bailey's polar method,
    differentiable in ``df``. A ``df`` that is not positive gives NaN."""
    df = jnp.asarray(df, dtype=jnp.result_type(df, float))
    angle, w = uniforms(key, shape, 2, df.dtype)
    w = jnp.maximum(w, jnp.finfo(df.dtype).tiny)  # no log(0)
    a = -2.0 * jnp.log(w) / df
    log_radius = 0.5 * (jnp.log(df) + a + jnp.log(-jnp.expm1(-a)))
    return jnp.cos(2.0 * math.pi * angle) * jnp.exp(log_radius)


def _student_t(key: jax.Array, fn: StudentT, shape: tuple[int, ...]) -> jax.Array:
    return fn.loc + fn.scale * standard_t(key, fn.df, shape)


#: Samplers by the ``sample`` method they replace
#: (:mod:`~numpyro_pvi._core.fast_draws`).
SAMPLERS: dict[Callable[..., Any], Callable[..., jax.Array]] = {
    StudentT.sample: _student_t,
}
