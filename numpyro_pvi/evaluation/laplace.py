"""The fitted Laplace approximation of an ``AutoLaplaceApproximation``.

NumPyro's :class:`~numpyro.infer.autoguide.AutoLaplaceApproximation` is a
point mass while it is fitted (its MAP) and stands, once fitted, for the
multivariate normal in its unconstrained latent space whose precision is the
Hessian of :math:`-\\log p(\\theta, y)` at the MAP (``get_posterior``,
``sample_posterior``). Run as a guide it still draws the MAP. The functions
that take a fitted guide read it through :func:`laplace_posterior`: a guide
that draws that normal (as ``sample_posterior`` does) and has its log
density, with the normal's location and Cholesky factor among the
parameters, so that the compiled programs take them as inputs.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpyro
import numpyro.distributions as dist
from numpyro.infer.autoguide import AutoLaplaceApproximation

#: the parameters :class:`LaplacePosterior` reads, after the guide's prefix
LOC, SCALE_TRIL = "laplace_loc", "laplace_scale_tril"


class LaplacePosterior(AutoLaplaceApproximation):
    """The multivariate normal of a fitted
    :class:`~numpyro.infer.autoguide.AutoLaplaceApproximation` as a guide:
    it draws as the fitted guide's ``sample_posterior`` does (the same
    latent sites, constrained the same way) and its trace holds their log
    density. Its location and Cholesky factor are the parameters
    ``{prefix}_laplace_loc`` and ``{prefix}_laplace_scale_tril``
    (:func:`laplace_posterior` adds them)."""

    #: the name the exports record: the guide the user fitted
    fitted_name = "AutoLaplaceApproximation (its Laplace approximation)"

    def __init__(self, laplace: AutoLaplaceApproximation) -> None:
        self.__dict__.update(laplace.__dict__)

    def _get_posterior(self, *args: Any, **kwargs: Any) -> dist.Distribution:
        loc = numpyro.param(f"{self.prefix}_{LOC}")
        scale_tril = numpyro.param(f"{self.prefix}_{SCALE_TRIL}")
        return dist.MultivariateNormal(loc, scale_tril=scale_tril)


_POSTERIORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def laplace_posterior(
    guide: Callable, params: Mapping[str, Any], args: tuple, kwargs: Mapping
) -> tuple[Callable, dict[str, Any]]:
    """``(guide, params)`` for the functions that take a fitted guide: an
    ``AutoLaplaceApproximation`` becomes its :class:`LaplacePosterior`
    (one per guide, so that its compiled programs are reused), ``params``
    gain its normal's location and Cholesky factor (NumPyro's
    ``get_posterior``); any other guide is returned as it is."""
    if not isinstance(guide, AutoLaplaceApproximation) or isinstance(
        guide, LaplacePosterior
    ):
        return guide, dict(params)
    if guide.prototype_trace is None:  # a guide not run yet (params loaded)
        with numpyro.handlers.seed(rng_seed=0):
            guide._setup_prototype(*args, **kwargs)
    normal = guide.get_posterior(dict(params))
    if guide not in _POSTERIORS:
        _POSTERIORS[guide] = LaplacePosterior(guide)
    return _POSTERIORS[guide], {
        **params,
        f"{guide.prefix}_{LOC}": jax.numpy.asarray(normal.loc),
        f"{guide.prefix}_{SCALE_TRIL}": jax.numpy.asarray(normal.scale_tril),
    }
