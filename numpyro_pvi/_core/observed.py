"""The observed sites of a trace, and the law each one's simulated values
follow.

A site observes values of its own shape, which its distribution need not
have: NumPyro broadcasts the log density to the values (a likelihood
written ``Normal(mu, sigma)`` with scalar parameters observes a vector in
no plate), and ``scan`` stacks a body site's distributions without
promoting the ones inside them. Every score, simulation and posterior
predictive here draws from the law below, whose shape is the values'.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from numpyro.distributions import Distribution
from numpyro.distributions.batch_util import promote_batch_shape


def observed_sites(tr: dict[str, Any]) -> list[dict[str, Any]]:
    """The observed sample sites of a trace, in order, each with the law its
    simulated values follow (:func:`simulation_law`)."""
    return [
        {**s, "fn": simulation_law(s)}
        for s in tr.values()
        if s["type"] == "sample" and s["is_observed"]
    ]


#: the key NumPyro's ``scan`` puts in the ``infer`` of every site of its body
SCAN_INDEX = "_scan_current_index"


def scan_promoted(fn: Distribution) -> Distribution:
    """``fn`` with the batch shapes of the distributions inside it (a
    Student-t's chi-square, a LogNormal's Normal, a wrapper's base) read
    from their parameters. NumPyro's ``scan`` stacks a body site's
    distributions along a leading axis and promotes the outer one's batch
    shape only; the inner ones keep one step's, and their sampler then draws
    one noise shared by every step (a LogNormal, a HalfNormal) or fails on
    the shapes (a Student-t)."""
    fn = promote_batch_shape(fn)
    for name, value in vars(fn).items():
        if isinstance(value, Distribution):
            setattr(fn, name, scan_promoted(value))
    return fn


def simulation_law(msg: dict[str, Any]) -> Distribution:
    """The law an observed site's simulated values follow: its distribution
    broadcast to the batch shape of the values it observes (a likelihood
    written ``Normal(mu, sigma)`` with scalar parameters, observing a vector
    in no plate, draws one value where it observes many), and promoted
    where the site is in the body of a ``scan`` (:func:`scan_promoted`)."""
    fn, value = msg["fn"], msg["value"]
    if not isinstance(fn, Distribution):  # the static structure's stand-in
        return fn
    if SCAN_INDEX in msg.get("infer", {}):
        fn = scan_promoted(fn)
    if value is None:
        return fn
    batch = jnp.shape(value)[: max(jnp.ndim(value) - fn.event_dim, 0)]
    shape = jnp.broadcast_shapes(fn.batch_shape, batch)
    return fn if shape == fn.batch_shape else fn.expand(shape)
