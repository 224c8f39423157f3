r"""Enumerated discrete latents, summed out within each observation.

NumPyro users mark a model's discrete sites for enumeration
(``infer={"enumerate": "parallel"}``, ``config_enumerate``), draw the
continuous latents with the guide and fit with ``TraceEnum_ELBO``. Every
objective and diagnostic here reads the model through :func:`marginalized`:
the same program, in which the enumerated sites the guide does not draw and
the observed sites of the data plate that follow them make one observed site
of law :class:`EnumeratedObservations`. At an element :math:`i` of the data
plate its density given the latents :math:`\theta` the guide draws is

.. math::

    p(y_i \mid \theta) = \sum_{z_i} p(z_i \mid \theta)\, p(y_i \mid z_i, \theta),

the enumerated sites :math:`z_i` of that element (a mixture's assignment, an
HMM's states along ``markov`` or ``scan``) summed out by NumPyro's
enumeration and funsor's ``sum_product`` with the data plate kept [1, 2]; its
draws simulate :math:`z_i` from :math:`p(z_i \mid \theta)`, then :math:`y_i`.
Where one enumerated site selects one observed site with one value per
element, the law is that mixture, a ``MixtureGeneral`` (its CRPS has a
closed form for Normal components). A model without enumerated sites runs
unchanged.

**References**

1. Obermeyer, F. et al. (2019). *Tensor variable elimination for plated
   factor graphs*. ICML.
2. Obermeyer, F. et al. (2020). *Functional tensors for probabilistic
   programming*. arXiv:1910.10775.
"""

from __future__ import annotations

import copy
import functools
import math
from collections import defaultdict
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from numpyro import plate as numpyro_plate
from numpyro import sample as numpyro_sample
from numpyro.distributions import (
    CategoricalLogits,
    Distribution,
    Independent,
    MaskedDistribution,
    MixtureGeneral,
    constraints,
)
from numpyro.handlers import block, condition, seed, substitute, trace
from numpyro.infer import Trace_ELBO, TraceEnum_ELBO
from numpyro.primitives import Messenger

__all__ = [
    "EnumeratedObservations",
    "drawn_by",
    "enumerated_sites",
    "enumerates",
    "marginalized",
    "summed_out_loss",
]


def _is_enumerated(msg: dict[str, Any]) -> bool:
    return (
        msg["type"] == "sample"
        and not msg["is_observed"]
        and msg["infer"].get("enumerate") == "parallel"
    )


def _plates(msg: dict[str, Any]) -> list[Any]:
    return [f for f in msg["cond_indep_stack"] if f.dim is not None]


