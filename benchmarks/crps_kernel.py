"""The Normal closed-form CRPS step with its terms in one compiled C++ pass,
against the same step as XLA compiles it and against ``Trace_ELBO``.

An experiment, not part of the package: it measures what a kernel that XLA's
CPU backend does not generate from JAX code would give. ``crps_kernel.cc``
computes the estimate per observation and its partial derivatives in the
locations, scales and observations in one pass over the ``(M, N)`` locations
(the estimate of ``PredictiveELBO("crps")`` for Normal likelihoods, one
stratum, scales of shape ``(M, 1)``), registered with :mod:`jax.ffi` and
wrapped in a ``custom_vjp``. The script compiles it with the system's C++
compiler (AVX2 and FMA), checks value and gradient against the package's
closed form, then times, interleaved in one process, one jitted SVI update
of ``Trace_ELBO``, of ``PredictiveELBO("crps")`` as landed, and of the same
objective with the kernel in place of the closed form (AutoNormal on
``step_models``' linear regression). Pin it to one core (``taskset -c 1``):
the kernel runs on one thread, where XLA may split a large fusion over two.

Usage::

    taskset -c 1 python -m benchmarks.crps_kernel --n 8000 --d 12 --particles 8,64
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import random
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal
from numpyro_pvi._trace.normal import normal_abs_mean

import numpyro_pvi.scores.crps as crps_module
from benchmarks.crps_floor import arguments, interleaved_medians
from benchmarks.step_models import make_glm
from numpyro_pvi import PredictiveELBO

__all__ = ["kernel_crps", "main"]

_TARGET = "numpyro_pvi_bench_normal_next_pair_crps"


def _build() -> None:
    """Compile ``crps_kernel.cc`` and register its handler with XLA (CPU)."""
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        raise SystemExit("crps_kernel: no C++ compiler on PATH (c++ or g++)")
    source = Path(__file__).with_name("crps_kernel.cc")
    library = Path(tempfile.mkdtemp()) / "libcrps_kernel.so"
    flags = ["-O3", "-march=x86-64-v3", "-fno-math-errno", "-fno-trapping-math"]
    subprocess.run(
        [compiler, *flags, "-std=c++20", "-shared", "-fPIC", "-w"]
        + [f"-I{jax.ffi.include_dir()}", str(source), "-o", str(library)],
        check=True,
    )
    handler = ctypes.cdll.LoadLibrary(str(library)).NormalNextPairCrps
    jax.ffi.register_ffi_target(_TARGET, jax.ffi.pycapsule(handler), platform="cpu")


def _call(loc: jax.Array, scale: jax.Array, y: jax.Array) -> tuple[jax.Array, ...]:
    m, n = loc.shape
    shapes = [(n,), (m, n), (m, n), (n,)]  # value and the partials
    types = [jax.ShapeDtypeStruct(shape, jnp.float32) for shape in shapes]
    return jax.ffi.ffi_call(_TARGET, types, vmap_method="sequential")(loc, scale, y)


@jax.custom_vjp
def kernel_crps(loc: jax.Array, scale: jax.Array, y: jax.Array) -> jax.Array:
    """``(N,)`` the negated CRPS estimate: ``loc`` ``(M, N)``, ``scale``
    ``(M, 1)``, ``y`` ``(N,)``, float32."""
    return _call(loc, scale, y)[0]


def _fwd(loc: jax.Array, scale: jax.Array, y: jax.Array) -> tuple:
    value, d_loc, d_scale, d_y = _call(loc, scale, y)
    return value, (d_loc, d_scale, d_y)


def _bwd(partials: tuple, cotangent: jax.Array) -> tuple:
    d_loc, d_scale, d_y = partials
    return (
        cotangent * d_loc,
        jnp.sum(cotangent * d_scale, axis=1, keepdims=True),
        cotangent * d_y,
    )


kernel_crps.defvjp(_fwd, _bwd)

_landed = crps_module.closed_form


def _closed_form_by_kernel(terms):  # noqa: ANN001, ANN202
    """The package's closed form, with the kernel where it applies."""
    if terms.y_loc is None or terms.num_strata > 1 or terms.y_scale is None:
        return _landed(terms)
    loc, scale = terms.y_loc[..., 0], terms.y_scale[..., 0]
    if scale.shape[1] != 1 or loc.shape[1] == 1 or loc.dtype != jnp.float32:
        return _landed(terms)
    return kernel_crps(loc, scale, terms.y_obs[:, 0])


