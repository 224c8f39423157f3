r"""Several independent arrays of uniform deviates from one pass of the
Threefry hash.

:func:`jax.random.uniform` hashes one Threefry-2x32 block (two 32-bit
words) for each single-precision value and keeps their exclusive or, so a
sampler that needs two uniforms per value (Bailey's polar Student-t, a
Marsaglia–Tsang Gamma candidate's normal and uniform) hashes two blocks per
value and splits its key once more. :func:`uniforms` hashes one block per
value and uses both of its words: one word per value in single
precision, two (a whole block) in double precision, whose 52-bit mantissa
needs them. The words are JAX's own Threefry hash (the primitive behind
:func:`jax.random.bits`) of counters ``0, 1, 2, ...`` under the key, each
counter hashed once, so the arrays are independent and uniform as JAX's
are; they are not JAX's values for the same key.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import random
from jax.extend.random import threefry2x32_p

__all__ = ["uniforms"]

#: ``(mantissa bits, one, unsigned type)`` per floating-point width.
_FORMATS = {
    32: (23, np.uint32(0x3F800000), jnp.uint32),
    64: (52, np.uint64(0x3FF0000000000000), jnp.uint64),
}


def uniforms(
    key: jax.Array, shape: tuple[int, ...], count: int, dtype: Any = float
) -> tuple[jax.Array, ...]:
    """``count`` independent arrays of ``shape`` of uniform deviates on
    ``[0, 1)`` in ``dtype``: a Threefry block per two single-precision
    values or per double-precision value, where ``count`` calls of
    :func:`jax.random.uniform` hash a block per value in either. Separate
    arrays, not one stacked: XLA fused a stacked array split again into
    more passes (a Student-t step a third slower). A key of another
    generator (``jax_default_prng_impl``), or another floating-point width,
    draws with :func:`jax.random.uniform`."""
    dtype = jnp.dtype(jax.dtypes.canonicalize_dtype(dtype))
    data = random.key_data(key)
    bits = 8 * dtype.itemsize
    if data.shape[-1:] != (2,) or bits not in _FORMATS:
        keys = random.split(key, count)
        return tuple(random.uniform(k, shape, dtype) for k in keys)
    size = math.prod(shape)
    mantissa, one, unsigned = _FORMATS[bits]
    counter = jax.lax.iota(jnp.uint32, size)
    arrays: list[jax.Array] = []
    for j in range(0, count, 2 if bits == 32 else 1):
        # one block per value, counters 2 j size + i and (2 j + 1) size + i:
        # every counter of the key hashed once
        start = np.uint32(2 * j * size)
        words = threefry2x32_p.bind(
            data[..., 0], data[..., 1], counter + start, counter + start + size
        )
        if bits == 64:
            hi, lo = (w.astype(jnp.uint64) for w in words)
            words = [(hi << np.uint64(32)) | lo]
        arrays += words
    return tuple(
        (_floats(w >> unsigned(bits - mantissa) | one, dtype) - 1.0).reshape(shape)
        for w in arrays[:count]
    )


def _floats(words: jax.Array, dtype: Any) -> jax.Array:
    return jax.lax.bitcast_convert_type(words, dtype)
