"""Checks of a model and guide as they are traced: an exception without a
message re-raised with where it was raised, and the model's discrete sites
marked for enumeration that the guide does not draw (summed out by
``TraceEnum_ELBO`` only)."""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator
from typing import Any


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


def require_guided_enumeration(
    model_trace: dict[str, Any], guide_trace: dict[str, Any], objective: str
) -> None:
    """Raise for a latent site of the model marked for enumeration
    (``infer={"enumerate": ...}``, ``config_enumerate``) that the guide does
    not draw: ``TraceEnum_ELBO`` sums it out, while the replay here would
    draw it from its prior and score the observations at that one value.
    """
    for name, site in model_trace.items():
        latent = site["type"] == "sample" and not site["is_observed"]
        if latent and site["infer"].get("enumerate") and name not in guide_trace:
            raise ValueError(
                f"{objective}: the model's discrete site '{name}' is marked for "
                f"enumeration (infer={{'enumerate': "
                f"{site['infer']['enumerate']!r}}}) and the guide does not draw "
                "it. TraceEnum_ELBO sums such a site out of the joint density; "
                "this package does not enumerate, and replaying the model would "
                "draw it from its prior and score the observations at that one "
                "value, a different objective. Sum it out in the model: write "
                "the observations it selects as a mixture over its values "
                "(dist.MixtureSameFamily or dist.MixtureGeneral, or the "
                "marginal distribution in closed form), or fit this model with "
                "TraceEnum_ELBO."
            )