def _check(m: int, n: int) -> None:
    """Value and gradient equal to the package's closed form (weighted
    observations, so that the cotangent is not constant)."""
    k1, k2, k3, k4 = random.split(random.PRNGKey(0), 4)
    loc = random.normal(k1, (m, n))
    scale = jnp.exp(0.3 * random.normal(k2, (m, 1)))
    y = 2.0 * random.normal(k3, (n,))
    w = random.uniform(k4, (n,))

    def landed(loc: jax.Array, scale: jax.Array, y: jax.Array) -> jax.Array:
        obs = normal_abs_mean(y - loc, scale).mean(0)
        pair_scale = jnp.sqrt(jnp.square(scale) + jnp.square(jnp.roll(scale, 1, 0)))
        pair = normal_abs_mean(loc - jnp.roll(loc, 1, 0), pair_scale).mean(0)
        return jnp.sum(w * (-obs + 0.5 * pair))

    def kernel(loc: jax.Array, scale: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.sum(w * kernel_crps(loc, scale, y))

    grads = [
        jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))(loc, scale, y)
        for f in (landed, kernel)
    ]
    (v0, g0), (v1, g1) = grads
    np.testing.assert_allclose(v1, v0, rtol=1e-5)
    for a, b in zip(g0, g1, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5 * float(jnp.abs(a).max()))


def _step(loss, model: Callable, args: tuple, *, kernel: bool) -> Callable:  # noqa: ANN001
    """One compiled SVI update as a thunk (the kernel in place of the closed
    form while it is traced)."""
    svi = SVI(model, AutoNormal(model), optax.adam(1e-3), loss=loss)
    box = [svi.init(random.PRNGKey(1), *args)]
    crps_module.closed_form = _closed_form_by_kernel if kernel else _landed
    try:
        update = jax.jit(svi.update).lower(box[0], *args).compile()
    finally:
        crps_module.closed_form = _landed

    def run() -> object:
        box[0], value = update(box[0], *args)
        return value

    return run


def main(argv: Sequence[str] | None = None) -> None:
    args = arguments(__doc__.split("\n")[0], n=8000, d=12).parse_args(argv)
    _build()
    model, data = make_glm(random.PRNGKey(0), n=args.n, d=args.d)
    print(
        f"linear regression N = {args.n}, D = {args.d}, jax {jax.__version__}, "
        f"load {os.getloadavg()[0]:.2f}"
    )
    print("| M | Trace_ELBO ms | crps as landed | crps, one-pass kernel |")
    print("|---:|---:|---:|---:|")
    for m in (int(v) for v in args.particles.split(",")):
        _check(m, args.n)
        thunks = {
            "base": _step(Trace_ELBO(num_particles=m), model, data, kernel=False),
            "landed": _step(
                PredictiveELBO("crps", num_particles=m), model, data, kernel=False
            ),
            "kernel": _step(
                PredictiveELBO("crps", num_particles=m), model, data, kernel=True
            ),
        }
        first = {k: float(t()) for k, t in list(thunks.items())[1:]}
        np.testing.assert_allclose(first["kernel"], first["landed"], rtol=1e-5)
        med = interleaved_medians(thunks, args.reps, args.block_seconds)
        base = med["base"]
        print(
            f"| {m} | {base:.3f} | {med['landed'] / base:.2f} | "
            f"{med['kernel'] / base:.2f} |"
        )


if __name__ == "__main__":
    main()
