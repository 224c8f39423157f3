"""Running SVI steps inside one compiled loop."""

from __future__ import annotations

from typing import Any

import jax
from numpyro.infer import SVI


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
