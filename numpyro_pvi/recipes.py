"""The options of the procedures that fit, as small values.

Every public procedure that fits takes ``(rng_key, model, guide, optim,
...)``, NumPyro's :func:`~numpyro.infer.calibration.vsbc_diagnostic` shape;
how each fit is run and read (:class:`FitRecipe`) and how fits are
replicated over simulated data sets (:class:`Replications`) travel as these
frozen values rather than as loose keyword arguments:

.. code-block:: python

    vsbc(key, model, guide, optax.adam(1e-2), Trace_ELBO(), x, y,
         replications=Replications(num_simulations=200, num_svi_steps=2000))
    cross_validate(key, model, guide, optax.adam(1e-2), x, y,
                   fit=FitRecipe(num_steps=2000))

Both check their fields when built, so a wrong option is refused before
anything is compiled.
"""

from numpyro_pvi._trace.recipes import FitRecipe, Replications

FitRecipe.__module__ = __name__
Replications.__module__ = __name__

__all__ = ["FitRecipe", "Replications"]
