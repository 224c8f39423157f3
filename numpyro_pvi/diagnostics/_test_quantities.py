"""Test quantities of VSBC: functions of the latent values and the data set
calibrated beside the parameters (Modrák et al. 2023), the joint
log-likelihood among them by default."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
from numpyro.handlers import condition, seed, substitute, trace

from numpyro_pvi._core import observed_sites, sum_log_density

#: The name of the joint log-likelihood test quantity.
LOG_LIKELIHOOD = "log_likelihood"


def joint_log_likelihood(
    model: Callable, inject: Callable[[dict], tuple[tuple, dict]]
) -> Callable[[dict, dict], jax.Array]:
    r"""``f(θ, y) = log p(y | θ)``: every observed site's log density at the
    data set ``y`` given the latent values ``θ``, with the handler scales the
    model applies (the likelihood part of :func:`numpyro.infer.util.log_density`).

    :param model: the model.
    :param inject: ``y -> (args, kwargs)`` that passes a data set to it.
    """

    def log_lik(theta: dict, data: dict) -> jax.Array:
        args, kwargs = inject(data)
        conditioned = substitute(condition(model, data), data=theta)
        tr = trace(seed(conditioned, rng_seed=0)).get_trace(*args, **kwargs)
        return sum_log_density(observed_sites(tr))

    return log_lik


def resolve_quantities(
    test_quantities: Mapping[str, Callable] | None,
    *,
    log_likelihood: bool,
    latent_names: Sequence[str],
    model: Callable,
    inject: Callable[[dict], tuple[tuple, dict]],
    function: str,
) -> dict[str, Callable]:
    """The test quantities to calibrate, checked: a mapping name → callable
    whose names differ from the latent sites'; the joint log-likelihood is
    added as ``"log_likelihood"`` when ``log_likelihood`` is true."""
    quantities: dict[str, Any] = {}
    if test_quantities is not None:
        if not isinstance(test_quantities, Mapping):
            raise TypeError(
                f"{function}: test_quantities must be a mapping name -> f(theta, "
                f"data), got {type(test_quantities).__name__}."
            )
        quantities.update(test_quantities)
    if log_likelihood:
        if LOG_LIKELIHOOD in quantities:
            raise ValueError(
                f"{function}: test_quantities has a '{LOG_LIKELIHOOD}' entry, the "
                "name of the joint log-likelihood; rename it, or pass "
                "log_likelihood=False."
            )
        quantities[LOG_LIKELIHOOD] = joint_log_likelihood(model, inject)
    for name, f in quantities.items():
        if not isinstance(name, str) or not callable(f):
            raise TypeError(
                f"{function}: test_quantities must map names (str) to callables "
                f"f(theta, data); got {name!r}: {type(f).__name__}."
            )
        if name in latent_names:
            raise ValueError(
                f"{function}: test quantity '{name}' has the name of a latent "
                "site; give it another name."
            )
    return quantities
