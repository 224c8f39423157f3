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

    Fitting the guide becomes a classification with soft labels (Algorithm 1
    of [1]). Draw :math:`\theta_1, \dots, \theta_K \sim q_\phi`, held fixed; with
    a negative distribution :math:`p^-`,

    .. math::

        y = \operatorname{softmax}_k\big(\log p(\theta_k, x) -
        \log p^-(\theta_k)\big), \qquad
        \hat z_k = \log q_\phi(\theta_k) - \log p^-(\theta_k),

    .. math::

        \mathcal{L}(\phi) = -\sum_{k=1}^K y_k \log
        \operatorname{softmax}(\hat z)_k,

    with no gradient through the labels; the gradient is exactly zero when
    :math:`q_\phi` is the posterior ([1], appendix A). ``negative="proposal"``
    uses :math:`p^- = q_{\mathrm{sg}(\phi)}^\alpha`, ``negative="posterior"``
    :math:`p^- = p(\theta, x)^\alpha` (draws of zero model density are left out).
    :math:`\alpha = 1` with the proposal gives the gradient of the low-variance
    self-normalised forward KL (:class:`~numpyro_pvi.SNISForwardKL`); smaller
    :math:`\alpha` spreads the guide over more of the posterior mass.

    The guide needs a density at given points (AutoNormal, the multivariate
    normals, AutoIAFNormal, :class:`~numpyro_pvi.guides.AutoFlow`, hand-written
    guides; AutoBNAFNormal and AutoDelta are refused) and may have discrete
    sites. With a subsampled plate the log joint is unbiased but the labels,
    a nonlinear function of it, are biased. The labels are self-normalised
    importance weights: from an initial guide far from the posterior one draw
    takes all the mass and the fit can stall; start from a short ELBO fit
    (``svi.run(..., init_params=params)``).
    The model's own ``numpyro.param`` sites are fitted by maximum marginal
    likelihood, as in reweighted wake-sleep [2].

    **Example**

    .. code-block:: python

        svi = SVI(model, AutoMultivariateNormal(model), optax.adam(1e-2),
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