@dataclass(frozen=True, eq=False)
class _Program:
    """What the law of the summed-out observations re-runs: the model, its
    arguments, the data plate and the sites summed out or observed."""

    model: Callable
    args: tuple
    kwargs: dict
    plate: str
    dim: int
    size: int
    enumerated: tuple[str, ...]
    observed: tuple[tuple[str, tuple[int, ...], int], ...]  # name, shape, event
    nesting: int
    data: dict[str, jax.Array]  # values of the other observed sites
    joined: tuple[str, ...] = ()  # latents of the data plate after them

    def base(self, fixed: dict[str, jax.Array]) -> Callable:
        """The model at the latent values ``fixed``, its observed sites that
        are not summed out conditioned on ``data``."""
        hidden = {n for n, _, _ in self.observed}
        data = {k: v for k, v in self.data.items() if k not in hidden}
        return substitute(condition(self.model, data), data=fixed)

    @property
    def site(self) -> str:
        """The name of the observed site: the model's, or for several
        ``"{plate}_observations"``."""
        if len(self.observed) == 1:
            return self.observed[0][0]
        return f"{self.plate}_observations"

    def unpack(self, value: jax.Array) -> dict[str, jax.Array]:
        """The observed sites' values from one packed value."""
        rows = jnp.reshape(value, (self.size, -1))
        out, start = {}, 0
        for name, shape, event_ndim in self.observed:
            axis = len(shape) + self.dim - event_ndim
            moved = list(shape)
            moved.insert(0, moved.pop(axis))
            width = math.prod(moved[1:])
            part = jnp.reshape(rows[:, start : start + width], moved)
            out[name] = jnp.moveaxis(part, 0, axis)
            start += width
        return out

    def pack(self, values: dict[str, jax.Array]) -> jax.Array:
        """``(N, d)``: one row per element of the data plate."""
        rows = []
        for name, shape, event_ndim in self.observed:
            axis = len(shape) + self.dim - event_ndim
            x = jnp.moveaxis(jnp.broadcast_to(values[name], shape), axis, 0)
            rows.append(jnp.reshape(x, (self.size, -1)))
        return jnp.concatenate(rows, axis=1)

    def log_lik(self, fixed: dict[str, jax.Array], value: jax.Array) -> jax.Array:
        r"""``(N,)`` log-likelihood of each element, the enumerated sites summed
        out (funsor's ``sum_product`` with the data plate kept); given the
        latents of the data plate after them, ``θ_i``, it is
        :math:`\log \sum_z p(z, \theta_i, y_i) - \log \sum_z p(z, \theta_i)`."""
        joint = self.sum_out(fixed, value)
        return joint - self.sum_out(fixed, None) if self.joined else joint

    def sum_out(
        self, fixed: dict[str, jax.Array], value: jax.Array | None
    ) -> jax.Array:
        r"""``(N,)`` :math:`\log \sum_z` of the factors of the enumerated
        sites, the joined latents and (unless ``value`` is ``None``) the
        observations at ``value``."""
        import funsor
        from numpyro.contrib.funsor import enum, plate_to_enum_plate
        from numpyro.contrib.funsor.infer_util import (
            compute_markov_factors,
            packed_trace,
        )

        program = self.base(fixed)
        with (
            block(),
            enum(first_available_dim=-self.nesting - 1),
            plate_to_enum_plate(),
        ):
            tr = packed_trace(seed(program, 0)).get_trace(*self.args, **self.kwargs)
        names = set(self.enumerated) | set(self.joined)
        if value is not None:
            names |= {n for n, _, _ in self.observed}
            values = self.unpack(value)
        factors: list[Any] = []
        chains: dict[Any, list[Any]] = defaultdict(list)  # time -> factors
        previous: dict[Any, frozenset] = defaultdict(frozenset)  # time -> _PREV_
        sum_vars: frozenset[str] = frozenset()
        prod_vars: frozenset[str] = frozenset()
        history = 0
        for name, site in tr.items():
            if site["type"] != "sample":
                continue
            dims = site["infer"].get("dim_to_name", {})
            if name.replace("_PREV_", "") not in names:  # scan's first steps
                if not site["is_observed"] or value is not None:
                    _refuse_dependent(name, site, dims, self)
                continue
            if site["is_observed"]:
                log_prob = site["fn"].log_prob(_steps(name, site["value"], values, tr))
            else:  # a law over the sums: a masked latent keeps its density
                log_prob = _unmasked(site["fn"]).log_prob(site["value"])
            factor = funsor.to_funsor(log_prob, funsor.Real, dims)
            time = next((n for n in dims.values() if n.startswith("_time")), None)
            if time is None:
                factors.append(factor)
            else:  # as NumPyro's TraceEnum_ELBO orders a scan's steps
                history = max([history] + [_shift(n) for n in dims.values()])
                axis = next(d for d, n in dims.items() if n == time)
                var = funsor.Variable(time, funsor.Bint[log_prob.shape[axis]])
                if history == 0:
                    factors.append(factor)
                    prod_vars |= {time}
                else:
                    chains[var].append(factor)
                previous[var] |= {n for n in dims.values() if n.startswith("_PREV_")}
            if not site["is_observed"]:
                sum_vars |= {name}
            prod_vars |= {f.name for f in _plates(site)}
        if chains:
            factors += compute_markov_factors(
                chains,
                previous,
                {t: _markov_dims(tr, v) for t, v in previous.items()},
                sum_vars,
                prod_vars,
                history,
                funsor.ops.logaddexp,
                funsor.ops.add,
            )
        eliminate = sum_vars | (prod_vars - {self.plate})
        with funsor.interpretations.lazy:
            lazy = funsor.sum_product.sum_product(
                funsor.ops.logaddexp, funsor.ops.add, factors, eliminate, prod_vars
            )
        result = funsor.optimizer.apply_optimizer(lazy)
        if set(result.inputs) != {self.plate} and self.size != 1:
            raise ValueError(  # never one total copied to every observation
                f"The enumerated site(s) {list(self.enumerated)} summed out to "
                f"a density over {sorted(result.inputs)}, not one per element "
                f"of the plate '{self.plate}': observe the data inside that "
                "plate, after the enumerated sites."
            )
        return jnp.broadcast_to(result.data, (self.size,))

    def simulate(self, fixed: dict[str, jax.Array], key: jax.Array) -> jax.Array:
        """One packed draw: the enumerated sites from their prior, then the
        observations."""
        names = {n for n, _, _ in self.observed}
        program = _Unobserved(self.base(fixed), names)
        with block():
            tr = trace(seed(program, key)).get_trace(*self.args, **self.kwargs)
        return self.pack({n: tr[n]["value"] for n in names})


