r"""Guides beyond NumPyro's: Gaussian mixtures (GM-PVI) and spline flows.

:class:`AutoGaussianMixture` approximates the posterior by a mixture of ``K``
full-covariance Gaussians, optionally with weights gated by a covariate
(VGM-PVI); the predictive objectives take their expectations stratified by
component, ``M`` draws from each and the weights exact,

.. math::

    q(y_i \mid x_i) \approx \sum_{k=1}^K \omega_k(x_i)\,
    \frac{1}{M}\sum_{m=1}^M p(y_i \mid \theta_{k,m}),
    \qquad \theta_{k,m} \sim \mathcal{N}(\mu_k, \Sigma_k).

:func:`linear_predictor_score` computes the same predictive by Gauss--Hermite
quadrature, :func:`fit_gm_pvi` fits with component pruning (Kock et al.).
:class:`AutoFlow` is a rational-quadratic spline coupling flow (Durkan et al.
2019, from flowjax) for the objectives that read :math:`\log q` at fixed draws
and for multimodal posteriors.

**References**

1. Kock, L., Sisson, S. A., Rodrigues, G. S. & Nott, D. J. *Predictive
   variational inference for flexible regression models*. arXiv:2602.22582.
2. Huber, M. F., Bailey, T., Durrant-Whyte, H. & Hanebeck, U. D. (2008). *On
   entropy approximation for Gaussian mixture random vectors*. IEEE MFI.
"""

from numpyro_pvi.guides.auto_flow import AutoFlow
from numpyro_pvi.guides.auto_mixture import AutoGaussianMixture
from numpyro_pvi.guides.flow import FlowDistribution
from numpyro_pvi.guides.gaussian_mixture import GaussianMixture
from numpyro_pvi.guides.pruning import PrunedFit, fit_gm_pvi, prune_components
from numpyro_pvi.guides.quadrature import linear_predictor_score

__all__ = [
    "AutoFlow",
    "AutoGaussianMixture",
    "FlowDistribution",
    "GaussianMixture",
    "PrunedFit",
    "fit_gm_pvi",
    "linear_predictor_score",
    "prune_components",
]
