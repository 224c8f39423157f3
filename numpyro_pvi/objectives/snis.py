"""Self-normalised importance-sampling forward KL (the SoftCVI baseline)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.lax import stop_gradient
from numpyro.infer.elbo import ELBO

from numpyro_pvi._trace.validation import check_bool, check_int
from numpyro_pvi.objectives.contrastive import fixed_draw_terms

__all__ = ["SNISForwardKL"]


class SNISForwardKL(ELBO):
    r"""Forward KL :math:`\mathrm{KL}(p(\theta \mid x)\,\|\,q_\phi)` by
    self-normalised importance sampling (Jerfel et al. 2021), the baseline of
    [2, §5.1].

    With :math:`\theta_1, \dots, \theta_K \sim q_\phi` held fixed and
    :math:`\tilde w = \operatorname{softmax}_k\big(\log p(\theta_k, x) - \log
    q_{\mathrm{sg}(\phi)}(\theta_k)\big)` (no gradient through the weights),

    .. math::

        \mathcal{L}(\phi) = \sum_{k=1}^K \tilde w_k \big(\log p(\theta_k, x)
        - \log q_\phi(\theta_k)\big),

    the forward KL up to :math:`\log p(x)`. ``low_variance=True`` adds the
    control variate :math:`\frac1K\sum_k \log q_\phi(\theta_k) - \mathrm{sg}(\cdot)`,
    so the gradient :math:`-\sum_k (\tilde w_k - 1/K)\nabla_\phi \log
    q_\phi(\theta_k)` vanishes at the optimum (that of
    :class:`~numpyro_pvi.SoftCVIELBO` with :math:`\alpha = 1`). Guides and the
    model's own parameters as for :class:`~numpyro_pvi.SoftCVIELBO`.

    :param int num_particles: the number :math:`K \ge 2` of importance draws.
    :param bool low_variance: add the control variate.
    :param vectorize_particles: ``True`` (``vmap``), ``False`` (``lax.map``)
        or a callable ``fn(f, keys)``, as for :class:`~numpyro.infer.elbo.ELBO`.

    **References**

    1. Jerfel, G., Wang, S., Wong-Fannjiang, C., Heller, K. A., Ma, Y. &
       Jordan, M. I. (2021). *Variational refinement for importance sampling
       using the forward Kullback-Leibler divergence*. UAI 2021.
    2. Ward, D., Beaumont, M. A. & Fasiolo, M. (2024). *SoftCVI: Contrastive
       variational inference with self-generated soft labels*.
       arXiv:2407.15687.
    """

    #: Whether the optimum is the Bayesian posterior (read by diagnostics:
    #: PSIS k̂ of a fit that does not target it measures a chosen distance).
    targets_posterior: bool = True

    #: discrete latent sites need only their log density, no reparameterisation
    can_infer_discrete = True

    def __init__(
        self,
        num_particles: int = 8,
        *,
        low_variance: bool = False,
        vectorize_particles: bool | Callable = True,
    ) -> None:
        name = type(self).__name__
        num_particles = check_int(num_particles, "num_particles", name, minimum=2)
        self.low_variance = check_bool(low_variance, "low_variance", name)
        super().__init__(
            num_particles=num_particles, vectorize_particles=vectorize_particles
        )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_particles={self.num_particles}, "
            f"low_variance={self.low_variance})"
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
        weights = jax.nn.softmax(draws.log_joint - draws.log_q)
        # a zero weight times a -inf log density is 0; a NaN weight is NaN
        loss = jnp.sum(
            jnp.where(weights == 0, 0.0, weights * (draws.log_joint - draws.log_q_phi))
        )
        if self.low_variance:
            mean_log_q = jnp.mean(draws.log_q_phi)
            loss = loss + mean_log_q - stop_gradient(mean_log_q)
        return {"loss": loss - draws.model_term, "mutable_state": draws.mutable_state}