def _shift(name: str) -> int:
    """How many steps back a site of ``scan`` or ``markov`` is (its
    ``_PREV_`` prefixes)."""
    return (len(name) - len(name.replace("_PREV_", ""))) // len("_PREV_")


def _unmasked(fn: Distribution) -> Distribution:
    """``fn`` without the masks of ``handlers.mask``: a masked enumerated site
    (an HMM's steps past a sequence's length) would otherwise weigh each of
    its values by one, and the sum over them would not be a density."""
    while isinstance(fn, MaskedDistribution):
        fn = fn.base_dist
    return fn


def _observed_entries(fn: Distribution, shape: tuple[int, ...]) -> jax.Array | None:
    """Where an observed site of law ``fn`` and value shape ``shape`` is not
    masked (``handlers.mask``, ``.mask``, ``obs_mask``); ``None`` if nowhere."""
    entries = None
    while isinstance(fn, MaskedDistribution | Independent):
        if isinstance(fn, MaskedDistribution):
            mask = jnp.reshape(fn._mask, jnp.shape(fn._mask) + (1,) * fn.event_dim)
            entries = mask if entries is None else entries & mask
        fn = fn.base_dist
    return None if entries is None else jnp.broadcast_to(entries, shape)


def _markov_dims(tr: dict[str, Any], previous: frozenset) -> frozenset:
    """The dimensions of the sites a chain's ``_PREV_`` variables stand for."""
    out: frozenset = frozenset()
    for var in previous:
        dims = tr[var.replace("_PREV_", "")]["infer"]["dim_to_name"]
        if var in dims.values():
            out |= frozenset(dims.values())
    return out


def _refuse_dependent(
    name: str, site: dict[str, Any], dims: dict, program: _Program
) -> None:
    """Raise for a site outside the summed-out set whose density depends on
    an enumerated site."""
    if all(d in {f.dim for f in _plates(site)} for d in dims):
        return
    raise ValueError(
        f"The model's site '{name}' depends on the enumerated site(s) "
        f"{list(program.enumerated)} but is outside their data plate "
        f"'{program.plate}': this package sums enumerated sites out within "
        "each element of that plate. Move the site into that plate after "
        "them, or draw the enumerated site in the guide."
    )


