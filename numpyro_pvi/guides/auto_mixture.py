"""The Gaussian-mixture autoguide of GM-PVI and VGM-PVI."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from jax import random
from numpyro.distributions import constraints
from numpyro.infer.autoguide import AutoContinuous
from numpyro.infer.initialization import init_to_uniform
from numpyro.primitives import Messenger

from numpyro_pvi._trace.reductions import log_mean_exp
from numpyro_pvi._trace.validation import check_int, check_real
from numpyro_pvi.distributions import simulators_without_density
from numpyro_pvi.guides.gaussian_mixture import GaussianMixture, component_draw

__all__ = ["AutoGaussianMixture"]

_ENTROPY = ("mc", "huber")


def _as_covariates(x: Any, name: str) -> jax.Array:
    try:
        arr = np.asarray(x, dtype=float)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a numeric array of shape (n, p).") from None
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ValueError(
            f"{name} must be a 2-D array of shape (n, p) with one row per "
            f"observation of the data plate, got shape {arr.shape}."
        )
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains non-finite values.")
    return jnp.asarray(arr)


class AutoGaussianMixture(AutoContinuous):
    r"""Gaussian-mixture guide over the unconstrained latent space (GM-PVI).

    .. math::

        q(\theta \mid x) = \sum_{k=1}^K \omega_k(x)\,
        \mathcal{N}(\theta;\mu_k, L_k L_k^\top), \qquad
        \omega_k(x_i) = \frac{\exp(x_i^\top\eta_k)}{\sum_l \exp(x_i^\top
        \eta_l)},\ \eta_1 = 0,

    with fixed weights :math:`\mathrm{softmax}(\alpha)`, or with
    ``gating_covariates`` :math:`X` (one row per observation; include a column of
    ones for intercepts) the weights of VGM-PVI. Sampling, ``log q`` and the
    regularizers use the averaged mixture :math:`\bar\omega_k = \frac1n\sum_i
    \omega_k(x_i)`; the predictive objectives use :math:`\omega_k(x_i)` with
    ``num_particles`` draws per component. Its ELBO fit is
    :class:`~numpyro_pvi.StratifiedELBO` (``Trace_ELBO`` cannot learn the
    weights, and refuses more than one component). Parameters
    (``prefix="auto"``): ``auto_locs`` ``(K, D)``, ``auto_scale_trils``
    ``(K, D, D)``, and ``auto_weight_logits`` ``(K,)`` or ``auto_gate_coefs``
    ``(K - 1, p)``.

    **Example**

    .. code-block:: python

        guide = AutoGaussianMixture(model, num_components=4, gating_covariates=X)
        loss = PredictiveELBO("log", num_particles=8, regularizer="posterior", lam=0.1)
        svi = SVI(model, guide, optax.adam(1e-2), loss=loss)

    :param model: the NumPyro model (global latents only).
    :param int num_components: :math:`K \ge 1`.
    :param gating_covariates: optional ``(n, p)`` covariates, in the order of
        the data plate.
    :param str prefix: prefix of the parameter names.
    :param init_loc_fn: initialisation of the latent values; the component
        means start there plus ``init_spread`` times standard normal noise.
    :param float init_scale: initial standard deviation of every component.
    :param float init_spread: spread of the initial component means.
    :param str entropy: the entropy of :math:`\bar q` in the stratified
        regularizers: ``"mc"`` (unbiased; default) or ``"huber"`` (the
        deterministic lower bound of Huber et al. 2008).

    **References**

    1. Kock, L., Sisson, S. A., Rodrigues, G. S. & Nott, D. J. *Predictive
       variational inference for flexible regression models*. arXiv:2602.22582.
    2. Huber, M. F., Bailey, T., Durrant-Whyte, H. & Hanebeck, U. D. (2008).
       *On entropy approximation for Gaussian mixture random vectors*. IEEE MFI.
    """

    scale_tril_constraint = constraints.scaled_unit_lower_cholesky

    def __init__(
        self,
        model: Callable,
        num_components: int = 2,
        *,
        gating_covariates: Any = None,
        prefix: str = "auto",
        init_loc_fn: Callable = init_to_uniform,
        init_scale: float = 0.1,
        init_spread: float = 1.0,
        entropy: str = "mc",
    ) -> None:
        where = "AutoGaussianMixture"
        num_components = check_int(num_components, "num_components", where, minimum=1)
        init_scale = check_real(init_scale, "init_scale", where, low=0, low_open=True)
        init_spread = check_real(init_spread, "init_spread", where, low=0)
        if entropy not in _ENTROPY:
            raise ValueError(
                f"AutoGaussianMixture: entropy must be one of {_ENTROPY}, got "
                f"{entropy!r}."
            )
        self.num_components = int(num_components)
        self.gating_covariates = (
            None
            if gating_covariates is None
            else _as_covariates(
                gating_covariates, "AutoGaussianMixture: gating_covariates"
            )
        )
        self.init_scale = float(init_scale)
        self.init_spread = float(init_spread)
        self.entropy = entropy
        super().__init__(model, prefix=prefix, init_loc_fn=init_loc_fn)

    # numpyro_pvi.particles.StratifiedGuide: one stratum per component
    @property
    def num_strata(self) -> int:
        """Number of strata (components) of stratified expectations."""
        return self.num_components

    def draw_stratum(self, fn: Callable, component: jax.Array) -> Callable:
        """``fn`` (this guide, seeded) drawing its latent vector from
        component ``component``, scored by the whole mixture."""
        return _draw_from_component(fn, component)

    def stratum_log_weights(
        self, params: dict[str, jax.Array]
    ) -> tuple[jax.Array, jax.Array | None]:
        """``(K,)`` log weights of the averaged mixture and ``(n, K)`` per
        observation of the data plate (``None`` without gating)."""
        if self.gating_covariates is None:
            return self.component_log_weights(params), None
        per_obs = self.component_log_weights(params)
        return _mean_log_weights(per_obs), per_obs

    def entropy_term(self, params: dict[str, jax.Array]) -> jax.Array | None:
        """The Huber et al. lower bound on the entropy of :math:`\\bar q`
        (``entropy="huber"``), else ``None`` (Monte Carlo)."""
        if self.entropy == "mc":
            return None
        return self.get_posterior(params).huber_entropy_bound()

    def _setup_prototype(self, *args: Any, **kwargs: Any) -> None:
        with simulators_without_density():  # likelihood-free models too
            super()._setup_prototype(*args, **kwargs)
        key = numpyro.prng_key()
        if key is None:
            key = random.PRNGKey(0)
        noise = random.normal(
            random.fold_in(key, 1), (self.num_components, self.latent_dim)
        )
        self._init_locs_k = self._init_latent[None, :] + self.init_spread * noise

    def _params(self) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array | None]:
        K, D = self.num_components, self.latent_dim
        locs = numpyro.param(f"{self.prefix}_locs", self._init_locs_k)
        scale_trils = numpyro.param(
            f"{self.prefix}_scale_trils",
            jnp.broadcast_to(jnp.identity(D) * self.init_scale, (K, D, D)),
            constraint=self.scale_tril_constraint,
        )
        if self.gating_covariates is None:
            logits = numpyro.param(f"{self.prefix}_weight_logits", jnp.zeros(K))
            return jax.nn.log_softmax(logits), locs, scale_trils, None
        per_obs = self._gate_log_weights(self.gating_covariates)
        return _mean_log_weights(per_obs), locs, scale_trils, per_obs

    def _gate_log_weights(self, x: jax.Array) -> jax.Array:
        """``log ω_k(x)`` for covariate rows ``x`` (..., p) → (..., K)."""
        K = self.num_components
        p = x.shape[-1]
        coefs = numpyro.param(f"{self.prefix}_gate_coefs", jnp.zeros((K - 1, p)))
        eta = jnp.concatenate([jnp.zeros((1, p)), coefs], axis=0)
        return jax.nn.log_softmax(x @ eta.T, axis=-1)

    def _get_posterior(self) -> GaussianMixture:
        log_w, locs, scale_trils, _ = self._params()
        return GaussianMixture(log_w, locs, scale_trils)

    def get_posterior(self, params: dict[str, jax.Array]) -> GaussianMixture:
        """The averaged mixture :math:`\\bar q` over the unconstrained latent
        vector at ``params``."""
        return numpyro.handlers.substitute(self._get_posterior, data=params)()

    def with_gating_covariates(self, gating_covariates: Any) -> AutoGaussianMixture:
        """The same guide (same parameters) for other observations.

        A covariate-dependent guide is tied to the rows of its
        ``gating_covariates``; to score held-out data with
        :func:`~numpyro_pvi.predictive_score` (or ``to_inference_data``), use
        the guide returned here with the fitted ``params``.

        :param gating_covariates: ``(m, p)`` covariates of the new observations.
        :return: a shallow copy of this guide with those covariates.
        """
        if self.gating_covariates is None:
            raise ValueError(
                "This AutoGaussianMixture has no gating_covariates: its weights "
                "do not depend on a covariate, use it as it is."
            )
        x = _as_covariates(gating_covariates, "gating_covariates")
        if x.shape[1] != self.gating_covariates.shape[1]:
            raise ValueError(
                f"gating_covariates must have {self.gating_covariates.shape[1]} "
                f"columns, got {x.shape[1]}."
            )
        new = copy.copy(self)
        new.gating_covariates = x
        return new

    def component_log_weights(
        self, params: dict[str, jax.Array], covariates: Any = None
    ) -> jax.Array:
        r"""Log mixture weights :math:`\log\omega_k(x)`.

        :param params: fitted parameters.
        :param covariates: ``(m, p)`` covariate rows (gated guides; default
            the training ``gating_covariates``), ignored without gating.
        :return: ``(m, K)`` for a gated guide, else ``(K,)``.
        """
        if self.gating_covariates is None:
            logits = params[f"{self.prefix}_weight_logits"]
            return jax.nn.log_softmax(logits)
        x = self.gating_covariates if covariates is None else jnp.asarray(covariates)
        if x.ndim != 2 or x.shape[1] != self.gating_covariates.shape[1]:
            raise ValueError(
                "covariates must have shape (m, "
                f"{self.gating_covariates.shape[1]}), got {x.shape}."
            )
        return numpyro.handlers.substitute(self._gate_log_weights, data=params)(x)

    def sample_posterior(
        self,
        rng_key: jax.Array,
        params: dict[str, jax.Array],
        *args: Any,
        sample_shape: tuple[int, ...] = (),
        gating_covariate: Any = None,
        **kwargs: Any,
    ) -> dict[str, jax.Array]:
        """Draws from the fitted guide, constrained to the model's supports.

        :param rng_key: random key.
        :param params: fitted parameters.
        :param sample_shape: leading shape of the draws.
        :param gating_covariate: for a gated guide, a covariate row ``(p,)``
            (draws from :math:`q(\\theta\\mid x)`) or rows ``(m, p)`` (one
            draw per row, batch dim ``m`` after ``sample_shape``); ``None``
            draws from the averaged mixture :math:`\\bar q`.
        :return: dict of site name to draws.
        """
        if gating_covariate is None:
            return super().sample_posterior(
                rng_key, params, *args, sample_shape=sample_shape, **kwargs
            )
        if self.gating_covariates is None:
            raise ValueError(
                "gating_covariate was given but this AutoGaussianMixture has no "
                "gating_covariates: its weights do not depend on a covariate."
            )
        x = jnp.asarray(gating_covariate, dtype=float)
        rows = x[None] if x.ndim == 1 else x
        log_w = self.component_log_weights(params, rows)  # (m, K)
        mix = self.get_posterior(params)
        key_z, key_eps = random.split(rng_key)
        shape = tuple(sample_shape) + log_w.shape[:1]
        z = random.categorical(key_z, log_w, shape=shape)
        eps = random.normal(key_eps, shape + (self.latent_dim,))
        latent = component_draw(mix.locs, mix.scale_trils, z, eps)
        if x.ndim == 1:
            latent = latent[..., 0, :]
        return self._unpack_and_constrain(latent, params)

    def median(self, params: dict[str, jax.Array]) -> dict[str, jax.Array]:
        raise NotImplementedError(
            "AutoGaussianMixture has no closed-form median; use "
            "sample_posterior and summarise the draws."
        )

    def quantiles(self, params: dict[str, jax.Array], quantiles: Any) -> Any:
        raise NotImplementedError(
            "AutoGaussianMixture has no closed-form quantiles; use "
            "sample_posterior and summarise the draws."
        )


def _mean_log_weights(per_obs: jax.Array) -> jax.Array:
    """``log((1/n) Σ_i ω_k(x_i))`` from ``(n, K)`` log weights."""
    return log_mean_exp(per_obs, axis=0)


class _draw_from_component(Messenger):
    """Makes the mixture site of the guide draw from component ``k``."""

    def __init__(self, fn: Callable, component: jax.Array) -> None:
        self.component = component
        super().__init__(fn)

    def process_message(self, msg: dict[str, Any]) -> None:
        if msg["type"] == "sample" and isinstance(msg["fn"], GaussianMixture):
            msg["fn"] = msg["fn"].stratum(self.component)
