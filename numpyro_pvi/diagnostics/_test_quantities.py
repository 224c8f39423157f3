"""Test quantities of VSBC: functions of the latent values and the data set
calibrated beside the parameters (Modrák et al. 2023), the joint
log-likelihood among them unless left out."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from numpyro_pvi._core import joint_log_likelihood

#: The name of the joint log-likelihood test quantity.
LOG_LIKELIHOOD = "log_likelihood"


def resolve_quantities(
    test_quantities: Mapping[str, Callable | None] | None,
    *,
    latent_names: Sequence[str],
    model: Callable,
    inject: Callable[[dict], tuple[tuple, dict]],
    function: str,
) -> dict[str, Callable]:
    """The test quantities to calibrate, checked: the joint log-likelihood
    as ``"log_likelihood"`` unless ``test_quantities`` maps that name to
    ``None`` (leave it out) or to a function of one's own, then every other
    entry name → callable, whose names differ from the latent sites'."""
    if test_quantities is None:
        test_quantities = {}
    if not isinstance(test_quantities, Mapping):
        raise TypeError(
            f"{function}: test_quantities must be a mapping name -> f(theta, "
            f"data), got {type(test_quantities).__name__}."
        )
    quantities: dict[str, Any] = {LOG_LIKELIHOOD: joint_log_likelihood(model, inject)}
    quantities.update(test_quantities)
    if quantities[LOG_LIKELIHOOD] is None:
        del quantities[LOG_LIKELIHOOD]
    for name, f in quantities.items():
        if not isinstance(name, str) or not callable(f):
            raise TypeError(
                f"{function}: test_quantities must map names (str) to callables "
                f"f(theta, data) (or '{LOG_LIKELIHOOD}' to None, to leave the "
                f"joint log-likelihood out); got {name!r}: {type(f).__name__}."
            )
        if name in latent_names:
            raise ValueError(
                f"{function}: test quantity '{name}' has the name of a latent "
                "site; give it another name."
            )
    return quantities