def _steps(
    name: str, traced: jax.Array, values: dict[str, jax.Array], tr: dict[str, Any]
) -> jax.Array:
    """The value of observed site ``name`` of an enumerated trace taken from
    ``values`` (by the model's site names), laid out as the trace holds it:
    under enumeration ``scan`` records its first steps as sites ``_PREV_y``
    (step 0 the most prefixed) and the others as ``y``."""
    base = name.replace("_PREV_", "")
    shift = _shift(name)
    history = max(_shift(n) for n in tr if n.replace("_PREV_", "") == base)
    value = values[base]
    if history:  # steps along the leading (time) axis
        first = history - shift
        value = value[first : first + 1] if shift else value[history:]
    return jnp.reshape(value, jnp.shape(traced))


class _Unobserved(Messenger):
    """Draw the named observed sites instead of observing them."""

    def __init__(self, fn: Callable, names: set[str]) -> None:
        self.names = names
        super().__init__(fn)

    def process_message(self, msg: dict[str, Any]) -> None:
        if msg["type"] == "sample" and msg["name"] in self.names:
            msg["value"], msg["is_observed"] = None, False


class EnumeratedObservations(Distribution):
    """The observations of each element of the data plate with the model's
    enumerated sites summed out (see the module docstring): one row per
    element, the observed sites' values of that element flattened and
    concatenated in the order the model observes them."""

    arg_constraints: dict = {}
    has_rsample = False  # the enumerated sites are drawn, not reparameterised
    pytree_data_fields = ("fixed", "observed", "entries")
    pytree_aux_fields = ("program",)

    def __init__(
        self,
        program: _Program,
        fixed: dict[str, jax.Array],
        observed: jax.Array | None = None,
        entries: jax.Array | None = None,
    ) -> None:
        """:param observed: the packed observations, and ``entries`` where
        they are not masked: a draw takes the observed value at a masked
        entry, so that a distance between draws and data does not see it."""
        self.program, self.fixed = program, fixed
        self.observed, self.entries = observed, entries
        width = sum(
            math.prod(s) // (s[len(s) + program.dim - e] if s else 1)
            for _, s, e in program.observed
        )
        scalar = len(program.observed) == 1 and width == 1
        batch = (program.size,) + (1,) * (-program.dim - 1)
        super().__init__(batch, () if scalar else (width,))

    @property
    def reparam_remedy(self) -> str:
        """What to do when a score needs reparameterised draws."""
        return (
            " Its draws simulate the enumerated site(s) "
            f"{list(self.program.enumerated)}, discrete draws without a "
            "gradient, and its observations are no mixture over one of them "
            "(one enumerated site selecting one observed site with one value "
            "per element, whose CRPS has a closed form for Normal components)."
        )

    @constraints.dependent_property(is_discrete=False, event_dim=0)
    def support(self) -> constraints.Constraint:
        return constraints.real if not self.event_shape else constraints.real_vector

    def log_prob(self, value: jax.Array) -> jax.Array:
        extra = jnp.ndim(value) - len(self.batch_shape) - len(self.event_shape)
        fn = functools.partial(self.program.log_lik, self.fixed)
        for _ in range(extra):
            fn = jax.vmap(fn)
        return jnp.reshape(fn(value), jnp.shape(value)[:extra] + self.batch_shape)

    def sample(self, key: jax.Array, sample_shape: tuple[int, ...] = ()) -> jax.Array:
        if self.program.joined:
            raise ValueError(
                f"The observations of the plate '{self.program.plate}' are not "
                f"simulated: given the latent site(s) {list(self.program.joined)}, "
                f"the enumerated site(s) {list(self.program.enumerated)} would "
                "be drawn from their posterior, which is not done here. Score "
                'this model with the log score (score="log").'
            )
        n = math.prod(sample_shape)
        keys = jax.random.split(key, max(n, 1))
        draws = jax.vmap(functools.partial(self.program.simulate, self.fixed))(keys)
        if self.entries is not None and self.observed is not None:
            draws = jnp.where(self.entries, draws, self.observed)
        shape = sample_shape + self.batch_shape + self.event_shape
        return jnp.reshape(draws[:n] if sample_shape else draws[0], shape)


