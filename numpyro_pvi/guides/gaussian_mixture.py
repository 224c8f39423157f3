"""The mixture of full-covariance Gaussians over the unconstrained latents
that :class:`~numpyro_pvi.guides.AutoGaussianMixture` fits."""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpyro.distributions as dist
from jax import random
from jax.lax import stop_gradient
from numpyro.distributions import constraints

__all__ = ["GaussianMixture", "component_draw"]


class GaussianMixture(dist.Distribution):
    r"""Mixture of ``K`` full-covariance Gaussians on :math:`\mathbb{R}^D`.

    .. math::

        \bar q(\theta) = \sum_{k=1}^K \bar\omega_k\,
        \mathcal{N}(\theta;\mu_k, L_k L_k^\top).

    Draws pick a component with probabilities :math:`\bar\omega` and are
    reparameterised within it (:math:`\theta = \mu_z + L_z\varepsilon`), so
    their gradient reaches the means and scales but not the weights: an
    estimator that differentiates through such draws (``Trace_ELBO`` and the
    other ELBOs of NumPyro) would not learn the weights, and differentiating
    a draw with respect to the weights of a mixture of several components
    raises an error that says so. The objectives of this package learn the
    weights exactly through stratified expectations (:meth:`stratum`):
    :class:`~numpyro_pvi.StratifiedELBO` (the VI baseline),
    :class:`~numpyro_pvi.PredictiveELBO` and :class:`~numpyro_pvi.PACmELBO`.
    Drawing without a gradient (``sample_posterior``, ``Predictive``, the
    diagnostics) is unaffected. ``log_prob`` is the mixture density,
    computed with ``logsumexp``.

    :param logits: ``(K,)`` unnormalised log weights :math:`\log\bar\omega`.
    :param locs: ``(K, D)`` component means.
    :param scale_trils: ``(K, D, D)`` lower Cholesky factors.
    """

    arg_constraints = {
        "logits": constraints.real_vector,
        "locs": constraints.real_matrix,
        "scale_trils": constraints.lower_cholesky,
    }
    support = constraints.real_vector
    reparametrized_params = ["locs", "scale_trils"]
    pytree_data_fields = ("logits", "locs", "scale_trils")

    def __init__(
        self,
        logits: jax.Array,
        locs: jax.Array,
        scale_trils: jax.Array,
        *,
        validate_args: bool | None = None,
    ) -> None:
        self.logits = jax.nn.log_softmax(logits)
        self.locs = locs
        self.scale_trils = scale_trils
        super().__init__(
            batch_shape=(), event_shape=locs.shape[-1:], validate_args=validate_args
        )

    @property
    def num_components(self) -> int:
        return self.locs.shape[0]

    @property
    def has_rsample(self) -> bool:
        return True

    def _components(self) -> dist.MultivariateNormal:
        return dist.MultivariateNormal(self.locs, scale_tril=self.scale_trils)

    def sample(self, key: jax.Array, sample_shape: tuple[int, ...] = ()) -> jax.Array:
        key_z, key_eps = random.split(key)
        logits = self.logits
        if self.num_components > 1:
            logits = _refuse_weight_gradient(logits)
        z = random.categorical(key_z, stop_gradient(logits), shape=sample_shape)
        eps = random.normal(key_eps, sample_shape + self.event_shape)
        return component_draw(self.locs, self.scale_trils, z, eps)

    def log_prob(self, value: jax.Array) -> jax.Array:
        comp = self._components().log_prob(value[..., None, :])  # (..., K)
        return jax.nn.logsumexp(self.logits + comp, axis=-1)

    @property
    def mean(self) -> jax.Array:
        return jnp.einsum("k,kd->d", jnp.exp(self.logits), self.locs)

    def huber_entropy_bound(self) -> jax.Array:
        r"""The lower bound of Huber et al. (2008) on the entropy:

        .. math::

            H(\bar q) \ge -\sum_k \bar\omega_k \log \sum_l \bar\omega_l\,
            \mathcal{N}(\mu_k;\mu_l, \Sigma_k + \Sigma_l).
        """
        cov = self.scale_trils @ jnp.swapaxes(self.scale_trils, -1, -2)
        pair_cov = cov[:, None] + cov[None, :]  # (K, K, D, D)
        log_n = dist.MultivariateNormal(
            self.locs[None, :], covariance_matrix=pair_cov
        ).log_prob(self.locs[:, None, :])  # [k, l] = log N(mu_k; mu_l, S_k+S_l)
        inner = jax.nn.logsumexp(self.logits[None, :] + log_n, axis=-1)
        return -jnp.sum(jnp.exp(self.logits) * inner)

    def stratum(self, component: jax.Array) -> dist.Distribution:
        """The distribution of a stratified draw from ``component``.

        It samples from component ``component`` only; its ``log_prob`` is the
        mixture's, so that the weighted mean of the draws' log densities
        estimates :math:`\\mathbb{E}_{\\bar q}\\log\\bar q`.

        :param component: index of the component, an integer (may be traced).
        """
        return _ComponentDraw(self, component)


_WEIGHT_GRADIENT_ERROR = (
    "A gradient was taken through a draw of AutoGaussianMixture's mixture "
    "(GaussianMixture.sample) with respect to its weights. The draw picks its "
    "component by a discrete choice, so no gradient reaches the weights and an "
    "objective estimated from such draws (Trace_ELBO, TraceMeanField_ELBO, "
    "RenyiELBO, ...) does not learn them: the weights would random-walk. Fit the "
    "mixture with numpyro_pvi.StratifiedELBO (the stratified ELBO, the VI "
    "baseline), PredictiveELBO or PACmELBO, which take expectations per "
    "component; for diagnostics such as vsbc pass StratifiedELBO() as the loss."
)


@jax.custom_jvp
def _refuse_weight_gradient(logits: jax.Array) -> jax.Array:
    """The identity, whose derivative raises: marks the weights of a mixture
    draw, through which no gradient can be taken."""
    return logits


@partial(_refuse_weight_gradient.defjvp, symbolic_zeros=True)
def _refuse_weight_gradient_jvp(
    primals: tuple[jax.Array], tangents: tuple[Any]
) -> tuple[jax.Array, Any]:
    (tangent,) = tangents
    if not isinstance(tangent, jax.custom_derivatives.SymbolicZero):
        raise ValueError(_WEIGHT_GRADIENT_ERROR)
    return primals[0], tangent


def component_draw(
    locs: jax.Array, scale_trils: jax.Array, z: jax.Array, eps: jax.Array
) -> jax.Array:
    """``μ_z + L_z ε``, reparameterised within component(s) ``z``."""
    z = jnp.broadcast_to(z, eps.shape[:-1])
    return locs[z] + jnp.einsum("...ij,...j->...i", scale_trils[z], eps)


class _ComponentDraw(dist.Distribution):
    """A draw from one component of a :class:`GaussianMixture`, scored by the
    whole mixture. Built by :meth:`GaussianMixture.stratum`."""

    support = constraints.real_vector

    def __init__(self, mixture: GaussianMixture, component: jax.Array) -> None:
        self.mixture = mixture
        self.component = component
        super().__init__(batch_shape=(), event_shape=mixture.event_shape)

    @property
    def has_rsample(self) -> bool:
        return True

    def sample(self, key: jax.Array, sample_shape: tuple[int, ...] = ()) -> jax.Array:
        mix = self.mixture
        eps = random.normal(key, sample_shape + self.event_shape)
        return component_draw(mix.locs, mix.scale_trils, self.component, eps)

    def log_prob(self, value: jax.Array) -> jax.Array:
        return self.mixture.log_prob(value)
