"""What the objectives that evaluate the guide at fixed draws share.

:class:`~numpyro_pvi.SoftCVIELBO` and :class:`~numpyro_pvi.SNISForwardKL`
draw :math:`\\theta_1, \\dots, \\theta_K \\sim q_\\phi`, hold the draws fixed
and need, per draw, the unnormalised log posterior :math:`\\log p(\\theta_k,
x)`, the guide's log density :math:`\\log q_{\\mathrm{sg}(\\phi)}(\\theta_k)`
without gradient and :math:`\\log q_\\phi(\\theta_k)` with its gradient in
:math:`\\phi` only. :func:`fixed_draw_terms` gets the three from the shared
particle machinery in one vectorised pass; :func:`check_density_guide`
rejects guides without an evaluable density before anything is traced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.lax import stop_gradient
from numpyro.infer.autoguide import (
    AutoBNAFNormal,
    AutoDAIS,
    AutoDelta,
    AutoGuideList,
    AutoLaplaceApproximation,
    AutoSemiDAIS,
)
from numpyro.infer.elbo import ELBO

from numpyro_pvi._trace.data_plate import WHOLE_DATA
from numpyro_pvi._trace.numpyro_private import guide_parts
from numpyro_pvi._trace.particles import ParticleSpec, particle_terms
from numpyro_pvi._trace.reductions import log_joint
from numpyro_pvi._trace.terms import LOG_LIK, LOG_Q_FIXED, present

#: The guides whose log density can be evaluated at given points.
DENSITY_GUIDES = (
    "AutoNormal, AutoDiagonalNormal, AutoMultivariateNormal, "
    "AutoLowRankMultivariateNormal, AutoIAFNormal, numpyro_pvi.guides.AutoFlow, "
    "or a hand-written guide whose latent sites have log densities (discrete "
    "sites included)"
)

_WITHOUT_DENSITY: tuple[tuple[type, str], ...] = (
    (AutoBNAFNormal, "its block neural autoregressive flow has no inverse"),
    (AutoDelta, "it is a point mass with no density"),
    (AutoLaplaceApproximation, "it is a point mass (Delta) while it is fitted"),
    (AutoDAIS, "its density is not tractable"),
    (AutoSemiDAIS, "its density is not tractable"),
)


def check_density_guide(guide: Callable, objective: str) -> None:
    """Raise if ``guide`` cannot evaluate its log density at given points.

    Autoguides known to lack an evaluable density are rejected by type (also
    inside an :class:`~numpyro.infer.autoguide.AutoGuideList`); other guides
    are checked when they are traced.

    :param guide: the guide.
    :param objective: the objective's name, for the message.
    """
    for part in guide_parts(guide):
        if isinstance(part, AutoGuideList):
            check_density_guide(part, objective)
            continue
        for kind, reason in _WITHOUT_DENSITY:
            if isinstance(part, kind):
                raise ValueError(
                    f"{objective} evaluates the guide's log density at fixed draws, "
                    f"which {type(part).__name__} cannot do: {reason}. Use "
                    f"{DENSITY_GUIDES}."
                )


class FixedDraws(NamedTuple):
    """Per-draw quantities at ``K`` draws held fixed, each of shape ``(K,)``.

    :ivar log_joint: :math:`\\log p(\\theta_k, x)` (scaled as NumPyro scales
        sites), without gradient.
    :ivar log_q: :math:`\\log q_{\\mathrm{sg}(\\phi)}(\\theta_k)`, without
        gradient.
    :ivar log_q_phi: :math:`\\log q_\\phi(\\theta_k)` with the draws fixed:
        its gradient is :math:`\\nabla_\\phi \\log q_\\phi(\\theta_k)`.
    :ivar model_term: a scalar of value 0 whose gradient in the model's
        parameters :math:`\\psi` (``numpyro.param`` sites of the model) is
        :math:`\\sum_k \\tilde w_k \\nabla_\\psi \\log p_\\psi(\\theta_k, x)`,
        :math:`\\tilde w = \\operatorname{softmax}_k(\\log p - \\log q)`:
        the self-normalised importance-sampling estimate of
        :math:`\\nabla_\\psi \\log p_\\psi(x)` (the model update of
        reweighted wake-sleep). Subtracted from a loss, it fits the model's
        parameters by maximum marginal likelihood and changes nothing else.
    :ivar mutable_state: the ``numpyro.mutable`` sites after one trace
        (:attr:`~numpyro_pvi.particles.ParticleTerms.mutable_state`).
    """

    log_joint: jax.Array
    log_q: jax.Array
    log_q_phi: jax.Array
    model_term: jax.Array
    mutable_state: dict[str, Any] | None = None


def fixed_draw_terms(
    elbo: ELBO,
    rng_key: jax.Array,
    param_map: dict[str, jax.Array],
    model: Callable,
    guide: Callable,
    args: tuple,
    kwargs: dict[str, Any],
) -> FixedDraws:
    """Draw ``elbo.num_particles`` particles and evaluate them at fixed draws.

    The log joint is the log prior plus the log-likelihood of all observed
    sites (handler and subsample scales applied, so a subsampled plate gives
    an unbiased estimate of the full-data log joint).

    :param elbo: the calling objective (its ``num_particles`` and
        ``vectorize_particles_fn`` are used).
    :param rng_key: random key.
    :param param_map: current parameter values.
    :param model: the model.
    :param guide: the guide.
    :param args: positional arguments of model and guide.
    :param kwargs: keyword arguments of model and guide.
    :return: :class:`FixedDraws`.
    """
    name = type(elbo).__name__
    check_density_guide(guide, name)
    # an i.i.d. set of draws: the objectives are defined on one
    spec = ParticleSpec.of(
        elbo,
        (LOG_LIK, LOG_Q_FIXED),
        data_plate=WHOLE_DATA,
        objective=name,
        require_reparam=False,
        # a model without data is a target density: its log joint is its prior
        require_observed=False,
        fixed_observations=False,
        stratified=False,
    )
    terms = particle_terms(rng_key, param_map, model, guide, args, kwargs, spec)
    # the draws carry no gradient (require_reparam=False): the log joint's
    # is in the model's own parameters only
    joint = log_joint(terms)
    fixed_joint, log_q = stop_gradient(joint), stop_gradient(terms.log_q)
    weights = jax.nn.softmax(fixed_joint - log_q)
    # a zero weight (zero model density) leaves its draw out; NaN stays NaN
    model_term = jnp.sum(jnp.where(weights == 0, 0.0, weights * (joint - fixed_joint)))
    return FixedDraws(
        log_joint=fixed_joint,
        log_q=log_q,
        log_q_phi=present(terms.log_q_fixed, "log_q_fixed"),
        model_term=model_term,
        mutable_state=terms.mutable_state,
    )