class _JoinedLatent(Distribution):
    r"""The law of a latent site of the data plate after enumerated sites
    (drawn by the guide): the first one's density is that of all of them,
    :math:`\log \sum_z p(z, \theta_i)` per element, the others' ``0``."""

    pytree_data_fields = ("base",)
    pytree_aux_fields = ("hider", "site")

    def __init__(self, base: Distribution, hider: _SumOut, site: str) -> None:
        self.base, self.hider, self.site = base, hider, site
        super().__init__(base.batch_shape, base.event_shape)

    @property
    def support(self) -> constraints.Constraint:
        return self.base.support

    def log_prob(self, value: jax.Array) -> jax.Array:
        program = self.hider.built
        if program is None:  # never a density read before the sum is known
            raise ValueError(
                f"The density of the model's latent site '{self.site}' is read "
                "while the model runs: it is the sum over the enumerated "
                f"site(s) {self.hider.enumerated}, known once the model returns."
            )
        shape = jnp.shape(value)[: jnp.ndim(value) - self.event_dim]
        if self.site != program.joined[0]:
            return jnp.zeros(shape)
        fixed = {**self.hider.fixed, self.site: value}
        return jnp.reshape(program.sum_out(fixed, None), shape)

    def sample(self, key: jax.Array, sample_shape: tuple[int, ...] = ()) -> jax.Array:
        raise ValueError(
            f"The model's latent site '{self.site}' follows the enumerated "
            f"site(s) {self.hider.enumerated} in their data plate and depends "
            "on their values: its values come from the guide (its law is "
            "not simulated here)."
        )


