r"""Gaussian-mixture guides for predictive variational inference (GM-PVI).

:class:`AutoGaussianMixture` is a NumPyro autoguide whose approximation of
the posterior over the unconstrained latent space is a mixture of ``K``
full-covariance Gaussians, optionally with weights that depend on a
covariate of each observation (VGM-PVI). The predictive objectives
(:class:`~numpyro_pvi.PredictiveELBO` and :class:`~numpyro_pvi.PACmELBO`)
recognise it and compute their expectations *stratified* by component:
``M`` reparameterised draws from every component and the weights entering
exactly,

.. math::

    q(y_i \mid x_i) \approx \sum_{k=1}^K \omega_k(x_i)\,
    \frac{1}{M}\sum_{m=1}^M p(y_i \mid \theta_{k,m}),
    \qquad \theta_{k,m} \sim \mathcal{N}(\mu_k, \Sigma_k),

so that gradients reach the weights, the gating coefficients, the means and
the covariances. For models whose likelihood depends on the parameters
through a linear predictor, :func:`linear_predictor_score` computes the same
predictive with Gauss--Hermite quadrature (in closed form for a Gaussian
likelihood), and :func:`fit_gm_pvi` runs SVI with the component pruning
heuristic of Kock et al.

**References**

1. Kock, L., Sisson, S. A., Rodrigues, G. S. & Nott, D. J. *Predictive
   variational inference for flexible regression models*. arXiv:2602.22582.
2. Huber, M. F., Bailey, T., Durrant-Whyte, H. & Hanebeck, U. D. (2008). *On
   entropy approximation for Gaussian mixture random vectors*. IEEE MFI.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax import random
from jax.lax import stop_gradient
from numpyro.distributions import constraints
from numpyro.infer import SVI
from numpyro.infer.autoguide import AutoContinuous
from numpyro.infer.initialization import init_to_uniform

__all__ = [
    "AutoGaussianMixture",
    "GaussianMixture",
    "PrunedFit",
    "fit_gm_pvi",
    "linear_predictor_score",
    "prune_components",
]

_ENTROPY = ("mc", "huber")


# --------------------------------------------------------------------------
# the mixture distribution over the unconstrained latent vector
# --------------------------------------------------------------------------


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
    :param component_log_weights: optional ``(n, K)`` per-observation log
        weights :math:`\log\omega_k(x_i)` of a covariate-dependent mixture
        (their average over ``i`` gives ``logits``), read by the particle
        machinery; ``None`` when the weights do not depend on covariates.
    :param str entropy: ``"mc"`` or ``"huber"``, how a stratified draw
        reports its log density (see :meth:`stratum`).
    """

    arg_constraints = {
        "logits": constraints.real_vector,
        "locs": constraints.real_matrix,
        "scale_trils": constraints.lower_cholesky,
    }
    support = constraints.real_vector
    reparametrized_params = ["locs", "scale_trils"]
    pytree_data_fields = ("logits", "locs", "scale_trils", "component_log_weights")
    pytree_aux_fields = ("entropy",)

    def __init__(
        self,
        logits: jax.Array,
        locs: jax.Array,
        scale_trils: jax.Array,
        *,
        component_log_weights: jax.Array | None = None,
        entropy: str = "mc",
        validate_args: bool | None = None,
    ) -> None:
        self.logits = jax.nn.log_softmax(logits)
        self.locs = locs
        self.scale_trils = scale_trils
        self.component_log_weights = component_log_weights
        self.entropy = entropy
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
        return _component_draw(self.locs, self.scale_trils, z, eps)

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

    def stratum(self, component: jax.Array) -> _ComponentDraw:
        """The distribution of a stratified draw from ``component``.

        It samples from component ``component`` only; its ``log_prob`` is the
        mixture's (``entropy="mc"``), or minus the Huber entropy bound
        (``entropy="huber"``), so that the weighted mean of the draws' log
        densities estimates (or bounds) :math:`\\mathbb{E}_{\\bar q}\\log\\bar q`.

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


def _component_draw(
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

    @property
    def stratum_log_weights(self) -> jax.Array:
        """``(K,)`` log weights of the averaged mixture."""
        return self.mixture.logits

    @property
    def observation_log_weights(self) -> jax.Array | None:
        """``(n, K)`` per-observation log weights, or ``None``."""
        return self.mixture.component_log_weights

    def sample(self, key: jax.Array, sample_shape: tuple[int, ...] = ()) -> jax.Array:
        mix = self.mixture
        eps = random.normal(key, sample_shape + self.event_shape)
        return _component_draw(mix.locs, mix.scale_trils, self.component, eps)

    def log_prob(self, value: jax.Array) -> jax.Array:
        if self.mixture.entropy == "huber":
            const = -self.mixture.huber_entropy_bound()
            return jnp.broadcast_to(const, jnp.shape(value)[:-1])
        return self.mixture.log_prob(value)


# --------------------------------------------------------------------------
# the autoguide
# --------------------------------------------------------------------------


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
        \mathcal{N}(\theta;\mu_k, L_k L_k^\top),

    with :math:`K` full-covariance components (Cholesky-parameterised) and
    weights :math:`\omega = \mathrm{softmax}(\alpha)` that are the same for
    every observation, or, with ``gating_covariates`` :math:`X \in
    \mathbb{R}^{n\times p}` aligned with the data plate, the
    covariate-dependent weights of VGM-PVI

    .. math::

        \omega_k(x_i) = \frac{\exp(x_i^\top\eta_k)}{\sum_l \exp(x_i^\top
        \eta_l)}, \qquad \eta_1 = 0

    (include a column of ones in :math:`X` for intercepts). The guide's
    density over :math:`\theta` — the one that sampling, ``log q`` and the
    regularizers use — is the averaged mixture :math:`\bar q` with
    :math:`\bar\omega_k = \frac1n\sum_i \omega_k(x_i)`; the predictive
    objectives of this package use the per-observation weights
    :math:`\omega_k(x_i)` and stratified expectations (``num_particles``
    draws *per component*). The VI (ELBO) fit of this guide is
    :class:`~numpyro_pvi.StratifiedELBO`: NumPyro's
    :class:`~numpyro.infer.Trace_ELBO` differentiates through draws whose
    component is a discrete choice, so it cannot learn the weights, and with
    more than one component it stops at its first step with an error that
    points to :class:`~numpyro_pvi.StratifiedELBO`.

    Parameters (with ``prefix="auto"``): ``auto_locs`` ``(K, D)``,
    ``auto_scale_trils`` ``(K, D, D)``, and ``auto_weight_logits`` ``(K,)`` or,
    with covariates, ``auto_gate_coefs`` ``(K - 1, p)`` (:math:`\eta_2..\eta_K`).

    **Example**

    .. code-block:: python

        from numpyro_pvi import PredictiveELBO
        from numpyro_pvi.guides import AutoGaussianMixture

        guide = AutoGaussianMixture(model, num_components=4, gating_covariates=X)
        loss = PredictiveELBO("log", num_particles=8, regularizer="posterior",
                              lam=0.1)
        svi = SVI(model, guide, optax.adam(1e-2), loss=loss)

    :param model: the NumPyro model (global latents only, as for every
        :class:`~numpyro.infer.autoguide.AutoContinuous` guide).
    :param int num_components: :math:`K \ge 1`.
    :param gating_covariates: optional ``(n, p)`` covariates, one row per
        observation of the data plate (in the order of the plate).
    :param str prefix: prefix of the parameter names.
    :param init_loc_fn: initialisation of the latent values, as for other
        autoguides; the component means start at it plus
        ``init_spread`` times standard normal noise (fixed seed), so that the
        components differ.
    :param float init_scale: initial standard deviation of every component.
    :param float init_spread: spread of the initial component means.
    :param str entropy: the entropy of :math:`\bar q` in the stratified
        regularizers: ``"mc"`` (Monte Carlo, unbiased; default) or ``"huber"``
        (the lower bound of Huber et al. 2008, deterministic; the regularizer
        then is an upper bound of the KL divergence).

    **References**

    1. Kock, L., Sisson, S. A., Rodrigues, G. S. & Nott, D. J. *Predictive
       variational inference for flexible regression models*.
    2. Huber, M. F., Bailey, T., Durrant-Whyte, H. & Hanebeck, U. D. (2008).
       *On entropy approximation for Gaussian mixture random vectors*.
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
        if (
            isinstance(num_components, bool)
            or not isinstance(num_components, (int, np.integer))
            or num_components < 1
        ):
            raise ValueError(
                "AutoGaussianMixture: num_components must be an integer >= 1, "
                f"got {num_components!r}."
            )
        for name, val, strict in (
            ("init_scale", init_scale, True),
            ("init_spread", init_spread, False),
        ):
            try:
                val = float(val)
            except (TypeError, ValueError):
                raise TypeError(
                    f"AutoGaussianMixture: {name} must be a number, got {val!r}."
                ) from None
            if not math.isfinite(val) or val < 0 or (strict and val == 0):
                raise ValueError(
                    f"AutoGaussianMixture: {name} must be finite and "
                    f"{'> 0' if strict else '>= 0'}, got {val!r}."
                )
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
        self._init_scale = float(init_scale)
        self._init_spread = float(init_spread)
        self.entropy = entropy
        super().__init__(model, prefix=prefix, init_loc_fn=init_loc_fn)

    # the stratification protocol read by numpyro_pvi._particles
    @property
    def num_strata(self) -> int:
        """Number of strata (components) of stratified expectations."""
        return self.num_components

    def _setup_prototype(self, *args: Any, **kwargs: Any) -> None:
        super()._setup_prototype(*args, **kwargs)
        key = numpyro.prng_key()
        if key is None:
            key = random.PRNGKey(0)
        noise = random.normal(
            random.fold_in(key, 1), (self.num_components, self.latent_dim)
        )
        self._init_locs_k = self._init_latent[None, :] + self._init_spread * noise

    def _params(self) -> tuple[jax.Array, jax.Array, jax.Array | None, jax.Array]:
        K, D = self.num_components, self.latent_dim
        locs = numpyro.param(f"{self.prefix}_locs", self._init_locs_k)
        scale_trils = numpyro.param(
            f"{self.prefix}_scale_trils",
            jnp.broadcast_to(jnp.identity(D) * self._init_scale, (K, D, D)),
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
        p = self.gating_covariates.shape[1]
        coefs = numpyro.param(f"{self.prefix}_gate_coefs", jnp.zeros((K - 1, p)))
        eta = jnp.concatenate([jnp.zeros((1, p)), coefs], axis=0)
        return jax.nn.log_softmax(x @ eta.T, axis=-1)

    def _get_posterior(self) -> GaussianMixture:
        log_w, locs, scale_trils, per_obs = self._params()
        return GaussianMixture(
            log_w,
            locs,
            scale_trils,
            component_log_weights=per_obs,
            entropy=self.entropy,
        )

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
        latent = _component_draw(mix.locs, mix.scale_trils, z, eps)
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
    return jax.nn.logsumexp(per_obs, axis=0) - math.log(per_obs.shape[0])


# --------------------------------------------------------------------------
# Gauss--Hermite predictive for linear-predictor models
# --------------------------------------------------------------------------


def _bernoulli_logit(eta: jax.Array, y: jax.Array) -> jax.Array:
    return -jax.nn.softplus(jnp.where(y > 0, -eta, eta))


def _poisson_log(eta: jax.Array, y: jax.Array) -> jax.Array:
    return y * eta - jnp.exp(eta) - jax.scipy.special.gammaln(y + 1.0)


_LIKELIHOODS: dict[str, Callable] = {
    "bernoulli": _bernoulli_logit,
    "poisson": _poisson_log,
}


def _site_indices(guide: AutoGaussianMixture, site: str | None) -> np.ndarray:
    """Positions of ``site``'s entries in the guide's latent vector."""
    if guide.prototype_trace is None:
        raise ValueError(
            "The guide has not been initialised: fit it (or call SVI.init) first."
        )
    latent = guide._unpack_latent(jnp.arange(guide.latent_dim, dtype=float))
    if site is None:
        if len(latent) != 1:
            raise ValueError(
                f"The model has several latent sites {sorted(latent)}: name the "
                "one holding the regression coefficients with site=..."
            )
        (site,) = latent
    if site not in latent:
        raise ValueError(
            f"site={site!r} is not a latent site of the model; its latent sites "
            f"are {sorted(latent)}."
        )
    support = guide.prototype_trace[site]["fn"].support
    if support not in (constraints.real, constraints.real_vector):
        raise ValueError(
            f"The linear predictor needs the coefficients '{site}' on the real "
            f"line (unconstrained), but their support is {support}."
        )
    return np.asarray(latent[site], dtype=int).reshape(-1)


def linear_predictor_score(
    guide: AutoGaussianMixture,
    params: dict[str, jax.Array],
    design: Any,
    y: Any,
    *,
    likelihood: str | Callable = "gaussian",
    site: str | None = None,
    noise_scale: float | None = None,
    num_nodes: int = 32,
    gating_covariates: Any = None,
) -> jax.Array:
    r"""Log predictive density of a GM-PVI fit by quadrature (eqs. 9, 11, 13).

    For a model whose likelihood depends on the coefficients :math:`\beta`
    only through the linear predictor :math:`\eta_i = x_i^\top\beta`, every
    Gaussian component of the guide induces a Gaussian
    :math:`\eta_i \sim \mathcal{N}(m_{ik}, s_{ik}^2)` with
    :math:`m_{ik} = x_i^\top\mu_k` and :math:`s_{ik}^2 = x_i^\top\Sigma_k
    x_i`, so the predictive is a one-dimensional integral per component:

    .. math::

        q(y_i \mid x_i) = \sum_{k=1}^K \omega_k(x_i) \int p(y_i \mid \eta)\,
        \mathcal{N}(\eta; m_{ik}, s_{ik}^2)\, d\eta
        \approx \sum_k \omega_k(x_i) \sum_{b=1}^B \frac{w_b}{\sqrt\pi}\,
        p\big(y_i \mid m_{ik} + \sqrt2\, s_{ik} t_b\big),

    with the :math:`B`-point Gauss--Hermite nodes :math:`t_b` and weights
    :math:`w_b`. For ``likelihood="gaussian"`` with known noise scale
    :math:`\sigma` the integral is exact:
    :math:`\mathcal{N}(y_i; m_{ik}, \sigma^2 + s_{ik}^2)`. The result is
    differentiable in ``params``.

    :param guide: a fitted :class:`AutoGaussianMixture`.
    :param params: its parameters.
    :param design: ``(n, p)`` rows :math:`x_i` of the linear predictor.
    :param y: ``(n,)`` observations.
    :param likelihood: ``"gaussian"`` (needs ``noise_scale``),
        ``"bernoulli"`` (logit link), ``"poisson"`` (log link), or a callable
        ``log_lik(eta, y)`` evaluated elementwise.
    :param site: the latent site holding :math:`\beta` (a real vector of
        length ``p``); may be omitted when it is the model's only latent
        site. Other latent sites are marginalised by the Gaussian components
        and must not enter the likelihood.
    :param noise_scale: :math:`\sigma` of the Gaussian likelihood.
    :param int num_nodes: :math:`B`, the number of quadrature nodes.
    :param gating_covariates: ``(n, p_g)`` gating covariates of these
        observations for a covariate-dependent guide (default: the guide's
        training covariates, which must then be aligned with ``design``).
    :return: ``(n,)`` per-observation log predictive densities.

    **References**

    1. Kock, L., Sisson, S. A., Rodrigues, G. S. & Nott, D. J. *Predictive
       variational inference for flexible regression models*, eqs. 9, 11, 13.
    """
    x = jnp.asarray(design, dtype=float)
    y = jnp.asarray(y)
    if x.ndim != 2 or y.shape != x.shape[:1]:
        raise ValueError(
            f"design must be (n, p) and y (n,), got {x.shape} and {y.shape}."
        )
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise ValueError(f"num_nodes must be an integer >= 1, got {num_nodes!r}.")
    if isinstance(likelihood, str) and likelihood not in (*_LIKELIHOODS, "gaussian"):
        raise ValueError(
            f"likelihood must be 'gaussian', {', '.join(map(repr, _LIKELIHOODS))} "
            f"or a callable log_lik(eta, y), got {likelihood!r}."
        )
    if likelihood == "gaussian" and (noise_scale is None or not noise_scale > 0):
        raise ValueError(
            "likelihood='gaussian' needs noise_scale > 0 (the known sigma of the "
            f"Gaussian likelihood), got {noise_scale!r}."
        )
    idx = _site_indices(guide, site)
    if idx.size != x.shape[1]:
        raise ValueError(
            f"design has {x.shape[1]} columns but the coefficients have "
            f"{idx.size} entries."
        )
    mix = guide.get_posterior(params)
    locs = mix.locs[:, idx]  # (K, p)
    trils = mix.scale_trils[:, idx, :]  # rows of L: Sigma[idx, idx] = L_idx L_idx^T
    mean = x @ locs.T  # (n, K)
    sd = jnp.linalg.norm(jnp.einsum("np,kpd->nkd", x, trils), axis=-1)  # (n, K)
    if likelihood == "gaussian":
        comp = dist.Normal(mean, jnp.sqrt(noise_scale**2 + sd**2)).log_prob(y[:, None])
    else:
        log_lik = _LIKELIHOODS.get(likelihood, likelihood)
        nodes, weights = np.polynomial.hermite.hermgauss(num_nodes)
        eta = mean[..., None] + math.sqrt(2.0) * sd[..., None] * jnp.asarray(nodes)
        log_w = jnp.log(jnp.asarray(weights)) - 0.5 * math.log(math.pi)
        comp = jax.nn.logsumexp(log_w + log_lik(eta, y[:, None, None]), axis=-1)
    if guide.gating_covariates is None:
        log_omega = mix.logits  # (K,)
    else:
        rows = (
            guide.gating_covariates if gating_covariates is None else gating_covariates
        )
        log_omega = guide.component_log_weights(params, rows)
        if log_omega.shape[0] != x.shape[0]:
            raise ValueError(
                f"gating covariates have {log_omega.shape[0]} rows but design has "
                f"{x.shape[0]}: pass gating_covariates=... for these observations."
            )
    return jax.nn.logsumexp(log_omega + comp, axis=-1)


# --------------------------------------------------------------------------
# component pruning
# --------------------------------------------------------------------------


class PrunedFit(NamedTuple):
    """Result of :func:`fit_gm_pvi`.

    :ivar guide: the guide with the surviving components.
    :ivar params: its fitted parameters.
    :ivar num_components: the surviving :math:`K`.
    :ivar losses: the loss at every step.
    :ivar history: :math:`K` after every block of ``prune_every`` steps.
    """

    guide: AutoGaussianMixture
    params: dict[str, jax.Array]
    num_components: int
    losses: jax.Array
    history: list[int]


@partial(
    jax.jit, static_argnames=("model", "guide", "num_particles", "with_likelihood")
)
def _strata_log_weights(
    rng_key: jax.Array,
    model: Callable,
    guide: AutoGaussianMixture,
    params: dict[str, jax.Array],
    args: tuple,
    kwargs: dict,
    num_particles: int,
    with_likelihood: bool,
) -> jax.Array:
    """``(K, b)`` log ω_k(x_i), plus log p̂_k(y_i) when ``with_likelihood``."""
    from numpyro_pvi._particles import LOG_LIK, particle_terms

    terms = particle_terms(
        rng_key,
        params,
        model,
        guide,
        args,
        kwargs,
        num_particles=num_particles,
        vectorize_particles_fn=lambda f, xs: jax.vmap(f)(xs),
        requests=(LOG_LIK,) if with_likelihood else (),
        objective="prune_components",
        require_reparam=False,
        stratify=True,
    )
    k = guide.num_components
    log_w = jnp.reshape(terms.log_w, (k, num_particles, -1))  # w = ω_k(x_i) / M
    if not with_likelihood:
        return log_w[:, 0, :] + math.log(num_particles)
    log_lik = jnp.reshape(terms.log_lik, (k, num_particles, -1))
    return jax.nn.logsumexp(log_w + log_lik, axis=1)  # log ω_k p̂_k(y_i)


def prune_components(
    rng_key: jax.Array,
    model: Callable,
    guide: AutoGaussianMixture,
    params: dict[str, jax.Array],
    *args: Any,
    criterion: str = "auto",
    num_particles: int = 64,
    **kwargs: Any,
) -> tuple[AutoGaussianMixture, dict[str, jax.Array], np.ndarray]:
    r"""Remove the components that are never the most probable for any
    observation (the pruning heuristic of Kock et al.).

    Component :math:`k` survives if it is :math:`\arg\max_l a_{il}` for at
    least one observation :math:`i` of the data plate, with
    :math:`a_{il} = \omega_l(x_i)` (``criterion="weight"``, the gating
    weights; the default for a covariate-dependent guide) or the
    responsibility :math:`a_{il} \propto \omega_l(x_i)\, \hat p_l(y_i)`
    with :math:`\hat p_l(y_i) = \frac1M\sum_m p(y_i\mid\theta_{l,m})`
    (``criterion="responsibility"``, the default for covariate-independent
    weights, whose argmax would otherwise be the same component for every
    observation). The surviving weights are renormalised (gating
    coefficients re-anchored so that :math:`\eta_1 = 0`).

    :param rng_key: random key (for the responsibilities).
    :param model: the model.
    :param guide: a fitted :class:`AutoGaussianMixture`.
    :param params: its parameters.
    :param args: model arguments (the training data).
    :param str criterion: ``"auto"``, ``"weight"`` or ``"responsibility"``.
    :param int num_particles: draws per component for :math:`\hat p_l`.
    :param kwargs: model keyword arguments.
    :return: ``(new_guide, new_params, kept)`` with ``kept`` the indices of
        the surviving components.
    """
    if criterion == "auto":
        criterion = "responsibility" if guide.gating_covariates is None else "weight"
    if criterion not in ("weight", "responsibility"):
        raise ValueError(
            "criterion must be 'auto', 'weight' or 'responsibility', got "
            f"{criterion!r}."
        )
    scores = _strata_log_weights(
        rng_key,
        model,
        guide,
        params,
        args,
        kwargs,
        num_particles,
        criterion == "responsibility",
    )
    winners = np.asarray(jnp.argmax(scores, axis=0))
    kept = np.unique(winners)
    if kept.size == guide.num_components:
        return guide, params, kept
    return (*_subset_guide(guide, params, kept), kept)


def _subset_guide(
    guide: AutoGaussianMixture, params: dict[str, jax.Array], kept: np.ndarray
) -> tuple[AutoGaussianMixture, dict[str, jax.Array]]:
    p = guide.prefix
    new_params = dict(params)
    new_params[f"{p}_locs"] = params[f"{p}_locs"][kept]
    new_params[f"{p}_scale_trils"] = params[f"{p}_scale_trils"][kept]
    if guide.gating_covariates is None:
        new_params[f"{p}_weight_logits"] = params[f"{p}_weight_logits"][kept]
    else:
        coefs = params[f"{p}_gate_coefs"]
        eta = jnp.concatenate([jnp.zeros((1, coefs.shape[1])), coefs])[kept]
        eta = eta - eta[:1]
        if kept.size > 1:
            new_params[f"{p}_gate_coefs"] = eta[1:]
        else:
            new_params.pop(f"{p}_gate_coefs")
    new_guide = AutoGaussianMixture(
        guide.model,
        int(kept.size),
        gating_covariates=guide.gating_covariates,
        prefix=p,
        init_loc_fn=guide.init_loc_fn,
        init_scale=guide._init_scale,
        init_spread=guide._init_spread,
        entropy=guide.entropy,
    )
    return new_guide, new_params


def fit_gm_pvi(
    rng_key: jax.Array,
    model: Callable,
    guide: AutoGaussianMixture,
    optim: Any,
    loss: Any,
    num_steps: int,
    *args: Any,
    prune_every: int | None = None,
    criterion: str = "auto",
    num_prune_particles: int = 64,
    **kwargs: Any,
) -> PrunedFit:
    """Fit a Gaussian-mixture guide with SVI, pruning components as it goes.

    Runs ``num_steps`` SVI steps in blocks of ``prune_every``; after every
    block but the last, :func:`prune_components` removes the components that
    are never the most probable for any observation, and SVI continues from
    the surviving parameters (with a fresh optimiser state). The returned
    fit is always trained after its last pruning. Each block is one compiled
    ``lax.scan``.

    :param rng_key: random key.
    :param model: the model.
    :param guide: an :class:`AutoGaussianMixture`.
    :param optim: an optimiser (``optax`` or ``numpyro.optim``).
    :param loss: the objective, e.g. ``PredictiveELBO(...)``.
    :param int num_steps: total number of SVI steps.
    :param args: model arguments.
    :param prune_every: block length; ``None`` fits without pruning.
    :param str criterion: see :func:`prune_components`.
    :param int num_prune_particles: draws per component for the
        responsibilities.
    :param kwargs: model keyword arguments.
    :return: :class:`PrunedFit`.
    """
    if not isinstance(guide, AutoGaussianMixture):
        raise TypeError(
            "fit_gm_pvi needs an AutoGaussianMixture guide, got "
            f"{type(guide).__name__}."
        )
    for name, val in (("num_steps", num_steps), ("prune_every", prune_every)):
        if val is None and name == "prune_every":
            continue
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ValueError(
                f"fit_gm_pvi: {name} must be an integer >= 1, got {val!r}."
            )
    block = num_steps if prune_every is None else prune_every
    blocks = [block] * (num_steps // block)
    if num_steps % block:
        blocks.append(num_steps % block)
    params, losses, history = None, [], []
    state, svi, runners = None, None, {}
    for i, length in enumerate(blocks):
        rng_key, init_key, prune_key = random.split(rng_key, 3)
        if state is None:
            svi, runners = SVI(model, guide, optim, loss), {}
            state = svi.init(init_key, *args, init_params=params, **kwargs)
        if length not in runners:
            runners[length] = _block_runner(svi, length)
        state, block_losses = runners[length](state, args, kwargs)
        losses.append(block_losses)
        params = svi.get_params(state)
        if prune_every is not None and i < len(blocks) - 1:
            new_guide, params, _ = prune_components(
                prune_key,
                model,
                guide,
                params,
                *args,
                criterion=criterion,
                num_particles=num_prune_particles,
                **kwargs,
            )
            if new_guide is not guide:
                guide, state = new_guide, None
        history.append(guide.num_components)
    return PrunedFit(
        guide, params, guide.num_components, jnp.concatenate(losses), history
    )


def _block_runner(svi: SVI, length: int) -> Callable:
    """A compiled function running ``length`` SVI steps (one ``lax.scan``)."""

    @jax.jit
    def run(state: Any, args: tuple, kwargs: dict) -> tuple[Any, jax.Array]:
        def step(s: Any, _: None) -> tuple[Any, jax.Array]:
            return svi.update(s, *args, **kwargs)

        return jax.lax.scan(step, state, None, length=length)

    return run
