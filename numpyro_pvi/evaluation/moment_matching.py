r"""Importance-weighted moment matching of a fitted guide's draws toward one
observation (Paananen et al. 2021).

At an observation far from the fit the weights :math:`h(\theta_s) =
p(y_i \mid \theta_s)` of :math:`\log \int h\, q` have a heavy tail. Affine
maps of the guide's unconstrained draws (shift, scale, then covariance) move
them toward :math:`q\, h`, each kept only when it lowers k̂; they compose into
:math:`T(u) = Au + b`. The final estimate is split (§3.3): half of ``S`` fresh
draws kept, half moved by :math:`T`, weighted against the mixture,

.. math::

    \log \frac1S \sum_s \frac{q(\theta_s)\, h(\theta_s)}
    {\tfrac12 q(\theta_s) + \tfrac12 g_T(\theta_s)},

unbiased for :math:`\int q h`, with weights at most :math:`2h`: a map fitted to
few effective draws cannot do worse than the plain estimate.

**References**

1. Paananen, T., Piironen, J., Bürkner, P.-C. & Vehtari, A. (2021).
   *Implicitly adaptive importance sampling*. Statistics and Computing 31, 16.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from scipy.special import logsumexp

from numpyro_pvi.evaluation.draws import compiled
from numpyro_pvi.evaluation.psis import log_mean_estimate, psis_smooth
from numpyro_pvi.evaluation.unconstrained_draws import (
    Unsupported,
    draw_unconstrained,
    evaluate_all,
    evaluate_sets,
)

#: Most accepted maps per observation.
MAX_STEPS = 30
#: Observations moved together (one wave of rounds).
WAVE = 8
#: Evaluations of the model at ``S`` draws (each costs as much as the plain
#: estimate of every observation) that one :meth:`MomentMatcher.match`
#: spends at most: a model computes all ``n`` observations at once, so
#: every attempt for one observation costs ``S · n`` likelihood terms.
BUDGET = 400

_smooth_rows = jax.jit(jax.vmap(psis_smooth))
_log_means = jax.jit(jax.vmap(log_mean_estimate))


class Matched(NamedTuple):
    """The re-estimated log score of one observation."""

    score: float
    se: float
    pareto_k: float
    steps: int  # accepted maps
    #: ``(S,)`` the centred smoothed weights of its draws, which every
    #: observation of one matcher shares draw by draw (the error of a sum of
    #: estimates)
    weights: np.ndarray | None = None


class _Affine(NamedTuple):
    """``u -> A u + b`` with ``A`` diagonal (``(D,)``) or full (``(D, D)``)."""

    scale: np.ndarray
    shift: np.ndarray
    log_det: float

    @classmethod
    def identity(cls, dim: int) -> _Affine:
        return cls(np.ones(dim), np.zeros(dim), 0.0)

    def __call__(self, u: np.ndarray) -> np.ndarray:
        if self.scale.ndim == 1:
            return u * self.scale + self.shift
        return u @ self.scale.T + self.shift

    def inverse(self, x: np.ndarray) -> np.ndarray:
        if self.scale.ndim == 1:
            return (x - self.shift) / self.scale
        return np.linalg.solve(self.scale, (x - self.shift).T).T

    def then(self, outer: _Affine) -> _Affine:
        """``outer ∘ self``."""
        if self.scale.ndim == 1 and outer.scale.ndim == 1:
            scale = outer.scale * self.scale
        else:
            a = np.diag(self.scale) if self.scale.ndim == 1 else self.scale
            scale = outer.scale[:, None] if outer.scale.ndim == 1 else outer.scale
            scale = scale * a if outer.scale.ndim == 1 else outer.scale @ a
        return _Affine(scale, outer(self.shift), self.log_det + outer.log_det)


def _shift(u: np.ndarray, w: np.ndarray) -> _Affine:
    return _Affine(np.ones(u.shape[1]), w @ u - u.mean(0), 0.0)


def _scale(u: np.ndarray, w: np.ndarray) -> _Affine:
    mean, mean_w = u.mean(0), w @ u
    ratio = np.sqrt((w @ np.square(u - mean_w)) / np.var(u, axis=0))
    return _Affine(ratio, mean_w - ratio * mean, float(np.sum(np.log(ratio))))


def _covariance(u: np.ndarray, w: np.ndarray) -> _Affine:
    num, dim = u.shape
    if num <= dim + 1:  # the draws' covariance is singular
        raise np.linalg.LinAlgError
    mean, mean_w = u.mean(0), w @ u
    centred = u - mean_w
    chol = np.linalg.cholesky(np.cov(u, rowvar=False).reshape(dim, dim))
    chol_w = np.linalg.cholesky((w[:, None] * centred).T @ centred)
    matrix = chol_w @ np.linalg.inv(chol)
    log_det = np.sum(np.log(np.diag(chol_w))) - np.sum(np.log(np.diag(chol)))
    return _Affine(matrix, mean_w - matrix @ mean, float(log_det))


_MAPS = (_shift, _scale, _covariance)


#: Elements of the ``(C·S, N)`` log-likelihood array of one evaluation.
_CHUNK = 1 << 24
#: Below this many elements per evaluation, every evaluation takes the same
#: number of sets (the last padded): one compiled program, where padding
#: costs far less than compiling another shape.
_PAD_FREE = 1 << 20


class _State(NamedTuple):
    """One observation's adaptation: the composite map ``T``, the moved
    draws ``T(u)`` with ``log g_T`` there, their log ratios ``log q h - log
    g_T`` and k̂."""

    map: _Affine
    u: np.ndarray
    log_g: np.ndarray
    log_ratio: np.ndarray
    k: float
    steps: int = 0
    stage: int = 0  # the next map to try: shift, scale, covariance


class MomentMatcher:
    """Moment matching of one fitted guide's draws toward observations of
    the data plate, all of them in rounds: each round tries one map per
    observation still moving, evaluated together in compiled calls (in
    chunks that bound the ``(chunk · S, n)`` log-likelihood of one call).
    Draws and evaluations are compiled once per model, guide and data
    shapes.

    :param rng_key: key of the draws.
    :param params: the fitted parameters.
    :param model: the model (full data).
    :param guide: the fitted guide.
    :param args: positional arguments of model and guide.
    :param kwargs: keyword arguments of model and guide.
    :param num_draws: ``S``.
    :param plate: the data plate's name (``None``: found as the particle
        machinery finds it).
    """

    def __init__(
        self,
        rng_key: jax.Array,
        params: dict[str, jax.Array],
        model: Callable,
        guide: Callable,
        args: tuple,
        kwargs: dict,
        *,
        num_draws: int,
        plate: str | None,
    ) -> None:
        options = dict(model=model, guide=guide, plate=plate)
        self._key, self._params = rng_key, params
        self._sets = compiled(evaluate_sets, args, kwargs, **options)
        draw = compiled(
            draw_unconstrained, args, kwargs, num_draws=num_draws, **options
        )
        evaluate = compiled(evaluate_all, args, kwargs, **options)
        u = draw(rng_key, params)
        log_q, log_lik = evaluate(rng_key, params, u)
        self._u = np.asarray(u, np.float64)
        self._log_q = np.asarray(log_q, np.float64)
        self._log_lik = np.asarray(log_lik, np.float64)
        per_set = num_draws * max(log_lik.shape[1], 1)
        self._chunk = max(1, _CHUNK // per_set)
        #: every evaluation pads to this many sets (``None``: to a power of two)
        self._sets_per_call = (
            min(self._chunk, WAVE) if WAVE * per_set <= _PAD_FREE else None
        )

    def _evaluate(
        self, u: np.ndarray, index: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(C, S)`` log q and log h at ``C`` sets of draws ``(C, S, D)``,
        chunks padded to one size where that is cheap, else to powers of two
        (one or few compiled shapes)."""
        out_q, out_h = [], []
        step = self._sets_per_call or self._chunk
        for start in range(0, len(index), step):
            u_part, i_part = u[start : start + step], index[start : start + step]
            num = len(i_part)
            size = self._sets_per_call or min(step, 1 << max(0, num - 1).bit_length())
            pad = size - num
            log_q, log_h = self._sets(
                self._key,
                self._params,
                jnp.asarray(
                    np.concatenate([u_part, np.repeat(u_part[-1:], pad, axis=0)]),
                    dtype=jnp.result_type(float),
                ),
                jnp.asarray(np.concatenate([i_part, np.repeat(i_part[-1:], pad)])),
            )
            out_q.append(np.asarray(log_q, np.float64)[:num])
            out_h.append(np.asarray(log_h, np.float64)[:num])
        return np.concatenate(out_q), np.concatenate(out_h)

    def match(
        self, indices: Sequence[int], threshold: float | Sequence[float]
    ) -> list[Matched | None]:
        """Move the draws toward each observation of ``indices`` (in that
        order, :data:`WAVE` at a time) until its k̂ is below ``threshold``
        (one for all, or one per observation) or
        no map lowers it, within :data:`BUDGET` evaluations; the estimate of
        an observation whose draws moved is the split estimate. ``None`` for
        the observations the budget did not reach."""
        order = np.asarray(indices, dtype=int)
        limits = np.broadcast_to(np.asarray(threshold, float), order.shape)
        out: list[Matched | None] = [None] * len(order)
        spent = 0
        for start in range(0, len(order), WAVE):
            if spent >= BUDGET:
                break
            wave = order[start : start + WAVE]
            limit = limits[start : start + WAVE]
            matched, cost = self._match_wave(wave, limit, BUDGET - spent)
            out[start : start + len(wave)] = matched
            spent += cost
        return out

    def _match_wave(
        self, indices: np.ndarray, threshold: np.ndarray, budget: int
    ) -> tuple[list[Matched], int]:
        first = self._log_lik[:, indices].T  # log q + log h - log g, g = q
        identity = _Affine.identity(self._u.shape[1])
        states = [
            _State(identity, self._u, self._log_q, ratio, k)
            for ratio, k in zip(first, _pareto_k(first), strict=True)
        ]
        spent = 0
        while spent < budget:
            cost = self._round(states, indices, threshold)
            if cost is None:
                break
            spent += cost
        ratios = [st.log_ratio for st in states]
        moved = [c for c, st in enumerate(states) if st.steps]
        for c, ratio in zip(moved, self._split(states, moved, indices), strict=True):
            ratios[c] = ratio
        rows = _padded(np.stack(ratios))
        score, se, k = (np.asarray(x, np.float64) for x in _log_means(rows))
        log_w, _ = _smooth_padded(np.stack(ratios))
        w = np.exp(log_w)
        centred = w - 1.0 / w.shape[1]
        matched = [
            Matched(float(score[c]), float(se[c]), float(k[c]), st.steps, centred[c])
            for c, st in enumerate(states)
        ]
        return matched, spent + 2 * len(moved)

    def _round(
        self, states: list[_State], indices: np.ndarray, threshold: np.ndarray
    ) -> int | None:
        """One map tried for every observation still moving (in place); the
        number of draw sets evaluated, ``None`` when none is moving."""
        moving = [
            c
            for c, st in enumerate(states)
            if st.k >= threshold[c] and st.steps < MAX_STEPS and st.stage < len(_MAPS)
        ]
        if not moving:
            return None
        tried = []
        log_ws, _ = _smooth_padded(np.stack([states[c].log_ratio for c in moving]))
        for c, log_w in zip(moving, log_ws, strict=True):
            step = _candidate(states[c], log_w)
            if step is None:  # not defined here: the next map
                states[c] = states[c]._replace(stage=states[c].stage + 1)
            else:
                tried.append((c, step))
        if tried:
            moved = np.stack([step(states[c].u) for c, step in tried])
            log_g = np.stack([states[c].log_g - step.log_det for c, step in tried])
            log_q, log_h = self._evaluate(moved, indices[[c for c, _ in tried]])
            ratios = log_q + log_h - log_g
            ks = _pareto_k(ratios)
            for j, (c, step) in enumerate(tried):
                st, k = states[c], ks[j]
                if _better(k, ratios[j], st.k, st.log_ratio):
                    # accepted: the next round starts from the shift
                    states[c] = _State(
                        st.map.then(step),
                        moved[j],
                        log_g[j],
                        ratios[j],
                        k,
                        st.steps + 1,
                    )
                else:
                    states[c] = st._replace(stage=st.stage + 1)
        return len(tried)

    def _split(
        self, states: list[_State], moved: list[int], indices: np.ndarray
    ) -> list[np.ndarray]:
        """The split log weights of the observations ``moved``: half of the
        fresh draws kept, half moved by the composite map, weighted against
        the even mixture of the guide and the moved proposal."""
        if not moved:
            return []
        half = self._u.shape[0] // 2
        points = np.stack(
            [
                np.concatenate([self._u[:half], states[c].map(self._u[half:])])
                for c in moved
            ]
        )
        pulled = np.stack(
            [states[c].map.inverse(p) for c, p in zip(moved, points, strict=True)]
        )
        log_q, log_h = self._evaluate(points, indices[moved])
        log_q_pulled, _ = self._evaluate(pulled, indices[moved])
        log_det = np.array([states[c].map.log_det for c in moved])[:, None]
        log_mixture = np.logaddexp(log_q, log_q_pulled - log_det) - math.log(2.0)
        return list(log_q + log_h - log_mixture)


