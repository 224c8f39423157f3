"""The replications of VSBC: one SVI fit per simulated data set, mapped
sequentially, vectorised or sharded over the local devices, in chunks."""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr
from jax import lax, random
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from numpyro.handlers import condition
from numpyro.infer import SVI, Predictive

from numpyro_pvi._core import Replications, check_real, svi_scan
from numpyro_pvi.diagnostics._idata import draws_dataset

#: Number of chunks the replications are split into when a progress bar is shown.
_PROGRESS_CHUNKS = 10
_AXIS = "replication"


def replication_fn(
    model: Callable,
    guide: Callable,
    optim: Any,
    loss: Any,
    inject: Callable,
    latent_names: Sequence[str],
    num_svi_steps: int,
    num_draws: int,
    quantities: Mapping[str, Callable] | None = None,
) -> Callable:
    """``(key, data, θ*) -> (#{draws < θ*}, final loss, mean of the last 10%
    losses, loss drift)``.

    The counts are integers: ``p = count / num_draws`` lies on an exact grid,
    which the symmetry test needs to recognise ties between ``p`` and ``1 - p``.
    Each test quantity ``f`` of ``quantities`` (a function of the latent
    values and the data set) is counted too: ``#{f(θ_l, y) < f(θ*, y)}``.
    The drift is ``loss_drift`` of the losses.
    """
    quantities = dict(quantities or {})

    def one(inputs: tuple) -> tuple:
        key, data, theta = inputs
        key_svi, key_draw = random.split(key)
        args, kwargs = inject(data)
        params, fit = fit_replication(
            key_svi,
            condition(model, data),
            guide,
            optim,
            loss,
            args,
            kwargs,
            num_svi_steps=num_svi_steps,
        )
        draws = Predictive(
            guide,
            params=params,
            num_samples=num_draws,
            return_sites=list(latent_names),
            parallel=True,
        )(key_draw, *args, **kwargs)
        below = {n: jnp.sum(draws[n] < theta[n], axis=0) for n in latent_names}
        for name, f in quantities.items():
            at_draws = jax.vmap(lambda th, f=f: f(th, data))(draws)
            below[name] = jnp.sum(at_draws < f(theta, data), axis=0)
        return (below, *fit)

    return one


