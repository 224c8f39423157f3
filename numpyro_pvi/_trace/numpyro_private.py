"""The private names of NumPyro this package uses, in one place.

NumPyro does not promise these names; each is wrapped here so that a change
in NumPyro breaks one module, and the test suite's run against the pinned
NumPyro says which. Checked against NumPyro 0.22.0 (Python 3.11 and 3.12).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import jax
from numpyro.infer.autoguide import AutoContinuous, AutoGuideList
from numpyro.infer.calibration import _resolve_observed_sites, _validate_latent_sites
from numpyro.infer.util import _without_rsample_stop_gradient


@contextlib.contextmanager
def without_rsample_stop_gradient() -> Iterator[None]:
    """Reparameterised draws keep their gradient inside the block
    (``numpyro.infer.util._without_rsample_stop_gradient``)."""
    with _without_rsample_stop_gradient():
        yield


def validate_latent_sites(model_trace: dict, latent_names: Sequence[str]) -> None:
    """NumPyro's check that ``latent_names`` are latent sample sites of the
    trace, with its messages (``numpyro.infer.calibration``)."""
    _validate_latent_sites(model_trace, latent_names)


def resolve_observed_sites(
    model_trace: dict, observed_sites: Sequence[str] | None
) -> tuple[list[str], list[str]]:
    """``(observed, latent)`` site names of the trace, as NumPyro's
    ``vsbc_diagnostic`` resolves them (``observed_sites=None``: every
    observed sample site)."""
    return _resolve_observed_sites(model_trace, observed_sites)


def guide_parts(guide: object) -> list:
    """The guides inside an :class:`~numpyro.infer.autoguide.AutoGuideList`
    (its ``_guides``), or ``[guide]``."""
    return list(guide._guides) if isinstance(guide, AutoGuideList) else [guide]


def unpack_latent(guide: AutoContinuous, latent: jax.Array) -> dict:
    """A flat unconstrained vector of an initialised
    :class:`~numpyro.infer.autoguide.AutoContinuous` guide as a dict of its
    sites' values (``AutoContinuous._unpack_latent``)."""
    return guide._unpack_latent(latent)