class _SumOut(Messenger):
    """Hide the enumerated sites (at a value of their support), the observed
    sites of their data plate and the deterministic sites that follow them
    (which may read that stand-in value); record the values of the others."""

    def __init__(self, fn: Callable, drawn: frozenset[str]) -> None:
        self.drawn = drawn
        self.enumerated: list[str] = []
        self.observed: list[tuple[str, tuple[int, ...], int, jax.Array]] = []
        self.frame: Any = None
        self.sizes: dict[str, tuple[int, int]] = {}
        self.fixed: dict[str, jax.Array] = {}
        self.masks: dict[str, jax.Array] = {}  # observed entries of masked sites
        self.joined: list[str] = []  # latents of the data plate after them
        self.supports: dict[str, jax.Array] = {}  # of the enumerated sites
        self.built: _Program | None = None  # once the model has returned
        self.nesting = 0
        super().__init__(fn)

    def process_message(self, msg: dict[str, Any]) -> None:
        if msg["type"] == "plate":
            self.sizes[msg["name"]] = (msg["args"][0], msg["args"][1])
            return
        if msg["type"] == "deterministic" and self.frame is not None:
            msg["stop"] = True  # may read the stand-in value of an enumerated site
            return
        if msg["type"] != "sample":
            return
        frames = _plates(msg)
        self.nesting = max(
            [self.nesting, len(msg["fn"].batch_shape)] + [-f.dim for f in frames]
        )
        if _is_enumerated(msg) and msg["name"] not in self.drawn:
            self._enumerate(msg, frames)
        elif self.frame is None or self.frame.name not in {f.name for f in frames}:
            return
        elif not msg["is_observed"]:  # its density is the sum's over the z
            self.joined.append(msg["name"])
            msg["fn"] = _JoinedLatent(msg["fn"], self, msg["name"])
        else:
            value = msg["value"]
            self.observed.append(
                (msg["name"], jnp.shape(value), msg["fn"].event_dim, value)
            )
            entries = _observed_entries(msg["fn"], jnp.shape(value))
            if entries is not None:
                self.masks[msg["name"]] = entries
            msg["stop"] = True

    def _enumerate(self, msg: dict[str, Any], frames: list[Any]) -> None:
        name = msg["name"]
        if not frames:
            raise ValueError(
                f"The model's enumerated site '{name}' is outside every plate: "
                "this package sums enumerated sites out within each observation "
                "of a data plate, and a global discrete latent couples them all. "
                "Draw it in the guide (e.g. a Categorical with learned "
                "probabilities), or write the observations as a mixture over "
                "its values (dist.MixtureSameFamily)."
            )
        outer = min(frames, key=lambda f: f.dim)
        if self.frame is None:
            self.frame = outer
        elif self.frame.name not in {f.name for f in frames}:
            raise ValueError(
                f"The model's enumerated site '{name}' is outside the plate "
                f"'{self.frame.name}' of the enumerated site '{self.enumerated[0]}': "
                "this package sums enumerated sites out within the elements of "
                "one data plate. Put them in one plate of observations."
            )
        support = msg["fn"].enumerate_support(expand=False)
        shape = msg["fn"].shape(msg["kwargs"].get("sample_shape", ()))
        self.supports[name] = jnp.broadcast_to(support, support.shape[:1] + shape)
        msg["value"] = jnp.broadcast_to(support[0], shape)
        msg["stop"] = True
        self.enumerated.append(name)

    def postprocess_message(self, msg: dict[str, Any]) -> None:
        hidden = {n for n, *_ in self.observed} | set(self.enumerated)
        if msg["type"] in ("sample", "param") and msg["name"] not in hidden:
            if not msg.get("is_observed"):
                self.fixed[msg["name"]] = msg["value"]

    def program(
        self, model: Callable, args: tuple, kwargs: dict, data: dict
    ) -> _Program:
        name = self.frame.name
        size, subsample = self.sizes.get(name, (self.frame.size, self.frame.size))
        if subsample is not None and subsample != size:
            raise ValueError(
                f"The data plate '{name}' of the enumerated site(s) "
                f"{self.enumerated} is subsampled: this package sums "
                "enumerated sites out on full data plates only. Use the "
                "plate without subsample_size."
            )
        if not self.observed:
            raise ValueError(
                f"The model's enumerated site(s) {self.enumerated} select no "
                f"observation of the plate '{name}' after them: nothing to "
                "sum them out of. Observe data in that plate after them."
            )
        return _Program(
            model,
            args,
            kwargs,
            name,
            self.frame.dim,
            size,
            tuple(self.enumerated),
            tuple((n, s, e) for n, s, e, _ in self.observed),
            self.nesting,
            data,
            tuple(self.joined),
        )


def marginalized(
    model: Callable,
    drawn: Collection[str] = (),
    data: dict[str, jax.Array] | None = None,
) -> Callable:
    """``model`` with its enumerated sites summed out within each element
    of the data plate (see the module docstring); as ``model`` where it has
    none.

    :param model: the NumPyro model.
    :param drawn: the sites the guide draws (not summed out).
    :param data: values of observed sites to condition on, as
        ``handlers.condition``; given here, not by wrapping ``model``, because
        NumPyro's enumeration cannot condition a site inside ``scan``.
    """
    drawn, data = frozenset(drawn), dict(data or {})

    @functools.wraps(model)
    def summed_out(*args: Any, **kwargs: Any) -> Any:
        hider = _SumOut(condition(model, data) if data else model, drawn)
        result = hider(*args, **kwargs)
        if not hider.enumerated:
            return result
        program = hider.program(model, args, kwargs, data)
        hider.built = program
        values = program.pack({n: v for n, _, _, v in hider.observed})
        fn: Distribution = EnumeratedObservations(program, hider.fixed)
        mixture = _as_mixture(hider, program, fn.batch_shape)
        if mixture is not None:
            fn, values = mixture, hider.observed[0][3]
        elif hider.masks:  # an element is masked where all its entries are
            entries = program.pack(
                {n: hider.masks.get(n, jnp.array(True)) for n, *_ in hider.observed}
            )
            fn = EnumeratedObservations(program, hider.fixed, values, entries)
            fn = fn.mask(jnp.reshape(jnp.any(entries, axis=1), fn.batch_shape))
        with numpyro_plate(program.plate, program.size, dim=program.dim):
            numpyro_sample(
                program.site,
                fn,
                obs=jnp.reshape(values, fn.batch_shape + fn.event_shape),
            )
        return result

    return summed_out


