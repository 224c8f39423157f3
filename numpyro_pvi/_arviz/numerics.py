"""The ArviZ numerics the diagnostics reuse, on either generation.

Pareto smoothing of importance ratios, the length of the tail it fits,
PSIS-LOO of an approximate posterior and ArviZ's ``ELPDData`` objects, with
no container involved (the container adapter is
:mod:`~numpyro_pvi._arviz.containers`):

- :class:`ArviZ0Numerics`: ArviZ 0.2x (``arviz.psislw``);
- :class:`ArviZ1Numerics`: ArviZ ≥ 1.0 (arviz-stats).

:data:`NUMERICS` is the instance for the installed ArviZ.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import arviz as az
import numpy as np
import xarray as xr

from numpyro_pvi._arviz.containers import ADAPTER, ARVIZ_MAJOR, SAMPLE_DIMS
from numpyro_pvi._arviz.loo import approximate_loo_pointwise


class Numerics(Protocol):
    """What the diagnostics need from an ArviZ generation's numerics."""

    def psislw(self, log_ratio: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Pareto-smoothed log weights of ``(..., S)`` log ratios (normalised
        along the last axis) and k̂ ``(...)``, with relative efficiency 1
        (independent draws)."""

    def tail_length(self, num: int) -> int:
        """Draws in the Pareto-fitted tail of ``num`` independent draws."""

    def approximate_loo(
        self, data: Any, log_p: xr.DataArray, log_q: xr.DataArray, **options: Any
    ) -> Any:
        """PSIS-LOO corrected for the approximation (ArviZ's ``ELPDData``);
        ``options``: ``pointwise``, ``var_name``."""

    def elpd_fields(self, elpd: Any) -> dict[str, Any]:
        """``elpd``, ``se``, ``p``, ``good_k`` and the pointwise ``elpd_i``,
        ``pareto_k`` (DataArrays) of a pointwise ``ELPDData``."""

    def kfold_elpd(
        self, elpd_i: xr.DataArray, se: float, *, num_draws: int, num_folds: int
    ) -> Any:
        """ArviZ's ``ELPDData`` of a K-fold cross-validation: pointwise
        held-out log scores ``elpd_i`` and the standard error of their sum."""


class ArviZ0Numerics:
    """ArviZ 0.2x's numerics."""

    def psislw(self, log_ratio: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:func:`arviz.psislw` with ``reff=1``."""
        log_weight, k = az.psislw(np.array(log_ratio, copy=True), reff=1.0)
        return np.asarray(log_weight), np.asarray(k)

    def tail_length(self, num: int) -> int:
        """``ceil(min(S/5, 3√S))`` (``arviz.psislw``)."""
        return math.ceil(min(0.2 * num, 3 * math.sqrt(num)))

    def approximate_loo(
        self, data: Any, log_p: xr.DataArray, log_q: xr.DataArray, **options: Any
    ) -> Any:
        """The array core (ArviZ 0.2x has no such function) in ArviZ's
        ``ELPDData``, as :func:`arviz.loo` fills it."""
        from arviz.stats.stats_utils import ELPDData

        log_lik = _log_likelihood(
            ADAPTER.dataset(data, "log_likelihood"), options.get("var_name")
        )
        obs = log_lik.stack(__obs__=[d for d in log_lik.dims if d not in SAMPLE_DIMS])
        values = obs.transpose("__obs__", *SAMPLE_DIMS).values
        values = values.reshape(values.shape[0], -1)
        elpd_i, pareto_k, p_i = approximate_loo_pointwise(
            values, log_p.values.reshape(-1), log_q.values.reshape(-1), self.psislw
        )
        num_draws = values.shape[1]
        good_k = min(1 - 1 / np.log10(num_draws), 0.7)
        fields: dict[str, Any] = {
            "elpd_loo": float(elpd_i.sum()),
            "se": float(np.sqrt(elpd_i.size * np.var(elpd_i, dtype=float))),
            "p_loo": float(p_i.sum()),
            "n_samples": num_draws,
            "n_data_points": elpd_i.size,
            "warning": bool(np.any(pareto_k > good_k)),
        }
        if options.get("pointwise"):
            shape = log_lik.isel({d: 0 for d in SAMPLE_DIMS})
            fields["loo_i"] = shape.copy(data=elpd_i.reshape(shape.shape))
            fields["pareto_k"] = shape.copy(data=pareto_k.reshape(shape.shape))
        fields.update(scale="log", good_k=good_k, approx_posterior=True)
        return ELPDData(data=list(fields.values()), index=list(fields))

    def elpd_fields(self, elpd: Any) -> dict[str, Any]:
        """ArviZ 0.2x's ``elpd_loo``, ``p_loo``, ``loo_i``."""
        return {
            "elpd": float(elpd["elpd_loo"]),
            "se": float(elpd["se"]),
            "p": float(elpd["p_loo"]),
            "good_k": float(elpd["good_k"]),
            "elpd_i": elpd["loo_i"],
            "pareto_k": elpd["pareto_k"],
        }

    def kfold_elpd(
        self, elpd_i: xr.DataArray, se: float, *, num_draws: int, num_folds: int
    ) -> Any:
        """A pointwise ``ELPDData`` of the kind ``"loo"`` (the only kinds
        ArviZ 0.2x's ``compare`` accepts are ``"loo"`` and ``"waic"``; K-fold
        is leave-fold-out), without a Pareto k table: no importance
        sampling is involved."""
        from arviz.stats.stats_utils import ELPDData

        fields = {
            "elpd_loo": float(elpd_i.sum()),
            "se": float(se),
            "p_loo": float("nan"),
            "n_samples": int(num_draws),
            "n_data_points": int(elpd_i.size),
            "warning": False,
            "loo_i": elpd_i,
            "scale": "log",
        }
        return ELPDData(data=list(fields.values()), index=list(fields))


class ArviZ1Numerics:
    """ArviZ ≥ 1.0's numerics (arviz-stats)."""

    def psislw(self, log_ratio: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``arviz_stats``' PSIS, which smooths the *negated* input (it is
        written for log-likelihoods): the log ratios go in negated."""
        from arviz_stats.base import array_stats

        log_weight, k = array_stats.psislw(-np.asarray(log_ratio), r_eff=1.0)
        return np.asarray(log_weight), np.asarray(k)

    def tail_length(self, num: int) -> int:
        """``floor(3√S)`` above 225 draws, else ``floor(S/5)`` (arviz-stats)."""
        return math.floor(3 * math.sqrt(num) if num > 225 else num / 5)

    def approximate_loo(
        self, data: Any, log_p: xr.DataArray, log_q: xr.DataArray, **options: Any
    ) -> Any:
        """``arviz_stats.loo_approximate_posterior``."""
        from arviz_stats import loo_approximate_posterior

        with np.errstate(invalid="ignore"):  # 0 / 0 ratios: the export names them
            return loo_approximate_posterior(data, log_p, log_q, **options)

    def elpd_fields(self, elpd: Any) -> dict[str, Any]:
        """arviz-stats' ``elpd``, ``p``, ``elpd_i``."""
        return {
            "elpd": float(elpd.elpd),
            "se": float(elpd.se),
            "p": float(elpd.p),
            "good_k": float(elpd.good_k),
            "elpd_i": elpd.elpd_i,
            "pareto_k": elpd.pareto_k,
        }

    def kfold_elpd(
        self, elpd_i: xr.DataArray, se: float, *, num_draws: int, num_folds: int
    ) -> Any:
        """arviz-stats' ``ELPDDataLOOKFold``, as ``loo_kfold`` returns it."""
        from arviz_stats.utils import ELPDDataLOOKFold

        return ELPDDataLOOKFold(
            elpd=float(elpd_i.sum()),
            se=float(se),
            p=float("nan"),
            n_samples=int(num_draws),
            n_data_points=int(elpd_i.size),
            scale="log",
            warning=False,
            good_k=None,
            elpd_i=elpd_i,
            n_folds=int(num_folds),
        )


#: The numerics of the installed ArviZ.
NUMERICS: Numerics = ArviZ0Numerics() if ARVIZ_MAJOR == 0 else ArviZ1Numerics()


def _log_likelihood(group: xr.Dataset, var_name: str | None) -> xr.DataArray:
    """The pointwise log-likelihood variable ``var_name`` (the only one when
    ``None``) of a ``log_likelihood`` group."""
    names = list(group.data_vars)
    if var_name is None and len(names) == 1:
        return group[names[0]]
    if var_name not in names:
        raise ValueError(
            f"approximate_loo: var_name must be one of {names}, got {var_name!r}."
        )
    return group[var_name]
