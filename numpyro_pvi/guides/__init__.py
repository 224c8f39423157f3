r"""Guides beyond NumPyro's: Gaussian mixtures (GM-PVI) and spline flows.

:class:`AutoGaussianMixture` is a NumPyro autoguide whose approximation of
the posterior over the unconstrained latent space is a mixture of ``K``
full-covariance Gaussians, optionally with weights that depend on a
covariate of each observation (VGM-PVI). The predictive objectives
(:class:`~numpyro_pvi.PredictiveELBO` and :class:`~numpyro_pvi.PACmELBO`)
recognise it and compute their expectations *stratified* by component:
``M`` reparameterised draws from every component and the weights entering
exactly,

.. math::

    q(y_i \mid x_i) \approx \sum_{k=1}^K \omega_k(x_i)\,
    \frac{1}{M}\sum_{m=1}^M p(y_i \mid \theta_{k,m}),
    \qquad \theta_{k,m} \sim \mathcal{N}(\mu_k, \Sigma_k),

so that gradients reach the weights, the gating coefficients, the means and
the covariances. For models whose likelihood depends on the parameters
through a linear predictor, :func:`linear_predictor_score` computes the same
predictive with Gauss--Hermite quadrature (in closed form for a Gaussian
likelihood), and :func:`fit_gm_pvi` runs SVI with the component pruning
heuristic of Kock et al.

**References**

1. Kock, L., Sisson, S. A., Rodrigues, G. S. & Nott, D. J. *Predictive
   variational inference for flexible regression models*. arXiv:2602.22582.
2. Huber, M. F., Bailey, T., Durrant-Whyte, H. & Hanebeck, U. D. (2008). *On
   entropy approximation for Gaussian mixture random vectors*. IEEE MFI.

:class:`AutoFlow` is a rational-quadratic spline coupling flow (Durkan et
al. 2019, built from flowjax bijections) whose draw and density at given
points each cost one pass: the flexible guide for the objectives that
evaluate :math:`\log q` at fixed draws (:class:`~numpyro_pvi.SoftCVIELBO`,
:class:`~numpyro_pvi.SNISForwardKL`) and for multimodal posteriors.

Modules: :mod:`~numpyro_pvi.guides.gaussian_mixture` (the distribution),
:mod:`~numpyro_pvi.guides.auto_mixture` (the autoguide),
:mod:`~numpyro_pvi.guides.quadrature` (Gauss--Hermite predictive),
:mod:`~numpyro_pvi.guides.pruning` (fitting with pruning),
:mod:`~numpyro_pvi.guides.flow` (a flowjax bijection as a NumPyro
distribution) and :mod:`~numpyro_pvi.guides.auto_flow` (the flow
autoguide).
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
