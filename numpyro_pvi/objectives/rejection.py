r"""The rejection-sampling gradient of the log score (Lai & Yao 2024, app. B).

:math:`\nabla_\phi \log q_\phi(y_i) = \mathbb{E}_{q_\phi(\theta \mid y_i)}
[\nabla_\phi \log q_\phi(\theta)]`, with :math:`q_\phi(\theta \mid y_i)
\propto q_\phi(\theta)\, p(y_i \mid \theta)` drawn by rejection. An
observation without an acceptance among the step's ``M`` particles gets
further rounds (a ``lax.while_loop``, gradient stopped) rather than being
dropped, which would bias the estimate toward the observations the guide
already predicts; only one still without an acceptance after ``max_rounds``
contributes zero, which :class:`RejectionStats` reports.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax, random
from jax.lax import stop_gradient

from numpyro_pvi._trace.particles import ParticleSpec, particle_terms
from numpyro_pvi._trace.terms import GUIDE_DRAWS, LOG_LIK, ParticleTerms, present
from numpyro_pvi._trace.tracing import guide_log_density, seed_plates
from numpyro_pvi._trace.validation import check_int, check_real


class RejectionStats(NamedTuple):
    """How the rejection estimator of one step went.

    :ivar accepted_first: fraction of the observations with an acceptance
        among the ``M`` particles of the step.
    :ivar rounds: number of further rounds of ``M`` draws that were needed.
    :ivar unaccepted: fraction of the observations still without an
        acceptance after ``max_rounds`` further rounds (they contribute no
        gradient: the only bias of the estimator).
    """

    accepted_first: jax.Array
    rounds: jax.Array
    unaccepted: jax.Array


def _accepts(key: jax.Array, log_lik: jax.Array, log_bound: float) -> jax.Array:
    """``(M, b)`` acceptance of each draw for each observation."""
    log_t = jnp.log(random.uniform(key, log_lik.shape, dtype=log_lik.dtype))
    return stop_gradient(log_t < log_lik - log_bound)


def rejection_options(
    name: str,
    score: object,
    log_score: bool,
    likelihood_bound: float | None,
    max_rounds: int | None,
) -> tuple[float, int]:
    """The checked ``likelihood_bound`` and ``max_rounds`` (default 1000)
    of an objective ``name`` that estimates the gradient of its ``score``
    by rejection (``log_score``: whether that is the log score)."""
    if not log_score:
        raise ValueError(
            f"{name}: log_score_estimator='rejection' estimates the gradient of "
            f"the log score only, not of {score!r}."
        )
    if likelihood_bound is None:
        raise ValueError(
            f"{name}: log_score_estimator='rejection' needs likelihood_bound=C > "
            "0 with p(y_i | theta) <= C for every observation and theta."
        )
    bound = check_real(
        likelihood_bound, "likelihood_bound", name, low=0.0, low_open=True
    )
    rounds = check_int(
        1000 if max_rounds is None else max_rounds, "max_rounds", name, minimum=0
    )
    return bound, rounds


def round_functions(
    spec: ParticleSpec,
    param_map: dict[str, jax.Array],
    model: Callable,
    guide: Callable,
    args: tuple,
    kwargs: dict,
    plate_key: jax.Array,
) -> tuple[Callable, Callable]:
    """``draw_round`` and ``log_q_at`` of :func:`rejection_score_function`
    for particles of ``spec`` (requesting ``log_lik`` and ``guide_draws``,
    no reparameterisation): fresh draws with the parameters' gradient
    stopped on the step's subsample (``plate_key``), and the guide's log
    density at one particle's draws with its gradient."""

    def draw_round(key: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
        more = particle_terms(
            key,
            stop_gradient(param_map),
            model,
            guide,
            args,
            kwargs,
            spec,
            plate_key=plate_key,
        )
        draws = present(more.guide_draws, "guide_draws")
        return present(more.log_lik, "log_lik"), draws

    seeded_guide = seed_plates(guide, plate_key)

    def log_q_at(draws: dict[str, Any], key: jax.Array) -> jax.Array:
        return guide_log_density(seeded_guide, param_map, draws, key, args, kwargs)

    return draw_round, log_q_at


def rejection_estimate(
    rng_key: jax.Array,
    objective: Any,
    terms: ParticleTerms,
    plate_key: jax.Array,
    param_map: dict[str, jax.Array],
    model: Callable,
    guide: Callable,
    args: tuple,
    kwargs: dict,
) -> tuple[jax.Array, RejectionStats]:
    """``(b,)`` surrogate of the rejection estimator for ``objective`` (a
    ``PredictiveELBO`` with ``log_score_estimator="rejection"``: its
    ``likelihood_bound``, ``max_rounds`` and ``data_plate``) at the step's
    ``terms`` (requesting ``log_lik`` and ``log_q_fixed``), its further
    rounds on the step's subsample (``plate_key``), and its statistics."""
    spec = ParticleSpec.of(
        objective,
        (LOG_LIK, GUIDE_DRAWS),
        data_plate=objective.data_plate,
        require_reparam=False,
    )
    draw_round, log_q_at = round_functions(
        spec, param_map, model, guide, args, kwargs, plate_key
    )
    return rejection_score_function(
        rng_key,
        present(terms.log_lik, "log_lik"),
        present(terms.log_q_fixed, "log_q_fixed"),
        log_bound=math.log(objective.likelihood_bound),
        max_rounds=objective.max_rounds,
        draw_round=draw_round,
        log_q_at=log_q_at,
    )


def rejection_score_function(
    rng_key: jax.Array,
    log_lik: jax.Array,
    log_q_fixed: jax.Array,
    *,
    log_bound: float,
    max_rounds: int,
    draw_round: Callable[[jax.Array], tuple[jax.Array, dict[str, jax.Array]]],
    log_q_at: Callable[[dict[str, jax.Array], jax.Array], jax.Array],
) -> tuple[jax.Array, RejectionStats]:
    """Per-observation surrogate whose gradient is the rejection estimator.

    :param rng_key: random key.
    :param log_lik: ``(M, b)`` unscaled log-likelihood of the step's particles.
    :param log_q_fixed: ``(M,)`` ``log q_φ`` at those particles, draws fixed.
    :param log_bound: :math:`\\log C`.
    :param max_rounds: the largest number of further rounds.
    :param draw_round: ``key -> (log_lik (M, b), guide draws {site: (M, ...)})``
        for ``M`` fresh draws with the parameters' gradient stopped and the
        same subsample.
    :param log_q_at: ``(guide draws of one particle, key) -> log q_φ`` with
        its gradient in the parameters.
    :return: ``(b,)`` surrogate values (their gradient is the estimate of
        :math:`\\nabla_\\phi \\log q_\\phi(y_i)`) and :class:`RejectionStats`.
    """
    first_key, rounds_key, density_key = random.split(rng_key, 3)
    accepted = _accepts(first_key, log_lik, log_bound)
    count = jnp.sum(accepted, axis=0)
    first = jnp.sum(accepted * log_q_fixed[:, None], axis=0) / jnp.maximum(count, 1)
    pending = count == 0
    found, draws, rounds = _further_rounds(
        rounds_key, pending, log_bound, max_rounds, draw_round
    )
    num_obs = pending.shape[0]

    def later(draws: dict[str, jax.Array]) -> jax.Array:
        keys = random.split(density_key, num_obs)
        return jax.vmap(log_q_at)(draws, keys)

    extra = lax.cond(
        jnp.any(found), later, lambda d: jnp.zeros(num_obs, log_lik.dtype), draws
    )
    surrogate = jnp.where(pending, jnp.where(found, extra, 0.0), first)
    stats = RejectionStats(
        accepted_first=jnp.mean(~pending),
        rounds=rounds,
        unaccepted=jnp.mean(pending & ~found),
    )
    return surrogate, stats


def _further_rounds(
    key: jax.Array,
    pending: jax.Array,
    log_bound: float,
    max_rounds: int,
    draw_round: Callable[[jax.Array], tuple[jax.Array, dict[str, jax.Array]]],
) -> tuple[jax.Array, dict[str, jax.Array], jax.Array]:
    """Rounds of ``M`` draws until every pending observation has one accepted
    draw: ``(found (b,), accepted draw per observation {site: (b, ...)},
    number of rounds)``."""
    num_obs = pending.shape[0]
    shapes = jax.eval_shape(draw_round, key)[1]
    empty = jax.tree.map(lambda s: jnp.zeros((num_obs,) + s.shape[1:], s.dtype), shapes)

    def cond(carry: tuple) -> jax.Array:
        _, found, _, rounds = carry
        return jnp.any(pending & ~found) & (rounds < max_rounds)

    def body(carry: tuple) -> tuple:
        key, found, kept, rounds = carry
        key, draw_key, accept_key = random.split(key, 3)
        log_lik, draws = draw_round(draw_key)
        accepted = _accepts(accept_key, log_lik, log_bound)  # (M, b)
        hit = jnp.any(accepted, axis=0) & pending & ~found
        first = jnp.argmax(accepted, axis=0)  # first accepted draw per observation

        def update(old: jax.Array, new: jax.Array) -> jax.Array:
            chosen = new[first]  # (b, ...)
            mask = jnp.reshape(hit, (num_obs,) + (1,) * (chosen.ndim - 1))
            return jnp.where(mask, chosen, old)

        kept = jax.tree.map(update, kept, draws)
        return key, found | hit, kept, rounds + 1

    init = (key, jnp.zeros_like(pending), empty, jnp.zeros((), jnp.int32))
    _, found, kept, rounds = lax.while_loop(cond, body, init)
    return found, jax.tree.map(stop_gradient, kept), rounds


def check_no_model_params(
    model: Callable, args: tuple, kwargs: dict, objective: str
) -> None:
    """Refuse a model with parameters of its own (``numpyro.param`` sites)
    under the rejection estimator with a regularizer: the draws are then
    reparameterised, the log score's gradient is replaced by the
    estimator's, which is the guide's only, and the model's parameters would
    not be fitted by the data."""
    from numpyro.handlers import seed, trace

    from numpyro_pvi._trace.structure import feasible_improper

    tr = trace(seed(feasible_improper(model), 0)).get_trace(*args, **kwargs)
    names = [name for name, site in tr.items() if site["type"] == "param"]
    if names:
        raise ValueError(
            f"{objective}: log_score_estimator='rejection' with a regularizer "
            f"fits the guide only, and the model has parameters of its own "
            f"({', '.join(repr(n) for n in names)}) that the data would not fit. "
            "Use regularizer=None (the draws are then held fixed and the model's "
            "parameters follow the log score), log_score_estimator='reparam', "
            "or make them latent sites."
        )
