"""SoftCVI: contrastive variational inference with self-generated soft labels."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from numpyro.infer.elbo import ELBO

from numpyro_pvi._trace.validation import check_int, check_real
from numpyro_pvi.objectives.contrastive import fixed_draw_terms

__all__ = ["SoftCVIELBO"]

_NEGATIVES = ("proposal", "posterior")


class SoftCVIELBO(ELBO):
    r"""Soft contrastive variational inference (Ward, Beaumont & Fasiolo 2024).

    Fitting the guide becomes a classification problem with soft labels
    (Algorithm 1 of [1]). Draw :math:`\theta_1, \dots, \theta_K \sim q_\phi`
    and hold them fixed (no reparameterisation). With a *negative*
    distribution :math:`p^-`, the labels and the classifier's logits are

    .. math::

        y = \operatorname{softmax}_k\big(\log p(\theta_k, x) -
        \log p^-(\theta_k)\big), \qquad
        \hat z_k = \log q_\phi(\theta_k) - \log p^-(\theta_k),

    with no gradient through the labels, and the loss is the softmax
    cross-entropy

    .. math::

        \mathcal{L}(\phi) = -\sum_{k=1}^K y_k \log
        \operatorname{softmax}(\hat z)_k .

    ``negative="proposal"`` uses :math:`p^- = q_{\mathrm{sg}(\phi)}^\alpha`
    (the guide with stopped gradient, tempered), ``negative="posterior"``
    the tempered unnormalised posterior :math:`p^- = p(\theta, x)^\alpha`
    (draws with zero model density are then left out of the contrast). A
    NaN anywhere in the terms (a likelihood that fails at some draw) gives
    a NaN loss, which SVI's losses show. The
    gradient

    .. math::

        \nabla_\phi \mathcal{L} = -\sum_k \big(y_k -
        \operatorname{softmax}(\hat z)_k\big)\, \nabla_\phi
        \log q_\phi(\theta_k)

    is exactly zero when :math:`q_\phi` is the posterior, for any draws
    ([1], appendix A). :math:`\alpha = 1` with the proposal negative gives
    the gradient of the low-variance self-normalised forward KL
    (:class:`~numpyro_pvi.SNISForwardKL` with ``low_variance=True``);
    smaller :math:`\alpha` flattens the labels and spreads the fitted guide
    over more of the posterior mass.

    Only :math:`\log q_\phi` at given points is needed, so the guide may
    have discrete latent sites. It must have an evaluable density: AutoNormal,
    AutoDiagonalNormal, AutoMultivariateNormal, AutoLowRankMultivariateNormal,
    AutoIAFNormal, :class:`~numpyro_pvi.guides.AutoFlow` (a spline flow whose
    density costs one pass, the flexible choice for multimodal posteriors) or
    a hand-written guide; AutoBNAFNormal (no inverse) and
    AutoDelta (no density) are rejected. With a subsampled plate the log
    joint is its unbiased estimate but the labels, a nonlinear function of
    it, are biased.

    **Where to start.** The labels are the draws' self-normalised importance
    weights: when every draw of the initial guide lies far from the
    posterior, one draw takes nearly all the label mass, the gradient pulls
    the guide toward that draw, and the fit can stall short of the
    posterior. A spline flow fitted to a three-dimensional Normal posterior
    ten posterior standard deviations from its initial location reached it
    from 3 of 10 random initialisations in 2000 steps, and from all 10
    after 300 steps of ``Trace_ELBO``:
    start SoftCVI from a short ELBO fit, ``svi.run(..., init_params=params)``.

    The model's own parameters (``numpyro.param`` sites in the model) are
    fitted by maximum marginal likelihood, as in reweighted wake-sleep [2]:
    their gradient is the self-normalised importance-sampling estimate
    :math:`-\sum_k \tilde w_k \nabla_\psi \log p_\psi(\theta_k, x)`,
    :math:`\tilde w = \operatorname{softmax}_k(\log p(\theta_k, x) - \log
    q(\theta_k))`, added to the gradient with the loss value unchanged.

    **Example**

    .. code-block:: python

        from numpyro.infer import SVI
        from numpyro.infer.autoguide import AutoMultivariateNormal
        from numpyro_pvi import SoftCVIELBO

        guide = AutoMultivariateNormal(model)
        svi = SVI(model, guide, optax.adam(1e-2),
                  loss=SoftCVIELBO(num_particles=8, alpha=0.75))

    :param int num_particles: the number :math:`K \ge 2` of draws (classes).
    :param float alpha: tempering :math:`\alpha \in [0, 1]` of the negative
        distribution.
    :param str negative: ``"proposal"`` (default) or ``"posterior"``.
    :param vectorize_particles: ``True`` (``vmap``), ``False`` (``lax.map``)
        or a callable ``fn(f, keys)``, as for :class:`~numpyro.infer.elbo.ELBO`.

    **References**

    1. Ward, D., Beaumont, M. A. & Fasiolo, M. (2024). *SoftCVI: Contrastive
       variational inference with self-generated soft labels*.
       arXiv:2407.15687.
    2. Bornschein, J. & Bengio, Y. (2015). *Reweighted wake-sleep*. ICLR.
    """

    #: Whether the optimum is the Bayesian posterior (read by diagnostics:
    #: PSIS k̂ of a fit that does not target it measures a chosen distance).
    targets_posterior: bool = True

    #: discrete latent sites need only their log density, no reparameterisation
    can_infer_discrete = True

    def __init__(
        self,
        num_particles: int = 8,
        alpha: float = 0.75,
        *,
        negative: str = "proposal",
        vectorize_particles: bool | Callable = True,
    ) -> None:
        name = type(self).__name__
        num_particles = check_int(num_particles, "num_particles", name, minimum=2)
        self.alpha = check_real(alpha, "alpha", name, low=0.0, high=1.0)
        if negative not in _NEGATIVES:
            raise ValueError(
                f"{name}: negative must be one of {_NEGATIVES}, got {negative!r}."
            )
        self.negative = negative
        super().__init__(
            num_particles=num_particles, vectorize_particles=vectorize_particles
        )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_particles={self.num_particles}, "
            f"alpha={self.alpha:g}, negative={self.negative!r})"
        )

    def loss_with_mutable_state(
        self,
        rng_key: jax.Array,
        param_map: dict[str, jax.Array],
        model: Callable,
        guide: Callable,
        *args: Any,
        **kwargs: Any,
    ) -> dict[str, Any]:
        draws = fixed_draw_terms(self, rng_key, param_map, model, guide, args, kwargs)
        log_joint, alpha = draws.log_joint, self.alpha
        if self.negative == "proposal":
            log_negative = alpha * draws.log_q
            label_logits = log_joint - log_negative
            logits = draws.log_q_phi - log_negative
        else:
            # zero model density (-inf) leaves the contrast; NaN stays NaN
            zero = log_joint == -jnp.inf
            log_negative = alpha * jnp.where(zero, 0.0, log_joint)
            label_logits = jnp.where(zero, -jnp.inf, log_joint - log_negative)
            logits = jnp.where(zero, -jnp.inf, draws.log_q_phi - log_negative)
        labels = jax.nn.softmax(label_logits)
        log_probs = jax.nn.log_softmax(logits)
        # a zero label times a -inf log probability is 0; a NaN label is NaN
        loss = -jnp.sum(jnp.where(labels == 0, 0.0, labels * log_probs))
        return {"loss": loss - draws.model_term, "mutable_state": draws.mutable_state}
