"""Validation of user arguments: one place for "a positive integer", "a real
number in a range", "True or False" and "a plate name".

Every check rejects the value before anything is traced, with a message that
names the function and the argument. Numbers must be numbers: a string such
as ``"0.1"`` or a bool is refused rather than converted.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import traceback
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer.autoguide import AutoDelta, AutoLaplaceApproximation


def check_int(value: Any, name: str, where: str, *, minimum: int) -> int:
    """An ``int`` (or NumPy integer) of at least ``minimum``.

    :param value: the argument.
    :param name: its name, for the message.
    :param where: the function or class, for the message.
    :param minimum: the smallest value allowed.
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, np.integer))
        or value < minimum
    ):
        raise ValueError(
            f"{where}: {name} must be an integer >= {minimum}, got {value!r}."
        )
    return int(value)


def check_real(
    value: Any,
    name: str,
    where: str,
    *,
    low: float = -math.inf,
    high: float = math.inf,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """A finite real number in ``[low, high]`` (ends open on request).

    :param value: the argument (a Python or NumPy real, not a string or bool).
    :param name: its name, for the message.
    :param where: the function or class, for the message.
    :param low: lower end of the range.
    :param high: upper end of the range.
    :param low_open: exclude ``low``.
    :param high_open: exclude ``high``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{where}: {name} must be a real number, got {type(value).__name__} "
            f"{value!r}."
        )
    x = float(value)
    above = x > low if low_open else x >= low
    below = x < high if high_open else x <= high
    if not (math.isfinite(x) and above and below):
        lo = "(" if low_open else "["
        hi = ")" if high_open else "]"
        raise ValueError(
            f"{where}: {name} must be finite and in {lo}{low:g}, {high:g}{hi}, "
            f"got {value!r}."
        )
    return x


def check_bool(value: Any, name: str, where: str) -> bool:
    """``True`` or ``False`` (not a truthy value of another type)."""
    if not isinstance(value, bool):
        raise TypeError(f"{where}: {name} must be True or False, got {value!r}.")
    return value


def check_data_plate(value: Any, where: str) -> str | int | None:
    """The name of a plate (``str``), a negative batch dimension of the
    observed values (``int``, for models without a plate) or ``None``."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        if value < 0:
            return int(value)
    raise TypeError(
        f"{where}: data_plate must be the name of a plate (str), a negative "
        f"batch dimension of the observed values (int, e.g. -1) or None, got "
        f"{value!r}."
    )


def check_real_or_array(
    value: Any, name: str, where: str, *, low: float = -math.inf
) -> float | jax.Array:
    """A real number as :func:`check_real`, or a scalar JAX array (possibly
    traced, e.g. one value of a grid under ``vmap``), returned as it is:
    its range cannot be checked before the program runs."""
    if isinstance(value, jax.Array):
        if jnp.ndim(value) != 0:
            raise ValueError(
                f"{where}: {name} must be a scalar, got an array of shape "
                f"{jnp.shape(value)}; vmap over a grid of values instead."
            )
        return value
    return check_real(value, name, where, low=low)


def _numpyro_posterior_objectives() -> tuple[type, ...]:
    """NumPyro's ELBOs: variational inference of the Bayesian posterior."""
    from numpyro.infer import (
        RenyiELBO,
        Trace_ELBO,
        TraceEnum_ELBO,
        TraceGraph_ELBO,
        TraceMeanField_ELBO,
    )

    return (Trace_ELBO, TraceMeanField_ELBO, TraceGraph_ELBO, TraceEnum_ELBO, RenyiELBO)


def check_loss_target(loss: Any, where: str) -> bool | None:
    """Whether the objective ``loss`` targets the Bayesian posterior.

    The package's objectives declare it (``targets_posterior``: ``True`` for
    SoftCVI, SNIS and the stratified ELBO, ``False`` for PVI and PAC^m);
    NumPyro's ELBOs target it. Any other objective must say so, since a
    diagnostic reads k̂ and LOO differently for one that does not.

    :param loss: the objective (``None``: not given).
    :param where: the function, for the message.
    :return: ``None`` when ``loss`` is ``None``.
    """
    if loss is None:
        return None
    value = getattr(loss, "targets_posterior", None)
    if isinstance(value, bool):
        return value
    if isinstance(loss, _numpyro_posterior_objectives()):
        return True
    raise TypeError(
        f"{where}: loss={loss!r} does not say whether its optimum is the Bayesian "
        "posterior, which decides how k̂ and LOO of the fit are read; set "
        "loss.targets_posterior = True (variational inference of the posterior) "
        "or False (a predictive or other criterion)."
    )


#: Guides that are point masses while they are fitted.
_POINT_MASS_GUIDES = (AutoDelta, AutoLaplaceApproximation)


def warn_laplace_held_out(guide: Callable, where: str) -> None:
    """Warn that the held-out scores of refitted ``AutoLaplaceApproximation``
    fits are those of their MAP: a fit is a point mass, and its Laplace
    approximation (the functions on a fitted guide read it) is not formed
    per fold."""
    if isinstance(guide, AutoLaplaceApproximation):
        warnings.warn(
            f"{where} with AutoLaplaceApproximation: each fold's fit is its MAP "
            "(a point mass while fitted), so the held-out scores are those of "
            "the MAP's plug-in predictive, not of a Laplace approximation. For "
            "held-out scores of a Gaussian approximation, fit "
            "AutoMultivariateNormal.",
            UserWarning,
            stacklevel=3,
        )


def warn_point_mass(guide: Callable, objective: str) -> None:
    """Warn that a predictive objective with a point-mass guide fits the
    likelihood: the predictive of a point mass is the likelihood itself."""
    if isinstance(guide, _POINT_MASS_GUIDES):
        warnings.warn(
            f"{objective} with {type(guide).__name__}: the posterior predictive of "
            "a point mass is the likelihood at that point, so the predictive "
            "score is the log-likelihood (or its score) of a point estimate and "
            "nothing is learned about uncertainty. Use a guide with a spread "
            "(AutoNormal, AutoMultivariateNormal, ...) for predictive VI.",
            UserWarning,
            stacklevel=4,
        )


@contextlib.contextmanager
def explained_failure(objective: str, role: str) -> Iterator[None]:
    """Re-raise an exception without a message (a bare ``assert`` in the
    model, the guide or a library they call, e.g. ``AutoSemiDAIS`` run at
    another subsample size than it was built for) as one that says where it
    was raised; others pass unchanged."""
    try:
        yield
    except Exception as err:
        if str(err):
            raise
        where = traceback.extract_tb(err.__traceback__)[-1]
        raise ValueError(
            f"{objective}: running the {role} raised {type(err).__name__} with "
            f"no message, at {where.filename}:{where.lineno}: {where.line!r}. "
            f"Check the {role} at these arguments (NumPyro's Trace_ELBO runs it "
            "the same way)."
        ) from err
