"""The particle terms: what the particle machinery returns and a score
reads (:class:`ParticleTerms`, its :class:`Weights` and the observed sites'
distributions at each particle, :class:`Likelihood`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple, TypeVar

import jax
import jax.numpy as jnp

from numpyro_pvi._trace.data_plate import DataPlate
from numpyro_pvi._trace.site_values import component_mask, parameter_rows


class Weights(NamedTuple):
    r"""The three weights of :class:`ParticleTerms`, by what they weight.

    :ivar particle: ``(M,)`` weight of each particle in expectations over
        the guide (sums to one): ``1/M`` for i.i.d. draws, ``ω̄_k / M`` for
        the draws of stratum ``k``.
    :ivar log_predictive: ``(M, b)`` log weight of particle ``j`` in the
        predictive of observation ``i``, :math:`q(y_i) \approx \sum_j
        e^{\text{log\_predictive}[j, i]} p(y_i \mid \theta_j)`.
    :ivar observation: ``(b,)`` weight of each observation's score in a
        data-set sum (the subsample scale ``N / b`` times any handler
        scale); on the request ``"weight"``.
    """

    particle: jax.Array
    log_predictive: jax.Array
    observation: jax.Array | None = None


@jax.tree_util.register_static
class ObservationSites(tuple):
    """``((site, values), ...)``: the observed sites that form one
    observation and how many values each gives it (static: names)."""

    __slots__ = ()


@jax.tree_util.register_pytree_node_class
class Likelihood:
    """The observed sites of the data plate at each particle: their
    distributions ``laws`` (NumPyro distributions whose parameters carry a
    leading particle axis) and at one particle outside any mapping
    (``first``: what must be known when the program is compiled, a count's
    ``total_count``, is concrete there where the model has it so), their
    observed ``values``, one key per particle for simulations, and, after
    ``observation_subset``, the
    observations kept (``index``). A score reads from it what it needs
    beyond the log density (simulations, a pmf, a closed form's
    parameters), by the distributions' types.
    """

    def __init__(
        self,
        laws: tuple,
        first: tuple,
        values: tuple,
        keys: jax.Array,
        index: jax.Array | None,
        plate: DataPlate,
        names: tuple[str, ...],
        reparam: bool,
    ) -> None:
        self.laws, self.first, self.values = laws, first, values
        self.keys, self.index = keys, index
        self.plate, self.names, self.reparam = plate, names, reparam

    def tree_flatten(self) -> tuple[tuple, tuple]:
        children = (self.laws, self.first, self.values, self.keys, self.index)
        return children, (self.plate, self.names, self.reparam)

    @classmethod
    def tree_unflatten(cls, aux: tuple, children: tuple) -> Likelihood:
        return cls(*children, *aux)

    def sites(self, laws: tuple | None = None) -> list[dict[str, Any]]:
        """The observed sites (as trace sites) with the distributions
        ``laws`` of one particle (default: ``first``), each with its
        ``first_fn``."""
        laws = self.first if laws is None else laws
        return [
            {
                "name": name,
                "type": "sample",
                "is_observed": True,
                "fn": fn,
                "first_fn": first,
                "value": value,
                "scale": None,
                "intermediates": [],
                "infer": {},
            }
            for name, fn, first, value in zip(
                self.names, laws, self.first, self.values, strict=True
            )
        ]

    def per_particle(self, fn: Callable[[list, jax.Array], Any]) -> Any:
        """``fn(sites, key)`` at every particle, mapped over the particle
        axis; arrays over the observations (axis 1) are cut to ``index``."""
        out = jax.vmap(lambda laws, key: fn(self.sites(laws), key))(
            self.laws, self.keys
        )
        return jax.tree.map(lambda x: self._cut(x, 1), out)

    def rows(self, site: int, x: jax.Array) -> jax.Array:
        """``(M, b, d)`` a parameter ``x`` (leading particle axis) of the
        ``site``-th distribution laid out like its observed values, ``(M, 1,
        d)`` where it does not vary along the data plate."""
        fn = self.laws[site]
        shape = jnp.broadcast_shapes(fn.shape(), jnp.shape(self.values[site]))
        out = jax.vmap(lambda v: parameter_rows(v, shape, self.plate, fn.event_dim))(
            jnp.broadcast_to(x, (self.keys.shape[0],) + jnp.shape(x)[1:])
        )
        return self._cut(out, 1)

    def mask(self, site: int) -> jax.Array | None:
        """``(b, c)`` where the ``site``-th distribution's mask keeps its
        components; ``None`` without a mask."""
        first = jax.tree.map(lambda x: x[0], self.laws[site])
        one = self.sites(
            tuple(first if i == site else f for i, f in enumerate(self.laws))
        )
        mask = component_mask(one[site], self.plate)
        return None if mask is None else self._cut(mask, 0)

    def _cut(self, x: jax.Array, axis: int) -> jax.Array:
        if self.index is None or jnp.ndim(x) <= axis or jnp.shape(x)[axis] == 1:
            return x
        return jnp.take(x, self.index, axis=axis)

    def _replace(self, **changes: Any) -> Likelihood:
        """A copy with the fields ``changes`` replaced (one constructor for
        every derived set: none can drop a field)."""
        children, aux = self.tree_flatten()
        fields = dict(
            zip(("laws", "first", "values", "keys", "index"), children, strict=True)
        )
        fields.update(zip(("plate", "names", "reparam"), aux, strict=True))
        return Likelihood(**{**fields, **changes})

    def observations(self, index: jax.Array) -> Likelihood:
        """Only the observations ``index`` of this (sub)set."""
        return self._replace(index=index if self.index is None else self.index[index])

    def particles(self, index: jax.Array) -> Likelihood:
        """Only the particles ``index``."""
        laws, keys = jax.tree.map(
            lambda x: jnp.take(x, index, axis=0), (self.laws, self.keys)
        )
        return self._replace(laws=laws, keys=keys)

    def join(self, other: Likelihood) -> Likelihood:
        """This set's particles, then ``other``'s (of the same sites)."""
        laws, keys = jax.tree.map(
            lambda a, b: jnp.concatenate([a, b]),
            (self.laws, self.keys),
            (other.laws, other.keys),
        )
        return self._replace(laws=laws, keys=keys)


class ParticleTerms(NamedTuple):
    """The terms of ``M`` particles: what every objective and score reads.

    ``M`` counts the particles (``K * M`` when stratified, strata in consecutive
    blocks), ``b`` the observations in this (sub)sample, ``d`` the values of one
    observation. Fields not requested are ``None``.

    :ivar log_prior: ``(M,)`` log density of the latent sites (scaled), and of
        observed sites outside the data plate.
    :ivar log_q: ``(M,)`` log density of the guide at its draws (scaled).
    :ivar weights: :class:`Weights`.
    :ivar num_strata: the number of strata (a Python integer).
    :ivar log_lik: ``(M, b)`` log-likelihood of each observation (unscaled).
    :ivar log_lik_scaled: ``(M, b)`` the same with each site's scale.
    :ivar log_lik_sim: ``(M, b)`` the log-likelihood of one simulation of each
        observation.
    :ivar mask: ``(b,)`` ``False`` for an observation masks remove; or ``None``.
    :ivar y_obs: ``(b, d)`` the observed values, one flattened row each.
    :ivar likelihood: the observed sites' distributions, :class:`Likelihood`.
    :ivar log_q_fixed: ``(M,)`` ``log q_φ`` at the draws with their gradient
        stopped.
    :ivar latents: ``{site: (M, *shape)}`` the model's latent values.
    :ivar guide_draws: ``{site: (M, *shape)}`` the guide's own sample sites.
    :ivar observed: ``{site: value}`` the observed values.
    :ivar entropy: the guide's entropy (or a bound) in closed form, if any.
    :ivar mutable_state: the ``numpyro.mutable`` sites after one trace.
    :ivar observation_sites: :class:`~numpyro_pvi.particles.ObservationSites`.
    """

    log_prior: jax.Array
    log_q: jax.Array
    weights: Weights
    num_strata: int
    log_lik: jax.Array | None = None
    log_lik_scaled: jax.Array | None = None
    log_lik_sim: jax.Array | None = None
    mask: jax.Array | None = None
    y_obs: jax.Array | None = None
    likelihood: Likelihood | None = None
    log_q_fixed: jax.Array | None = None
    latents: dict[str, jax.Array] | None = None
    guide_draws: dict[str, jax.Array] | None = None
    observed: dict[str, jax.Array] | None = None
    entropy: jax.Array | None = None
    mutable_state: dict[str, Any] | None = None
    observation_sites: ObservationSites = ObservationSites()


def require_iid(terms: ParticleTerms, name: str) -> None:
    """Raise :class:`NotImplementedError` for stratified terms: for an
    estimator written for ``M`` i.i.d. equally weighted draws only.

    :param terms: particle terms.
    :param name: the estimator's name, for the message.
    """
    if terms.num_strata != 1:
        raise NotImplementedError(
            f"{name} assumes M i.i.d. draws of weight 1/M, but the draws are "
            f"stratified ({terms.num_strata} strata, weighted by "
            "terms.weights.log_predictive): "
            "use the weights, or a guide without strata."
        )


#: Per-observation log-likelihoods ``log_lik`` (with ``log_lik_scaled``).
LOG_LIK = "log_lik"
#: The observed sites' distributions at each particle, ``likelihood`` (a
#: :class:`~numpyro_pvi._trace.terms.Likelihood`), and the observed values
#: ``y_obs``: what a score reads of the likelihood beyond its log density
#: (simulations, a pmf, a closed form's parameters).
LIKELIHOOD = "likelihood"
#: ``log q`` at the draws with their gradient stopped, ``log_q_fixed``.
LOG_Q_FIXED = "log_q_fixed"
#: The model's latent values, ``latents``.
LATENTS = "latents"
#: The per-observation weight of a score in a data-set sum,
#: ``weights.observation``.
OBS_WEIGHT = "weight"
#: The values of the guide's own sample sites, ``guide_draws``.
GUIDE_DRAWS = "guide_draws"
#: The observed values as the model computes them, ``observed``.
OBSERVED = "observed"
#: The log-likelihood of one simulation of each observation per particle,
#: ``log_lik_sim``: how far each observation lies in each draw's
#: predictive (held-out estimates; ``None`` where a site has no sampler).
LOG_LIK_SIM = "log_lik_sim"

#: What each request fills, beside the fields every call fills
#: (``log_prior``, ``log_q``, ``weights``, ``num_strata``, ``mask``,
#: ``observation_sites``, ``entropy`` and ``mutable_state`` where there are
#: any); a field no request fills is ``None``.
FIELDS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        LOG_LIK: ("log_lik", "log_lik_scaled"),
        LIKELIHOOD: ("likelihood", "y_obs"),
        LOG_Q_FIXED: ("log_q_fixed",),
        LATENTS: ("latents",),
        OBS_WEIGHT: ("weights.observation",),
        GUIDE_DRAWS: ("guide_draws",),
        OBSERVED: ("observed",),
        LOG_LIK_SIM: ("log_lik_sim",),
    }
)
#: Every quantity that can be requested.
REQUESTS = frozenset(FIELDS)


_T = TypeVar("_T")


def present(value: _T | None, field: str) -> _T:
    """``value``, a field of the particle terms that a request fills
    (``FIELDS``); a clear error when it was not requested.

    :param value: the field's value, e.g. ``terms.likelihood``.
    :param field: its name, for the message.
    """
    if value is None:
        requests = sorted(r for r, fields in FIELDS.items() if field in fields)
        raise ValueError(
            f"the particle terms have no {field!r}: a score that reads it must "
            f"list one of {requests} in its `requires`."
        )
    return value