def _as_mixture(
    hider: _SumOut, program: _Program, batch: tuple[int, ...]
) -> Distribution | None:
    r"""The summed-out law as the mixture it is where one enumerated site
    selects one observed site with one value (or event) per element:
    ``MixtureGeneral`` with weights :math:`p(z_i = k \mid \theta)` and
    components :math:`p(y_i \mid z_i = k, \theta)`, the model run at each
    value :math:`k` of the site's support; its scores are those of the
    mixture written in the model (the CRPS of Normal components in closed
    form). ``None`` for any other program."""
    if len(program.enumerated) != 1 or len(hider.observed) != 1 or program.joined:
        return None
    (site,), (name, *_) = program.enumerated, hider.observed[0]
    weights, components = [], []
    for value in hider.supports[site]:
        fixed = {**hider.fixed, site: value}
        with block():
            tr = trace(seed(program.base(fixed), 0)).get_trace(
                *program.args, **program.kwargs
            )
        law, selected = _unmasked(tr[site]["fn"]), _unmasked(tr[name]["fn"])
        if jnp.broadcast_shapes(selected.batch_shape, batch) != batch:
            return None  # several values of the element (an inner plate, a chain)
        log_w = jnp.broadcast_to(law.log_prob(tr[site]["value"]), batch)
        weights.append(log_w)
        components.append(selected.expand(batch))
    if any(type(c.support) is not type(components[0].support) for c in components):
        return None
    mixing = CategoricalLogits(jnp.stack(weights, axis=-1))
    mixture: Distribution = MixtureGeneral(mixing, components)
    if name in hider.masks:  # an element is masked where all its entries are
        entries = jnp.reshape(hider.masks[name], batch + (-1,))
        mixture = mixture.mask(jnp.any(entries, axis=-1))
    return mixture


def enumerated_sites(model_trace: dict[str, Any]) -> list[str]:
    """The latent sites of a model trace marked for enumeration."""
    return [n for n, s in model_trace.items() if _is_enumerated(s)]


def enumerates(model: Callable, args: tuple, kwargs: dict) -> bool:
    """Whether ``model`` has sites marked for enumeration, from one abstract
    trace (``False`` where the model cannot be traced so: the programs that
    run it say what is wrong)."""
    found: list[str] = []

    def run() -> int:
        tr = trace(seed(model, 0)).get_trace(*args, **kwargs)
        found.extend(enumerated_sites(tr))
        return 0

    try:
        jax.eval_shape(run)
    except Exception:  # noqa: BLE001 - reported where the model runs
        return False
    return bool(found)


def drawn_by(guide: Callable, args: tuple, kwargs: dict) -> frozenset[str]:
    """The sample sites ``guide`` draws (an enumerated one among them is the
    guide's, not summed out), from one trace of a copy of it (an autoguide
    sets itself up on its first call: that is left to its fit)."""
    with block():
        tr = trace(seed(copy.deepcopy(guide), 0)).get_trace(*args, **kwargs)
    return frozenset(n for n, s in tr.items() if s["type"] == "sample")


def summed_out_loss(loss: Any) -> Any:
    """``loss`` for a model already :func:`marginalized`: ``TraceEnum_ELBO``
    of the model is ``Trace_ELBO`` of it with its enumerated sites summed
    out (and takes the per-observation scales that hold observations out)."""
    if isinstance(loss, TraceEnum_ELBO):
        return Trace_ELBO(num_particles=loss.num_particles)
    return loss
