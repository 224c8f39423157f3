"""The exact symmetry test of VSBC and its multiplicity corrections.

For each scalar component, the counts of posterior draws below the true
value give :math:`p_r`; under the null of a calibrated (unbiased) method
:math:`p` is symmetric around 1/2. The test statistic is the reflection walk
of the signs of :math:`p_r - 1/2`, with exact p values from the distribution
of Rademacher sums (ties on the draw grid handled exactly).

**References**

1. Yao, Y., Vehtari, A., Simpson, D. & Gelman, A. (2018). *Yes, but did it
   work?: Evaluating variational inference.* ICML (VSBC, the symmetry of p).
2. Holm, S. (1979). *A simple sequentially rejective multiple test
   procedure.* Scandinavian Journal of Statistics 6, 65-70.
3. Benjamini, Y. & Hochberg, Y. (1995). *Controlling the false discovery
   rate.* JRSS B 57, 289-300.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
from scipy import stats

__all__ = [
    "adjust_p_values",
    "holm",
    "reflection_tail",
    "reflection_walk",
    "symmetry_test",
]


def holm(p_values: np.ndarray) -> np.ndarray:
    """Holm (1979) step-down adjusted p-values.

    :param p_values: ``(m,)`` p-values.
    :return: ``(m,)`` adjusted p-values (at most 1).
    """
    p = np.asarray(p_values, dtype=float)
    m = p.size
    order = np.argsort(p, kind="stable")
    adjusted = np.maximum.accumulate((m - np.arange(m)) * p[order])
    out = np.empty(m)
    out[order] = np.minimum(adjusted, 1.0)
    return out


def adjust_p_values(p_values: np.ndarray, correction: str | None) -> np.ndarray:
    """Multiplicity-corrected p-values: Holm, Benjamini–Hochberg or none.

    :param p_values: ``(m,)`` p-values.
    :param correction: ``"holm"``, ``"bh"`` or ``None``.
    :return: ``(m,)`` corrected p-values.
    """
    p = np.asarray(p_values, dtype=float)
    if correction is None or p.size == 0:
        return p.copy()
    if correction == "holm":
        return holm(p)
    return stats.false_discovery_control(p, method="bh")


def reflection_walk(below: np.ndarray, num_draws: int) -> tuple[np.ndarray, list]:
    r"""The KS difference process of ``p`` against ``1 - p`` as a signed walk.

    With ``p_i = below_i / L``, ``a_i = |2 below_i - L|`` and ``s_i`` the sign
    of ``p_i - 1/2``, the difference of the ECDFs at ``t < 1/2`` is
    :math:`F_p(t) - F_{1-p}(t) = -\frac1R \sum_{i: a_i \ge (1-2t)L} s_i`
    (and the same sums, with strict inequalities, at ``t ≥ 1/2``): its values
    are the partial sums ``T_k`` of the signs grouped by tied magnitude, from
    the largest magnitude down. Returns ``T`` (with ``T_0 = 0``) and the group
    sizes.
    """
    centred = 2 * np.asarray(below, dtype=np.int64) - num_draws
    keep = centred != 0
    magnitude, sign = np.abs(centred[keep]), np.sign(centred[keep])
    levels, group = np.unique(-magnitude, return_inverse=True)  # descending
    sums = np.bincount(group, weights=sign, minlength=levels.size)
    sizes = np.bincount(group, minlength=levels.size)
    return np.concatenate([[0.0], np.cumsum(sums)]), sizes.tolist()


@functools.lru_cache(maxsize=256)
def _rademacher_sum_pmf(m: int) -> np.ndarray:
    """pmf of a sum of ``m`` Rademacher signs on ``-m, ..., m`` (odd offsets 0)."""
    pmf = np.zeros(2 * m + 1)
    pmf[::2] = stats.binom.pmf(np.arange(m + 1), m, 0.5)
    return pmf


def reflection_tail(sizes: Sequence[int], level: int, *, two_sided: bool) -> float:
    """Exact ``P(max_k |T_k| ≥ level)`` (or ``P(max_k T_k ≥ level)``) under symmetry.

    Under the null that ``p`` is symmetric about 1/2 the signs are
    independent fair coin flips given the magnitudes, so ``T_k`` is a walk
    whose ``g``-th step is a sum of ``sizes[g]`` Rademacher variables. The
    probability of reaching the barrier is propagated exactly over the states
    ``T ∈ [-n, n]`` with the barrier absorbing.
    """
    if level <= 0:
        return 1.0
    n = int(sum(sizes))
    state = np.zeros(2 * n + 1)
    state[n] = 1.0
    values = np.arange(-n, n + 1)
    barrier = np.abs(values) >= level if two_sided else values >= level
    absorbed = 0.0
    for m in sizes:
        state = np.convolve(state, _rademacher_sum_pmf(m))[m : m + 2 * n + 1]
        absorbed += state[barrier].sum()
        state[barrier] = 0.0
    return float(min(absorbed, 1.0))


def symmetry_test(
    below: np.ndarray, num_draws: int, correction: str | None, alpha: float
) -> dict[str, np.ndarray]:
    """KS tests of ``p`` against ``1 - p`` for each column of ``below`` (R, C).

    ``p = below / num_draws``. The statistic is the two-sample KS statistic
    of ``p`` against ``1 - p`` (Yao et al. 2018); its p-values are exact
    under the null that ``p`` is symmetric about 1/2 (conditional on
    ``|p - 1/2|``): the two-sample KS distribution assumes independent
    samples, which ``p`` and ``1 - p`` are not, and rejects a symmetric ``p``
    more often than its level (for 40 uniform ``p`` at level 5%: 7.6% with
    SciPy's default, exact, p-value and 11.9% with the asymptotic one, over
    20 000 repetitions). The two-sided p-value is corrected for multiplicity over the
    columns; a column whose corrected p-value is below ``alpha`` gets the
    direction of the one-sided test with the smaller p-value: ``"over"``
    when the ECDF of ``p`` rises above that of ``1 - p`` (``p`` piles up near
    0: q overestimates θ), ``"under"`` when it falls below.
    """
    num, cols = below.shape
    out = {k: np.empty(cols) for k in ("ks", "two", "over", "under")}
    for j in range(cols):
        walk, sizes = reflection_walk(below[:, j], num_draws)
        over, under = int(max(0.0, -walk.min())), int(max(0.0, walk.max()))
        out["ks"][j] = max(over, under) / num
        out["two"][j] = reflection_tail(sizes, max(over, under), two_sided=True)
        out["over"][j] = reflection_tail(sizes, over, two_sided=False)
        out["under"][j] = reflection_tail(sizes, under, two_sided=False)
    adjusted = adjust_p_values(out["two"], correction)
    direction = np.where(
        adjusted >= alpha, "ok", np.where(out["over"] <= out["under"], "over", "under")
    )
    return {
        "ks_statistic": out["ks"],
        "p_value": out["two"],
        "p_value_adjusted": adjusted,
        "p_value_over": out["over"],
        "p_value_under": out["under"],
        "direction": direction.astype(str),
    }
