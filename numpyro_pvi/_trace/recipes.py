"""Small values that carry the options of the procedures that fit.

A procedure that fits a guide takes ``(rng_key, model, guide, optim, ...)``
(NumPyro's :func:`~numpyro.infer.calibration.vsbc_diagnostic`); how each fit
is run and read, and how fits are replicated over simulated data sets, travel
as the two frozen values below rather than as loose keyword arguments. They
are re-exported by :mod:`numpyro_pvi.recipes`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TypeVar

from numpyro_pvi._trace.validation import check_bool, check_int

R = TypeVar("R")

#: How replications may be dispatched (or a callable such as ``jax.vmap``).
CHAIN_METHODS = ("sequential", "vectorized", "sharded")


@dataclasses.dataclass(frozen=True)
class FitRecipe:
    """How each SVI fit of a procedure is run and read.

    :param num_steps: SVI steps of each fit (≥ 1); with ``stop_early`` the
        most.
    :param num_draws: draws read from each fitted guide (≥ 1).
    :param progress_bar: show a progress bar over the fits.
    :param stop_early: end the fits once their loss no longer falls (the
        stopping rule of :func:`~numpyro_pvi.run_until_flat`).
    """

    num_steps: int = 1000
    num_draws: int = 1000
    progress_bar: bool = True
    stop_early: bool = False

    def __post_init__(self) -> None:
        check_int(self.num_steps, "num_steps", "FitRecipe", minimum=1)
        check_int(self.num_draws, "num_draws", "FitRecipe", minimum=1)
        check_bool(self.progress_bar, "progress_bar", "FitRecipe")
        check_bool(self.stop_early, "stop_early", "FitRecipe")


@dataclasses.dataclass(frozen=True)
class Replications:
    """How a procedure that fits is replicated over simulated data sets.

    The field names are those of
    :func:`numpyro.infer.calibration.vsbc_diagnostic`.

    :param num_simulations: simulated data sets, one fit each (≥ 2).
    :param num_svi_steps: SVI steps of each fit (≥ 1).
    :param num_draws: guide draws read from each fit (≥ 1).
    :param chain_method: ``"sequential"`` (``lax.map``, least memory),
        ``"vectorized"`` (``vmap``), ``"sharded"`` (replications split over
        all local devices with :mod:`jax.sharding`, ``vmap`` within each) or
        a callable such as ``jax.vmap`` that maps a function of one
        replication over a batch (the result is jit-compiled).
    :param chunk_size: replications per compiled call; default all of them
        without a progress bar, a tenth of them with one. Rounded up to a
        multiple of the device count when sharded.
    :param progress_bar: show a progress bar over chunks of replications.
    :param simulated_data_to_args: optional ``f(data, *args, **kwargs) ->
        (args, kwargs)`` that passes a simulated data set (a dict site →
        value) to the model and guide, when they take it in a container.
    :param data_generator: optional ``rng_key -> dict`` of observed values
        (shaped as the model's observed sites) that simulates the data sets
        instead of the model's prior predictive — a data-generating process
        of one's own, for
        :func:`~numpyro_pvi.diagnostics.predictive_calibration` (VSBC needs
        the prior's :math:`θ^*` and refuses it).
    :param stop_early: end each fit once its loss no longer falls (the
        stopping rule of :func:`~numpyro_pvi.run_until_flat`);
        ``num_svi_steps`` is then the most.
    """

    num_simulations: int = 100
    num_svi_steps: int = 1000
    num_draws: int = 1000
    chain_method: str | Callable = "vectorized"
    chunk_size: int | None = None
    progress_bar: bool = True
    simulated_data_to_args: Callable | None = None
    data_generator: Callable | None = None
    stop_early: bool = False

    def __post_init__(self) -> None:
        where = "Replications"
        check_int(self.num_simulations, "num_simulations", where, minimum=2)
        check_int(self.num_svi_steps, "num_svi_steps", where, minimum=1)
        check_int(self.num_draws, "num_draws", where, minimum=1)
        if not callable(self.chain_method) and self.chain_method not in CHAIN_METHODS:
            raise ValueError(
                f"{where}: chain_method must be one of {CHAIN_METHODS} or a "
                f"callable such as jax.vmap, got {self.chain_method!r}."
            )
        if self.chunk_size is not None:
            check_int(self.chunk_size, "chunk_size", where, minimum=1)
        check_bool(self.progress_bar, "progress_bar", where)
        check_bool(self.stop_early, "stop_early", where)
        for name, shape in (
            ("simulated_data_to_args", "f(data, *args, **kwargs) -> (args, kwargs)"),
            ("data_generator", "f(rng_key) -> dict of observed values"),
        ):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise TypeError(
                    f"{where}: {name} must be a function {shape} or None, got "
                    f"{type(value).__name__}."
                )


def check_recipe(
    value: object, cls: type[R], name: str, function: str, kwargs: dict | None = None
) -> R:
    """``value``, or ``cls()`` when it is ``None``; refuses anything that is
    not a ``cls`` (e.g. a dict of options), and options of ``cls`` passed
    loose among the model's keyword arguments ``kwargs``."""
    loose = sorted(set(kwargs or ()) & set(getattr(cls, "__dataclass_fields__", ())))
    if loose:
        shown = ", ".join(f"{k}=..." for k in loose)
        raise TypeError(
            f"{function}: {', '.join(loose)} is an option of {cls.__name__}: pass "
            f"it inside {name}={cls.__name__}({shown}), not as a keyword argument "
            "of the model."
        )
    if value is None:
        return cls()
    if not isinstance(value, cls):
        raise TypeError(
            f"{function}: {name} must be a {cls.__name__}(...), e.g. "
            f"{name}={cls.__name__}(), got {type(value).__name__}."
        )
    return value