def fit_replication(
    rng_key: jax.Array,
    model: Callable,
    guide: Callable,
    optim: Any,
    loss: Any,
    args: tuple,
    kwargs: dict,
    *,
    num_svi_steps: int,
) -> tuple[dict, tuple[jax.Array, jax.Array, jax.Array]]:
    """One replication's fit, from the guide's initial parameters:
    ``num_svi_steps`` SVI steps in one ``lax.scan``.

    :return: the fitted parameters and ``(final loss, mean of the last 10%
        losses, loss drift)``.
    """
    svi = SVI(model, guide, optim, loss)
    state = svi.init(rng_key, *args, **kwargs)
    state, losses = svi_scan(
        svi, state, num_steps=num_svi_steps, args=args, kwargs=kwargs
    )
    tail = max(1, num_svi_steps // 10)
    stats = (losses[-1], jnp.mean(losses[-tail:]), loss_drift(losses))
    return svi.get_params(state), stats


#: Replications whose loss drift exceeds this many standard errors have not
#: converged.
DRIFT_THRESHOLD = 3.0
#: Fraction of unconverged replications above which vsbc warns.
UNCONVERGED_WARNING = 0.1


def loss_drift(losses: jax.Array) -> jax.Array:
    r"""How far a fit still was from convergence at its end.

    With :math:`t = \max(2, \lfloor n/10 \rfloor)` and the means
    :math:`\bar L_{\rm prev}`, :math:`\bar L_{\rm last}` of the last two
    blocks of :math:`t` losses, the decrease of the mean loss over the last
    tenth of the steps in standard errors,

    .. math::

        d = \frac{\bar L_{\rm prev} - \bar L_{\rm last}}
        {\sqrt{(s^2_{\rm prev} + s^2_{\rm last}) / t}},

    is of order one for a fit that fluctuates around its optimum and large
    while the loss still falls (``nan`` with fewer than 4 steps). The
    denominator has a floor of :math:`10^{-5}(1 + |\bar L_{\rm last}|)`
    for losses without Monte Carlo noise.

    :param losses: ``(n,)`` the losses of the SVI steps.
    """
    n = losses.shape[0]
    if n < 4:
        return jnp.asarray(jnp.nan, losses.dtype)
    t = min(max(2, n // 10), n // 2)
    prev, last = losses[-2 * t : -t], losses[-t:]
    var = (jnp.var(prev, ddof=1) + jnp.var(last, ddof=1)) / t
    diff = jnp.mean(prev) - jnp.mean(last)
    # a relative floor: a deterministic loss (a point-mass guide) has no noise
    floor = 1e-5 * (1.0 + jnp.abs(jnp.mean(last)))
    return diff / (jnp.sqrt(var) + floor)


def dispatcher(one: Callable, chain_method: str | Callable) -> Callable:
    """Compile-once map of ``one`` over the leading axis of its input pytree.

    ``"sharded"`` places the batch over all local devices (a 1-axis mesh) and
    maps each device's replications with ``vmap``; the batch size must be a
    multiple of the device count.
    """
    if chain_method == "sequential":
        return jax.jit(lambda xs: lax.map(one, xs))
    if chain_method == "vectorized":
        return jax.jit(jax.vmap(one))
    if callable(chain_method):
        return jax.jit(chain_method(one))
    mesh = Mesh(np.asarray(jax.local_devices()), (_AXIS,))
    spec = PartitionSpec(_AXIS)
    sharding = NamedSharding(mesh, spec)
    # Each device maps its own replications; there are no collectives.
    # (The varying-axes check is off: with it on, JAX 0.10 gave results that
    # differed from ``vmap`` for SVI loops inside ``lax.scan``.)
    sharded = jax.jit(
        jax.shard_map(
            jax.vmap(one), mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False
        )
    )
    return lambda xs: sharded(jax.device_put(xs, sharding))


#: What JAX raises where Python or NumPy meets a traced value.
TRACER_ERRORS = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerArrayConversionError,
    jax.errors.TracerBoolConversionError,
    jax.errors.TracerIntegerConversionError,
)


def traced_argument_error(desc: str, err: Exception) -> ValueError:
    """What JAX's error of Python on a traced value (``err``, one of
    :data:`TRACER_ERRORS`) means while fitting simulated data sets, and the
    remedy."""
    return ValueError(
        f"{desc}: the model ran Python or NumPy on a traced value while "
        f"fitting a simulated data set ({type(err).__name__}). The "
        "simulated data sets reach the model through its arguments named "
        "after observed sites, as traced arrays, and a model that reads "
        "such an argument with NumPy (np.isnan, np.unique), len() or an if "
        "cannot take them. The observed sites are conditioned on the "
        "simulated data in any case: unless the guide reads the data, keep "
        "the model's own arguments with Replications("
        "simulated_data_to_args=lambda data, *args, **kwargs: "
        "(args, kwargs))."
    )


@contextlib.contextmanager
def _traced_arguments(desc: str) -> Iterator[None]:
    try:
        yield
    except TRACER_ERRORS as err:
        raise traced_argument_error(desc, err) from err


def run_replications(
    one: Callable,
    inputs: Any,
    replications: Replications,
    *,
    desc: str = "VSBC",
    function: str = "vsbc",
) -> Any:
    """Map ``one`` over the leading axis of ``inputs`` in equal, padded chunks,
    as ``replications`` says (``desc`` labels the progress bar, ``function``
    names the caller in errors).

    The replication count is padded (by repeating the last replication) to a
    whole number of chunks, each a multiple of the device count when sharded,
    so every chunk has one shape and compiles once; padded results are
    dropped. Every replication has its own key and data, so the result does
    not depend on the chunking.
    """
    from tqdm.auto import tqdm

    num, chain_method = replications.num_simulations, replications.chain_method
    chunk_size, progress_bar = replications.chunk_size, replications.progress_bar
    num_devices = jax.local_device_count() if chain_method == "sharded" else 1
    if chunk_size is None:
        chunk_size = math.ceil(num / _PROGRESS_CHUNKS) if progress_bar else num
    chunk_size = math.ceil(min(chunk_size, num) / num_devices) * num_devices
    num_chunks = math.ceil(num / chunk_size)
    pad = num_chunks * chunk_size - num
    if pad:
        inputs = jax.tree.map(
            lambda x: jnp.concatenate([x, jnp.repeat(x[-1:], pad, axis=0)]), inputs
        )
    run = dispatcher(one, chain_method)
    outputs = []
    with tqdm(
        total=num, disable=not progress_bar, desc=desc, unit="replication"
    ) as bar:
        for c in range(num_chunks):
            chunk = jax.tree.map(
                lambda x, c=c: x[c * chunk_size : (c + 1) * chunk_size], inputs
            )
            with _traced_arguments(function):
                outputs.append(jax.device_get(run(chunk)))
            bar.update(min(chunk_size, num - c * chunk_size))
    return jax.tree.map(lambda *xs: np.concatenate(xs)[:num], *outputs)


def fit_stats(
    final_loss: np.ndarray,
    tail_loss: np.ndarray,
    drift: np.ndarray,
    attrs: dict,
    *,
    function: str,
    group: str,
    stacklevel: int = 3,
) -> xr.Dataset:
    """The fit statistics of the replications (``loss``, ``loss_tail``,
    ``loss_drift``, ``converged``) for the result's ``group``; warns, naming
    ``function``, when too many
    had not converged (attribute ``num_unconverged``); ``stacklevel`` points
    the warning at the user's call."""
    num_simulations = drift.shape[0]
    converged = ~(drift > DRIFT_THRESHOLD)  # nan (too few steps) counts as converged
    num_unconverged = int(np.sum(~converged))
    if num_unconverged > UNCONVERGED_WARNING * num_simulations:
        warnings.warn(
            f"{function}: {num_unconverged} of {num_simulations} replications had not "
            f"converged after {attrs['num_svi_steps']} SVI steps (loss still "
            f"falling by more than {DRIFT_THRESHOLD:g} standard errors over the "
            f"last tenth of the steps, loss_drift of the {group} group): their "
            "ranks measure an unfinished fit, not the method. Increase "
            "Replications(num_svi_steps=...) or the step size.",
            UserWarning,
            stacklevel=stacklevel,
        )
    return draws_dataset(
        {
            "loss": final_loss,
            "loss_tail": tail_loss,
            "loss_drift": drift,
            "converged": converged,
        },
        attrs={
            **attrs,
            "drift_threshold": DRIFT_THRESHOLD,
            "num_unconverged": num_unconverged,
        },
    )


_CORRECTIONS = ("holm", "bh", None)


def check_verdict(function: str, correction: Any, alpha: Any) -> None:
    """Refuse a multiplicity correction or a level the tests do not know."""
    if correction not in _CORRECTIONS:
        raise ValueError(
            f"{function}: correction must be 'holm', 'bh' or None, got {correction!r}."
        )
    check_real(
        alpha, "alpha", function, low=0.0, high=1.0, low_open=True, high_open=True
    )
