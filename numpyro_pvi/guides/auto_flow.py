r"""A normalizing-flow autoguide whose draw and density each cost one pass.

:class:`AutoFlow` fits a rational-quadratic spline coupling flow (Durkan et
al. 2019) over the unconstrained latent space, built from `flowjax
<https://github.com/danielward27/flowjax>`_ bijections and wrapped as a
:class:`~numpyro_pvi.guides.FlowDistribution`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import paramax
from flowjax.bijections import Affine, Chain, Coupling, RationalQuadraticSpline
from flowjax.distributions import StandardNormal
from flowjax.flows import coupling_flow
from jax import random
from jax.flatten_util import ravel_pytree
from numpyro.distributions import constraints
from numpyro.handlers import substitute
from numpyro.infer.autoguide import AutoContinuous
from numpyro.infer.initialization import init_to_uniform

from numpyro_pvi._trace.structure import feasible_improper
from numpyro_pvi._trace.validation import check_int, check_real
from numpyro_pvi.distributions import simulators_without_density
from numpyro_pvi.guides.flow import FlowDistribution

__all__ = ["AutoFlow"]


def _non_trainable(leaf: Any) -> bool:
    return isinstance(leaf, paramax.NonTrainable)


def _zero_last_layers(bijection: Any) -> Any:
    """The flow with every conditioner's output layer zero: each coupling
    layer then hands its spline the parameters of the identity."""

    def zero(node: Any) -> Any:
        if not isinstance(node, Coupling):
            return node
        return eqx.tree_at(
            lambda c: (c.conditioner.layers[-1].weight, c.conditioner.layers[-1].bias),
            node,
            replace_fn=jnp.zeros_like,
        )

    return jax.tree.map(zero, bijection, is_leaf=lambda x: isinstance(x, Coupling))


class AutoFlow(AutoContinuous):
    r"""Rational-quadratic spline coupling flow over the unconstrained latents.

    The push-forward of a standard normal through ``num_layers`` coupling layers
    (monotone rational-quadratic splines whose knots an MLP of the other half of
    the coordinates outputs; Durkan et al. 2019) and an elementwise affine map:

    .. math::

        \theta = \mu + \sigma \odot (T_L \circ \dots \circ T_1)(\varepsilon),
        \qquad \varepsilon \sim \mathcal{N}(0, I_D).

    Both directions of a layer are explicit, so a draw with its density and the
    density at given points each cost one pass (what
    :class:`~numpyro_pvi.SoftCVIELBO`, :class:`~numpyro_pvi.SNISForwardKL` and
    :func:`~numpyro_pvi.diagnostics.psis` read). The flow starts as the
    identity: :math:`\mathcal{N}(\mu_0, \mathrm{diag}(\sigma_0^2))` with
    :math:`\sigma_0` = ``init_scale``; the default 0.3 keeps log-link
    likelihoods finite in the first steps; with SoftCVI on a multimodal
    posterior pass ``init_scale=1.0``. Splines act on :math:`[-B, B]` and are
    the identity outside. Parameters (``prefix="auto"``): ``auto_loc``,
    ``auto_scale`` and ``auto_flow`` (the layers' weights, flat).

    **Example**

    .. code-block:: python

        guide = AutoFlow(model, num_layers=4, init_scale=1.0)
        svi = SVI(model, guide, optax.adam(1e-3),
                  loss=SoftCVIELBO(num_particles=8, alpha=0.75))

    :param model: the NumPyro model (continuous global latents only).
    :param str prefix: prefix of the parameter names.
    :param init_loc_fn: initialisation of the latent values (the initial
        :math:`\mu`).
    :param float init_scale: initial :math:`\sigma` of every coordinate.
    :param int num_layers: number of coupling layers :math:`L` (a
        permutation of the coordinates follows each).
    :param int hidden_dim: width of the conditioners' hidden layers.
    :param int hidden_layers: number of hidden layers of each conditioner.
    :param int knots: number of inner knots of each spline.
    :param float interval: :math:`B`, half-width of the splines' interval.

    **References**

    1. Durkan, C., Bekasov, A., Murray, I. & Papamakarios, G. (2019).
       *Neural spline flows*. NeurIPS.
    2. Dinh, L., Sohl-Dickstein, J. & Bengio, S. (2017). *Density estimation
       using Real NVP*. ICLR.
    3. Ward, D. *FlowJAX: distributions and normalizing flows in JAX*.
       https://github.com/danielward27/flowjax.
    """

    def __init__(
        self,
        model: Callable,
        *,
        prefix: str = "auto",
        init_loc_fn: Callable = init_to_uniform,
        init_scale: float = 0.3,
        num_layers: int = 4,
        hidden_dim: int = 32,
        hidden_layers: int = 1,
        knots: int = 8,
        interval: float = 4.0,
    ) -> None:
        where = "AutoFlow"
        self._init_scale = check_real(
            init_scale, "init_scale", where, low=0, low_open=True
        )
        self.num_layers = check_int(num_layers, "num_layers", where, minimum=1)
        self.hidden_dim = check_int(hidden_dim, "hidden_dim", where, minimum=1)
        self.hidden_layers = check_int(hidden_layers, "hidden_layers", where, minimum=1)
        self.knots = check_int(knots, "knots", where, minimum=1)
        self.interval = check_real(interval, "interval", where, low=0, low_open=True)
        super().__init__(model, prefix=prefix, init_loc_fn=init_loc_fn)

    def _setup_prototype(self, *args: Any, **kwargs: Any) -> None:
        _check_latents(self.model, args, kwargs)
        with simulators_without_density():  # likelihood-free models too
            super()._setup_prototype(*args, **kwargs)
        key = numpyro.prng_key()
        if key is None:
            key = random.PRNGKey(0)
        flow = coupling_flow(
            random.fold_in(key, 2),
            # flowjax's equinox dataclass: mypy misreads its constructor
            base_dist=StandardNormal((self.latent_dim,)),  # type: ignore[call-arg]
            transformer=RationalQuadraticSpline(
                knots=self.knots, interval=self.interval
            ),
            flow_layers=self.num_layers,
            nn_width=self.hidden_dim,
            nn_depth=self.hidden_layers,
        )
        weights, self._flow_static = eqx.partition(
            _zero_last_layers(flow.bijection),
            eqx.is_inexact_array,
            is_leaf=_non_trainable,
        )
        self._init_flow, self._unravel_flow = ravel_pytree(weights)

    def _bijection(self, flat: jax.Array) -> Any:
        """The coupling layers with weights ``flat``, ready to call."""
        layers = eqx.combine(self._unravel_flow(flat), self._flow_static)
        return paramax.unwrap(layers)

    def _get_posterior(self) -> dist.Distribution:
        loc = numpyro.param(f"{self.prefix}_loc", self._init_latent)
        scale = numpyro.param(
            f"{self.prefix}_scale",
            jnp.full(self.latent_dim, self._init_scale),
            constraint=constraints.softplus_positive,
        )
        flat = numpyro.param(f"{self.prefix}_flow", self._init_flow)
        # flowjax's Affine stores its scale behind softplus; the one here is
        # already positive, so it replaces that parameterisation
        affine = eqx.tree_at(lambda a: a.scale, Affine(loc), scale)
        return FlowDistribution(Chain([self._bijection(flat), affine]))

    def get_posterior(self, params: dict[str, jax.Array]) -> FlowDistribution:
        """The flow over the unconstrained latent vector at ``params``."""
        return substitute(self._get_posterior, params)()

    def get_transform(self, params: dict[str, jax.Array]) -> Any:
        """Not available: the flow is a flowjax bijection, not a NumPyro
        transform; :meth:`get_posterior` returns the distribution."""
        raise NotImplementedError(
            "AutoFlow.get_transform: the flow is a flowjax bijection "
            "(get_posterior(params).bijection), not a NumPyro transform, so it "
            "cannot reparameterise a model (NeuTraReparam); use "
            "get_posterior(params) for draws and densities."
        )

    def get_base_dist(self) -> dist.Distribution:
        """The standard normal the flow transforms."""
        return dist.Normal(jnp.zeros(self.latent_dim), 1.0).to_event(1)

    def quantiles(
        self,
        params: dict[str, jax.Array],
        quantiles: Any,
        *,
        num_samples: int = 10_000,
        rng_key: jax.Array | None = None,
    ) -> dict[str, jax.Array]:
        """Marginal quantiles of every latent site (constrained), estimated
        from ``num_samples`` draws of the guide.

        A flow's marginals have no closed form; the estimate's standard error
        at quantile :math:`p` of a site with marginal density :math:`f` is
        :math:`\\sqrt{p(1-p)/n} / f(x_p)`.

        :param params: the fitted parameters.
        :param quantiles: a number or a 1-D array of levels in ``[0, 1]``.
        :param num_samples: number of draws.
        :param rng_key: key of the draws (``PRNGKey(0)`` when ``None``).
        :return: site name → array of shape ``quantiles.shape + site shape``.
        """
        num_samples = check_int(num_samples, "num_samples", "AutoFlow", minimum=2)
        levels = np.asarray(quantiles, dtype=float)
        if levels.ndim > 1 or not np.all((levels >= 0) & (levels <= 1)):
            raise ValueError(
                "AutoFlow.quantiles: quantiles must be a number or a 1-D array of "
                f"levels in [0, 1], got {quantiles!r}."
            )
        key = random.PRNGKey(0) if rng_key is None else rng_key
        draws = self.sample_posterior(key, params, sample_shape=(num_samples,))
        return {
            name: jnp.quantile(value, levels, axis=0)
            for name, value in draws.items()
            if name in self._init_locs
        }

    def median(
        self,
        params: dict[str, jax.Array],
        *,
        num_samples: int = 10_000,
        rng_key: jax.Array | None = None,
    ) -> dict[str, jax.Array]:
        """Marginal medians of every latent site, estimated as in
        :meth:`quantiles`."""
        return self.quantiles(params, 0.5, num_samples=num_samples, rng_key=rng_key)


def _check_latents(model: Callable, args: tuple, kwargs: dict) -> None:
    """Raise, naming the site, if the model has a discrete latent site or
    none at all."""
    with numpyro.handlers.block(), simulators_without_density():
        tr = numpyro.handlers.trace(
            numpyro.handlers.seed(feasible_improper(model), random.PRNGKey(0))
        ).get_trace(*args, **kwargs)
    latents = [s for s in tr.values() if s["type"] == "sample" and not s["is_observed"]]
    for site in latents:
        if site["fn"].support.is_discrete:
            raise ValueError(
                f"AutoFlow: the latent site '{site['name']}' is discrete "
                f"({type(site['fn']).__name__}); a flow is a density over real "
                "numbers. Marginalise it out (numpyro.contrib.funsor's "
                "enumeration, or by hand), or pass it as observed data."
            )
    if not latents:
        raise ValueError(
            "AutoFlow: the model has no latent sample sites (every sample site "
            "is observed or there are none), so there is nothing to fit."
        )
