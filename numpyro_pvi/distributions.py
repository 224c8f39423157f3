"""Distributions for likelihood-free (simulation-based) observed sites."""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import random
from numpyro.distributions import constraints
from numpyro.distributions.distribution import Distribution, ExpandedDistribution
from numpyro.handlers import block, seed

__all__ = ["Simulator", "setup_guide", "simulators_without_density"]

_LIKELIHOOD_FREE = (
    "this site is likelihood-free: use score='crps' or 'energy' "
    "(PredictiveELBO(score='crps') for scalar observations, "
    "PredictiveELBO(score='energy') for vector ones, with regularizer='prior' or "
    "None), which need only simulations from the model. If this arose while "
    "an autoguide set itself up (SVI.init, svi.run), set it up first with "
    "numpyro_pvi.distributions.setup_guide(guide, rng_key, *args)."
)


class Simulator(Distribution):
    r"""A differentiable simulator used as a distribution.

    Wraps ``fn(key, *params) -> y``, a reparameterised sampler of
    :math:`y \sim p(y \mid \text{params})` (all randomness from ``key``). The
    likelihood is never evaluated (:meth:`log_prob` raises), so such a site is
    fitted with the scores that need only simulations, the CRPS and the energy
    score (Lai & Yao 2024, §5). ``fn`` must be traceable by JAX; its output has
    shape ``fn_batch_shape + event_shape``, and a wider ``batch_shape`` gets
    independent simulations (as :meth:`~numpyro.distributions.Distribution.expand`
    does), so the site works inside plates, subsampled ones included.

    **Example**

    .. code-block:: python

        def simulate(key, loc, log_scale):
            return loc + jnp.exp(log_scale) * jax.random.gumbel(key, jnp.shape(loc))

        def model(y=None):
            loc = numpyro.sample("loc", dist.Normal(0.0, 5.0))
            log_scale = numpyro.sample("log_scale", dist.Normal(0.0, 1.0))
            with numpyro.plate("data", 100):
                numpyro.sample("y", Simulator(simulate, loc, log_scale), obs=y)

        svi = SVI(model, AutoNormal(model), optax.adam(1e-2),
                  loss=PredictiveELBO("crps", regularizer=None))

    :param fn: the simulator ``fn(key, *params) -> y``.
    :param params: its parameters (arrays, differentiable).
    :param event_shape: the shape of one draw's event (e.g. ``(d,)`` for a
        vector observation scored with the energy score).
    :param batch_shape: the batch shape; by default the shape of ``fn``'s
        output without ``event_shape``.
    :param support: the support constraint of the draws (default real).
    :param validate_args: as for any NumPyro distribution.

    **References**

    1. Lai, J. & Yao, Y. (2024). *Predictive variational inference: Learn the
       predictively optimal posterior distribution*. arXiv:2410.14843, §5.
    """

    #: No density: only the scores from simulations apply (CRPS, energy).
    likelihood_free = True

    arg_constraints: dict[str, Any] = {}
    reparametrized_params: list[str] = []
    pytree_data_fields = ("params",)
    pytree_aux_fields = ("fn", "_fn_batch_shape", "_support")

    def __init__(
        self,
        fn: Callable[..., jax.Array],
        *params: Any,
        event_shape: Sequence[int] = (),
        batch_shape: Sequence[int] | None = None,
        support: constraints.Constraint = constraints.real,
        validate_args: bool | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(
                f"Simulator: fn must be a function fn(key, *params) -> y, got {fn!r}."
            )
        try:
            event_shape = tuple(int(s) for s in event_shape)
        except TypeError:
            raise TypeError(
                f"Simulator: event_shape must be a tuple of ints, got {event_shape!r}."
            ) from None
        self.fn = fn
        self.params = tuple(params)
        self._support = support
        out = jax.eval_shape(fn, random.PRNGKey(0), *self.params)
        out_shape = tuple(getattr(out, "shape", ()))
        n_event = len(event_shape)
        if out_shape[len(out_shape) - n_event :] != event_shape or (
            len(out_shape) < n_event
        ):
            raise ValueError(
                f"Simulator: fn returns draws of shape {out_shape}, which does not "
                f"end with event_shape={event_shape}. Return arrays of shape "
                "batch_shape + event_shape, or pass the matching event_shape."
            )
        fn_batch_shape = out_shape[: len(out_shape) - n_event]
        if batch_shape is None:
            batch_shape = fn_batch_shape
        else:
            batch_shape = tuple(int(s) for s in batch_shape)
            try:
                ok = jnp.broadcast_shapes(fn_batch_shape, batch_shape) == batch_shape
            except ValueError:
                ok = False
            if not ok:
                raise ValueError(
                    f"Simulator: fn returns draws with batch shape {fn_batch_shape}, "
                    f"which does not broadcast to batch_shape={batch_shape}."
                )
        self._fn_batch_shape = fn_batch_shape
        super().__init__(
            batch_shape=batch_shape,
            event_shape=event_shape,
            validate_args=validate_args,
        )

    def _simulate(self, key: jax.Array, sample_shape: tuple[int, ...]) -> jax.Array:
        """Independent draws of shape ``sample_shape + fn_batch_shape + event``."""
        if not sample_shape:
            return self.fn(key, *self.params)
        keys = random.split(key, math.prod(sample_shape))
        draws = jax.vmap(lambda k: self.fn(k, *self.params))(keys)
        return jnp.reshape(draws, sample_shape + draws.shape[1:])

    def sample(self, key: jax.Array, sample_shape: tuple[int, ...] = ()) -> jax.Array:
        sample_shape = tuple(sample_shape)
        if self._fn_batch_shape != self.batch_shape:
            base = Simulator(
                self.fn,
                *self.params,
                event_shape=self.event_shape,
                support=self._support,
            )
            return ExpandedDistribution(base, self.batch_shape).sample(
                key, sample_shape
            )
        return self._simulate(key, sample_shape)

    def log_prob(self, value: Any, intermediates: Any = None) -> jax.Array:
        """Not available: raises :class:`NotImplementedError`.

        The one exception is inside :func:`simulators_without_density`, the
        scope in which an autoguide sets itself up (:func:`setup_guide`):
        NumPyro evaluates the model's joint density there only to find valid
        initial values of the latent sites, and the site contributes ``0``.
        """
        if _WITHOUT_DENSITY.get():
            shape = jax.lax.broadcast_shapes(
                self.batch_shape,
                jnp.shape(value)[: max(jnp.ndim(value) - self.event_dim, 0)],
            )
            return jnp.zeros(shape)
        raise NotImplementedError(f"Simulator.log_prob: {_LIKELIHOOD_FREE}")


#: Whether Simulator sites contribute 0 to a density (autoguide setup only).
_WITHOUT_DENSITY = contextvars.ContextVar("simulators_without_density", default=False)


@contextlib.contextmanager
def simulators_without_density() -> Iterator[None]:
    """A scope in which :class:`Simulator` sites contribute ``0`` to the log
    density instead of raising: for setting up an autoguide of a
    likelihood-free model, whose initialisation evaluates the model's
    density only to find valid initial latent values. Never fit inside it:
    every objective would silently ignore the simulated sites."""
    token = _WITHOUT_DENSITY.set(True)
    try:
        yield
    finally:
        _WITHOUT_DENSITY.reset(token)


def setup_guide(guide: Callable, rng_key: jax.Array, *args: Any, **kwargs: Any):
    """Set up an autoguide of a model with :class:`Simulator` sites.

    An autoguide builds its prototype on its first call, evaluating the
    model's density to initialise the latents, which a simulator cannot
    give. Call this once before ``SVI``: it makes that first call with the
    simulated sites contributing ``0`` (:func:`simulators_without_density`),
    and returns the guide, ready for ``SVI(model, guide, ...)``.
    The package's own guides and diagnostics do this themselves.

    .. code-block:: python

        guide = setup_guide(AutoNormal(model), random.PRNGKey(0), y)
        svi = SVI(model, guide, optax.adam(1e-2), PredictiveELBO("crps"))

    :param guide: the autoguide (not yet run).
    :param rng_key: random key of its initialisation.
    :param args: the model's arguments.
    :param kwargs: the model's keyword arguments.
    :return: ``guide``.
    """
    with simulators_without_density(), block():
        seed(guide, rng_key)(*args, **kwargs)
    return guide