def _candidate(state: _State, log_w: np.ndarray) -> _Affine | None:
    """The next map of ``state`` (for its moved draws and their smoothed log
    weights ``log_w``); ``None`` where it is not defined."""
    w = np.exp(np.asarray(log_w, np.float64))
    try:
        step = _MAPS[state.stage](state.u, w)
    except np.linalg.LinAlgError:  # too few effective draws
        return None
    finite = np.all(np.isfinite(step.scale)) and np.all(np.isfinite(step.shift))
    return step if finite and np.isfinite(step.log_det) else None


def _better(k: float, ratio: np.ndarray, old_k: float, old_ratio: np.ndarray) -> bool:
    """Whether moved draws are better than the current ones: a lower k̂;
    where neither set's weights have a mean (k̂ ≥ 1, e.g. one draw holding
    nearly all the weight: k̂ cannot see progress), a larger estimate: an
    importance-sampling estimate with such weights falls far short of the
    integral, and draws that find more of it are closer to the target."""
    if min(k, old_k) >= 1.0:
        return bool(logsumexp(ratio) > logsumexp(old_ratio))
    return bool(k < old_k)


def _padded(log_ratios: np.ndarray) -> jax.Array:
    """``(C, S)`` rows padded with copies of the last to :data:`WAVE` rows
    (more: the next power of two), so that the compiled row-wise functions
    see one shape per number of draws, whatever the wave's size (the rows
    are treated independently; read the first ``C``)."""
    num = log_ratios.shape[0]
    size = max(WAVE, 1 << max(0, num - 1).bit_length())
    pad = np.repeat(log_ratios[-1:], size - num, axis=0)
    return jnp.asarray(np.concatenate([log_ratios, pad]))


def _smooth_padded(log_ratios: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """PSIS-smoothed log weights ``(C, S)`` and k̂ ``(C,)`` of each row of
    ``(C, S)`` log ratios, in one call (:func:`_padded`)."""
    num = log_ratios.shape[0]
    log_w, k = _smooth_rows(_padded(log_ratios))
    return np.asarray(log_w, np.float64)[:num], np.asarray(k, np.float64)[:num]


def _pareto_k(log_ratios: np.ndarray) -> np.ndarray:
    """k̂ of each row of ``(C, S)`` log ratios."""
    return _smooth_padded(log_ratios)[1]


def moment_matcher(*args: Any, **kwargs: Any) -> MomentMatcher | str:
    """A :class:`MomentMatcher`, or the reason the guide cannot be matched."""
    try:
        return MomentMatcher(*args, **kwargs)
    except Unsupported as err:
        return str(err)
