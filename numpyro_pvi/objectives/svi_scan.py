r"""Running SVI steps inside compiled loops, and when to stop them.

The stopping rule is a sequential test on the loss trace, read in blocks of
:math:`t` steps: with the means :math:`\bar L` and variances :math:`s^2` of
the losses of the last two blocks, the drift

.. math::

    d = \frac{\bar L_{\rm prev} - \bar L_{\rm last}}
    {\sqrt{(s^2_{\rm prev} + s^2_{\rm last}) / t}}

is the fall of the mean loss from one block to the next in standard errors
(large while the loss still falls, of order one once it fluctuates around
its optimum). A fit stops once :math:`d \le` :data:`FLAT_DRIFT` at
:data:`PATIENCE` checks in a row. It asks only that the expected loss has
stopped falling, which holds for any objective SVI minimises, bound or not
(the predictive objectives are not bounds).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from numpyro.infer import SVI
from numpyro.infer.svi import SVIRunResult

from numpyro_pvi._trace.validation import check_int

#: The drift (in standard errors) at or below which a block counts as flat.
FLAT_DRIFT = 2.0
#: Flat blocks in a row after which a fit stops.
PATIENCE = 2
#: The share of the steps every fit runs before it may stop.
MIN_FRACTION = 0.2
#: Blocks of steps the rule is read at: each a twentieth of the most steps.
BLOCKS = 20


def svi_scan(
    svi: SVI,
    state: Any,
    *,
    num_steps: int,
    args: tuple = (),
    kwargs: dict | None = None,
) -> tuple[Any, jax.Array]:
    """``num_steps`` updates of ``svi`` from ``state`` in one ``lax.scan``
    (traceable: callers ``jit`` or ``vmap`` it).

    :param svi: the SVI object.
    :param state: its state.
    :param num_steps: the number of steps (a Python integer).
    :param args: positional arguments of model and guide.
    :param kwargs: keyword arguments of model and guide.
    :return: the final state and the ``(num_steps,)`` losses.
    """
    kwargs = {} if kwargs is None else kwargs

    def step(s: Any, _: None) -> tuple[Any, jax.Array]:
        return svi.update(s, *args, **kwargs)

    return jax.lax.scan(step, state, None, length=num_steps)


def svi_scan_until_flat(
    svi: SVI,
    state: Any,
    *,
    num_steps: int,
    args: tuple = (),
    kwargs: dict | None = None,
) -> tuple[Any, jax.Array, jax.Array, jax.Array]:
    """At most ``num_steps`` updates of ``svi`` from ``state``, stopped by the
    stopping rule (module docstring) read after each of :data:`BLOCKS`
    blocks, in one ``lax.while_loop`` (traceable; under ``vmap`` the loop
    runs until every fit has stopped, each fit's state frozen from its
    stop on).

    :return: the final state, the ``(num_steps,)`` losses (``nan`` after
        the stop), the number of steps taken and the drift of the last two
        blocks.
    """
    kwargs = {} if kwargs is None else kwargs
    block = num_steps // BLOCKS
    if block < 2:  # too few steps to read the rule: all of them
        state, losses = svi_scan(
            svi, state, num_steps=num_steps, args=args, kwargs=kwargs
        )
        return state, losses, jnp.asarray(num_steps), jnp.asarray(jnp.nan)
    first = num_steps - BLOCKS * block  # the remainder, before the blocks
    state, head = svi_scan(svi, state, num_steps=first, args=args, kwargs=kwargs)
    losses = jnp.full((num_steps,), jnp.nan, head.dtype).at[:first].set(head)
    zero = jnp.zeros((), head.dtype)

    def going(carry: tuple) -> jax.Array:
        k, flat = carry[1], carry[5]
        return (k < BLOCKS) & ~stops(flat, first + k * block, num_steps)

    def one_block(carry: tuple) -> tuple:
        state, k, losses, prev_mean, prev_var, flat, _ = carry
        state, ls = svi_scan(svi, state, num_steps=block, args=args, kwargs=kwargs)
        losses = jax.lax.dynamic_update_slice(losses, ls, (first + k * block,))
        mean, var = jnp.mean(ls), jnp.var(ls, ddof=1)
        d = drift((prev_mean, prev_var), (mean, var), block)
        flat = jnp.where((k > 0) & (d <= FLAT_DRIFT), flat + 1, 0)
        return state, k + 1, losses, mean, var, flat, jnp.where(k > 0, d, jnp.nan)

    carry = (state, jnp.asarray(0), losses, zero, zero, jnp.asarray(0), zero * jnp.nan)
    state, k, losses, *_, last_drift = jax.lax.while_loop(going, one_block, carry)
    return state, losses, first + k * block, last_drift


def drift(
    prev: tuple[jax.Array, jax.Array], last: tuple[jax.Array, jax.Array], t: int
) -> jax.Array:
    """The drift :math:`d` (module docstring) from the ``(mean, variance)``
    of two consecutive blocks of ``t`` losses; the denominator has a floor
    of :math:`10^{-5}(1 + |\\bar L_{\\rm last}|)` for losses without Monte
    Carlo noise."""
    var = (prev[1] + last[1]) / t
    floor = 1e-5 * (1.0 + jnp.abs(last[0]))
    return (prev[0] - last[0]) / (jnp.sqrt(var) + floor)


def stops(flat_blocks: Any, steps_done: Any, num_steps: int) -> Any:
    """Whether a fit stops: :data:`PATIENCE` flat blocks in a row, and at
    least :data:`MIN_FRACTION` of ``num_steps`` done (traceable)."""
    return (flat_blocks >= PATIENCE) & (steps_done >= MIN_FRACTION * num_steps)


class StopRule:
    """The stopping rule (module docstring) fed block by block: ``update``
    takes the ``(mean, variance)`` of every fit's last block of ``t``
    losses (arrays of any shape) and says whether all of them have been flat
    for :data:`PATIENCE` blocks, once ``steps_done`` reaches
    :data:`MIN_FRACTION` of ``num_steps``."""

    def __init__(self, num_steps: int) -> None:
        self.num_steps = num_steps
        self.prev: tuple[Any, Any] | None = None
        self.flat_blocks = 0

    def update(self, mean: Any, var: Any, t: int, steps_done: int) -> bool:
        last = (jnp.asarray(mean), jnp.asarray(var))
        if self.prev is not None:
            flat = bool(jnp.all(drift(self.prev, last, t) <= FLAT_DRIFT))
            self.flat_blocks = self.flat_blocks + 1 if flat else 0
        self.prev = last
        return bool(stops(self.flat_blocks, steps_done, self.num_steps))


def run_until_flat(
    svi: SVI,
    rng_key: jax.Array,
    num_steps: int,
    *args: Any,
    progress_bar: bool = True,
    **kwargs: Any,
) -> SVIRunResult:
    r"""``svi.run`` that stops once the loss no longer falls: at most
    ``num_steps`` steps, in compiled blocks of :math:`t`, a twentieth of
    them. With the means :math:`\bar L` and variances :math:`s^2` of the
    losses of the last two blocks, the drift

    .. math::

        d = \frac{\bar L_{\rm prev} - \bar L_{\rm last}}
        {\sqrt{(s^2_{\rm prev} + s^2_{\rm last}) / t}}

    is the fall of the mean loss in standard errors; the run stops once
    :math:`d \le 2` at two checks in a row, and not before a fifth of the
    steps. The rule asks only that the expected loss no longer falls, which
    holds for any objective SVI minimises, bound or not.

    **Example**::

        >>> svi = SVI(model, guide, optax.adam(1e-2), PredictiveELBO("crps"))
        >>> result = run_until_flat(svi, random.PRNGKey(0), 20_000, x, y)
        >>> len(result.losses)  # the steps it took

    :param svi: NumPyro's ``SVI``.
    :param rng_key: random key of ``svi.init``.
    :param num_steps: the most steps.
    :param args: positional arguments of model and guide.
    :param progress_bar: show the steps done.
    :param kwargs: keyword arguments of model and guide.
    :return: NumPyro's ``SVIRunResult``: the parameters, the state and the
        losses of the steps taken.
    """
    from tqdm.auto import tqdm

    num_steps = check_int(num_steps, "num_steps", "run_until_flat", minimum=1)
    state = svi.init(rng_key, *args, **kwargs)
    block = math.ceil(num_steps / BLOCKS)
    run = jax.jit(
        lambda s, n: svi_scan(svi, s, num_steps=n, args=args, kwargs=kwargs),
        static_argnums=1,
    )
    rule, losses, done = StopRule(num_steps), [], 0
    with tqdm(total=num_steps, disable=not progress_bar, desc="SVI") as bar:
        while done < num_steps:
            n = min(block, num_steps - done)
            state, block_losses = run(state, n)
            losses.append(block_losses)
            done += n
            bar.update(n)
            mean, var = jnp.mean(block_losses), jnp.var(block_losses, ddof=1)
            if rule.update(mean, var, n, done):
                break
    return SVIRunResult(svi.get_params(state), state, jnp.concatenate(losses))
