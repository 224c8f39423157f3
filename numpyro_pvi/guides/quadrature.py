"""Gauss--Hermite predictive of a Gaussian-mixture guide for models whose
likelihood depends on the parameters through a linear predictor."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.distributions import constraints

from numpyro_pvi._trace.numpyro_private import unpack_latent
from numpyro_pvi._trace.validation import check_int
from numpyro_pvi.guides.auto_mixture import AutoGaussianMixture

__all__ = ["linear_predictor_score"]


def _bernoulli_logit(eta: jax.Array, y: jax.Array) -> jax.Array:
    return -jax.nn.softplus(jnp.where(y > 0, -eta, eta))


def _poisson_log(eta: jax.Array, y: jax.Array) -> jax.Array:
    return y * eta - jnp.exp(eta) - jax.scipy.special.gammaln(y + 1.0)


_LIKELIHOODS: dict[str, Callable] = {
    "bernoulli": _bernoulli_logit,
    "poisson": _poisson_log,
}


def _site_indices(guide: AutoGaussianMixture, site: str | None) -> np.ndarray:
    """Positions of ``site``'s entries in the guide's latent vector."""
    if guide.prototype_trace is None:
        raise ValueError(
            "The guide has not been initialised: fit it (or call SVI.init) first."
        )
    latent = unpack_latent(guide, jnp.arange(guide.latent_dim, dtype=float))
    if site is None:
        if len(latent) != 1:
            raise ValueError(
                f"The model has several latent sites {sorted(latent)}: name the "
                "one holding the regression coefficients with site=..."
            )
        (site,) = latent
    if site not in latent:
        raise ValueError(
            f"site={site!r} is not a latent site of the model; its latent sites "
            f"are {sorted(latent)}."
        )
    support = guide.prototype_trace[site]["fn"].support
    if support not in (constraints.real, constraints.real_vector):
        raise ValueError(
            f"The linear predictor needs the coefficients '{site}' on the real "
            f"line (unconstrained), but their support is {support}."
        )
    return np.asarray(latent[site], dtype=int).reshape(-1)


def linear_predictor_score(
    params: dict[str, jax.Array],
    guide: AutoGaussianMixture,
    design: Any,
    y: Any,
    *,
    likelihood: str | Callable = "gaussian",
    site: str | None = None,
    noise_scale: float | None = None,
    num_nodes: int = 32,
    gating_covariates: Any = None,
) -> jax.Array:
    r"""Log predictive density of a GM-PVI fit by quadrature (Kock et al., eqs. 9,
    11, 13).

    Where the likelihood depends on :math:`\beta` only through
    :math:`\eta_i = x_i^\top\beta`, each Gaussian component induces
    :math:`\eta_i \sim \mathcal{N}(m_{ik}, s_{ik}^2)`, and

    .. math::

        q(y_i \mid x_i) \approx \sum_k \omega_k(x_i) \sum_{b=1}^B
        \frac{w_b}{\sqrt\pi}\, p\big(y_i \mid m_{ik} + \sqrt2\, s_{ik} t_b\big)

    with Gauss--Hermite nodes :math:`t_b`; exact,
    :math:`\mathcal{N}(y_i; m_{ik}, \sigma^2 + s_{ik}^2)`, for a Gaussian
    likelihood. Differentiable in ``params``.

    :param params: the fitted parameters of ``guide``.
    :param guide: a fitted :class:`AutoGaussianMixture`.
    :param design: ``(n, p)`` rows :math:`x_i` of the linear predictor.
    :param y: ``(n,)`` observations.
    :param likelihood: ``"gaussian"`` (needs ``noise_scale``),
        ``"bernoulli"`` (logit link), ``"poisson"`` (log link), or a callable
        ``log_lik(eta, y)`` evaluated elementwise.
    :param site: the latent site holding :math:`\beta`; may be omitted when it
        is the model's only latent site.
    :param noise_scale: :math:`\sigma` of the Gaussian likelihood.
    :param int num_nodes: :math:`B`, the number of quadrature nodes.
    :param gating_covariates: ``(n, p_g)`` gating covariates of these
        observations (default: the guide's, aligned with ``design``).
    :return: ``(n,)`` per-observation log predictive densities.

    **References**

    1. Kock, L., Sisson, S. A., Rodrigues, G. S. & Nott, D. J. *Predictive
       variational inference for flexible regression models*. arXiv:2602.22582.
    """
    x = jnp.asarray(design, dtype=float)
    y = jnp.asarray(y)
    if x.ndim != 2 or y.shape != x.shape[:1]:
        raise ValueError(
            f"design must be (n, p) and y (n,), got {x.shape} and {y.shape}."
        )
    num_nodes = check_int(num_nodes, "num_nodes", "linear_predictor_score", minimum=1)
    if isinstance(likelihood, str) and likelihood not in (*_LIKELIHOODS, "gaussian"):
        raise ValueError(
            f"likelihood must be 'gaussian', {', '.join(map(repr, _LIKELIHOODS))} "
            f"or a callable log_lik(eta, y), got {likelihood!r}."
        )
    if likelihood == "gaussian" and (noise_scale is None or not noise_scale > 0):
        raise ValueError(
            "likelihood='gaussian' needs noise_scale > 0 (the known sigma of the "
            f"Gaussian likelihood), got {noise_scale!r}."
        )
    idx = _site_indices(guide, site)
    if idx.size != x.shape[1]:
        raise ValueError(
            f"design has {x.shape[1]} columns but the coefficients have "
            f"{idx.size} entries."
        )
    mix = guide.get_posterior(params)
    locs = mix.locs[:, idx]  # (K, p)
    trils = mix.scale_trils[:, idx, :]  # rows of L: Sigma[idx, idx] = L_idx L_idx^T
    mean = x @ locs.T  # (n, K)
    sd = jnp.linalg.norm(jnp.einsum("np,kpd->nkd", x, trils), axis=-1)  # (n, K)
    if likelihood == "gaussian":
        assert noise_scale is not None  # checked with the arguments
        comp = dist.Normal(mean, jnp.sqrt(noise_scale**2 + sd**2)).log_prob(y[:, None])
    else:
        log_lik = (
            _LIKELIHOODS[likelihood] if isinstance(likelihood, str) else likelihood
        )
        nodes, weights = np.polynomial.hermite.hermgauss(num_nodes)
        eta = mean[..., None] + math.sqrt(2.0) * sd[..., None] * jnp.asarray(nodes)
        log_w = jnp.log(jnp.asarray(weights)) - 0.5 * math.log(math.pi)
        comp = jax.nn.logsumexp(log_w + log_lik(eta, y[:, None, None]), axis=-1)
    if guide.gating_covariates is None:
        log_omega = mix.logits  # (K,)
    else:
        rows = (
            guide.gating_covariates if gating_covariates is None else gating_covariates
        )
        log_omega = guide.component_log_weights(params, rows)
        if log_omega.shape[0] != x.shape[0]:
            raise ValueError(
                f"gating covariates have {log_omega.shape[0]} rows but design has "
                f"{x.shape[0]}: pass gating_covariates=... for these observations."
            )
    return jax.nn.logsumexp(log_omega + comp, axis=-1)
