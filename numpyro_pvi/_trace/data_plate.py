"""The data plate: which plate indexes the observations, and each observed
site's per-observation arrays along it.

Several observed sites at one index of the data plate form one observation.
The functions here find the plate and turn one site of a model trace into
arrays with the observations first: its log-likelihood ``(b,)`` (NumPyro's,
zero at masked components) and its handler scale ``(b, c)``; the site's
other values (simulated draws, the pmf over a finite support) are in
:mod:`~numpyro_pvi._trace.site_values`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.distributions import Distribution, Independent
from numpyro.distributions.batch_util import promote_batch_shape
from numpyro.handlers import condition, seed, substitute, trace

from numpyro_pvi._trace.imputed import imputed_density
from numpyro_pvi._trace.tracing import site_log_prob, sum_log_density

#: ``data_plate=WHOLE_DATA`` treats all observed sites as one observation,
#: without looking for a data plate.
WHOLE_DATA = "<whole data set>"


class DataPlate(NamedTuple):
    """The plate that indexes observations, as one trace shows it.

    A *batch plate* (``batch=True``) is a batch dimension of the observed
    values that no ``numpyro.plate`` declares (a model written without a
    plate): its elements are the observations, as NumPyro's
    ``log_likelihood`` treats them; its name is ArviZ's name of that
    dimension of the first observed site (``obs_dim_0``).
    """

    name: str | None  # None: no data plate, the data form one observation
    dim: int  # negative batch dim of the plate
    size: int  # full size N
    subsample_size: int  # b
    batch: bool = False  # a batch dimension, not a numpyro.plate

    @property
    def selector(self) -> str | int | None:
        """What finds this plate again as ``data_plate``: its name, or the
        batch dimension of a batch plate."""
        return self.dim if self.batch else self.name


def _batch_shape(site: dict[str, Any]) -> tuple[int, ...]:
    """The batch shape of a site's value (its event dims removed)."""
    shape = jnp.shape(site["value"])
    return shape[: max(len(shape) - site["fn"].event_dim, 0)]


def _frames(site: dict[str, Any]) -> set:
    return {f for f in site["cond_indep_stack"]}


def plate_of(model_trace: dict[str, Any], data_plate: str | int | None) -> DataPlate:
    """The data plate of a model trace.

    - ``data_plate`` a plate's name: that plate;
    - ``data_plate`` a negative integer: that batch dimension of the
      observed values (a batch plate, for models without a plate);
    - ``None``: the plate shared by every observed site that is inside a
      plate; when no observed site is, the rightmost batch dimension of the
      observed values (a batch plate; scalar observations are one
      observation);
    - ``WHOLE_DATA``: none, the data form one observation.

    Observed sites outside the data plate (e.g. a prior written as
    ``numpyro.sample("c", dist.Normal(0, 1), obs=latent)``) are terms of the
    joint density, not observations (:func:`data_sites`).
    """
    observed = observed_sites(model_trace)
    if not observed:
        raise ValueError(
            "The model has no observed site: predictive objectives and scores "
            "compare predictions with observations, so pass the data to a sample "
            "statement with obs=.... A model without data (a target density, "
            "e.g. a potential written as a distribution or numpyro.factor) is "
            "fitted by SoftCVIELBO, SNISForwardKL or Trace_ELBO, and checked "
            "with diagnostics.psis, report and to_inference_data."
        )
    if data_plate == WHOLE_DATA:
        return DataPlate(None, 0, 1, 1)
    if isinstance(data_plate, int):
        return _batch_plate(observed, data_plate)
    plates = {
        name: site for name, site in model_trace.items() if site["type"] == "plate"
    }
    if data_plate is not None:
        if data_plate not in plates:
            raise ValueError(
                f"data_plate='{data_plate}' is not a plate of the model; its plates "
                f"are {sorted(plates) or 'none'}. A model without a plate has its "
                "observations along a batch dimension: pass data_plate=-1 (or "
                "another negative dim)."
            )
        inside = [s for s in observed if data_plate in {f.name for f in _frames(s)}]
        if not inside:
            raise ValueError(
                f"No observed site is inside data_plate='{data_plate}' (observed "
                f"sites: {[s['name'] for s in observed]})."
            )
        frame = next(f for f in _frames(inside[0]) if f.name == data_plate)
    else:
        stacks = [_frames(s) for s in observed if s["cond_indep_stack"]]
        if not stacks:  # no plate: the observed values' batch dimension
            plate = _batch_plate(observed, -1)
            _warn_several_batch_dims(observed, plate)
            return plate
        shared = set.intersection(*stacks)
        if not shared:
            raise ValueError(
                "The observed sites are in plates that no one plate contains "
                + str({s["name"]: sorted(f.name for f in _frames(s)) for s in observed})
                + "; pass data_plate=... to say which plate indexes the "
                "observations (observed sites outside it are terms of the joint "
                "density)."
            )
        if len(shared) > 1:
            subsampled = [f for f in shared if plates[f.name]["args"][0] > f.size]
            if len(subsampled) != 1:
                raise ValueError(
                    "The observed sites share several plates "
                    f"{sorted(f.name for f in shared)}; pass data_plate=... to "
                    "say which one indexes the observations. At each of its "
                    "indices, the values along the other plates form one "
                    "observation, scored jointly (score='log' or 'energy'; the "
                    "CRPS compares one value per observation). To score every "
                    "value alone, observe them in one plate: the values "
                    "flattened (y.reshape(-1)) in a plate of that size, the "
                    "other plates' latents indexed by arrays of their indices."
                )
            shared = set(subsampled)
        (frame,) = shared
    full_size = int(plates[frame.name]["args"][0])
    return DataPlate(frame.name, frame.dim, full_size, int(frame.size))


def check_same_plate(
    model_trace: dict[str, Any],
    plate: DataPlate,
    data_plate: str | int | None,
    what: str,
) -> None:
    """Refuse an objective (``what``, for the message) whose ``data_plate``
    finds another plate than ``plate``, the one a procedure holds
    observations out of: its fits would score other observations."""
    try:
        own = plate_of(model_trace, data_plate).selector
    except ValueError:
        found = f"finds no data plate with data_plate={data_plate!r}"
    else:
        if own == plate.selector:
            return
        found = f"indexes the observations by {own!r}"
    raise ValueError(
        f"{what} {found}, and observations of data_plate={plate.selector!r} are "
        "held out: its fits would score other observations. Construct it with "
        f"data_plate={plate.selector!r}."
    )


def _batch_plate(observed: list[dict[str, Any]], dim: int) -> DataPlate:
    """The batch plate along batch dimension ``dim`` of the observed values;
    one observation when every observed value is a scalar (``dim = -1``)."""
    if dim >= 0:
        raise ValueError(
            f"data_plate={dim}: a batch dimension is given as a negative integer "
            "(-1: the rightmost batch dimension of the observed values)."
        )
    shapes = {s["name"]: _batch_shape(s) for s in observed}
    sizes = {name: shape[dim] for name, shape in shapes.items() if len(shape) >= -dim}
    if not sizes:
        if dim == -1:  # scalar observations: the data are one observation
            _warn_independent_event(observed)
            return DataPlate(None, 0, 1, 1)
        raise ValueError(
            f"data_plate={dim}: no observed value has that many batch dimensions "
            f"({shapes})."
        )
    if len(set(sizes.values())) > 1:
        raise ValueError(
            f"The observed sites differ in the size of batch dimension {dim} "
            f"({sizes}), so it cannot index observations. Put the observations "
            "in a numpyro.plate, or pass data_plate=... naming a plate or "
            "another batch dimension, or data_plate=numpyro_pvi.particles."
            "WHOLE_DATA to score all the data as one observation (as a series "
            "of dependent steps is)."
        )
    first = next(iter(sizes))
    size = sizes[first]
    name = f"{first}_dim_{len(shapes[first]) + dim}"
    return DataPlate(name, dim, size, size, batch=True)


def _warn_several_batch_dims(observed: list[dict[str, Any]], plate: DataPlate) -> None:
    """Warn where a model without a plate observes values of several batch
    dimensions: the observations are taken along the rightmost, which may
    not be the one the user means (time steps in rows, series in columns)."""
    for site in observed:
        shape = _batch_shape(site)
        if sum(n > 1 for n in shape[:-1]) == 0:
            continue
        others = " or ".join(
            f"data_plate={-d}" for d in range(2, len(shape) + 1) if shape[-d] > 1
        )
        warnings.warn(
            f"The observed site '{site['name']}' (batch shape {shape}) is in no "
            "plate, so its observations are taken along its rightmost batch "
            f"dimension: {plate.size} observations of "
            f"{math.prod(shape[:-1])} values each, each scored by its joint "
            "predictive. If the observations run along another dimension, pass "
            f"{others}; to make each value an "
            "observation, put the values, flattened to one dimension, in a "
            "numpyro.plate. Passing data_plate=-1 keeps this choice and "
            "silences this warning.",
            UserWarning,
            stacklevel=2,
        )


def _warn_independent_event(observed: list[dict[str, Any]]) -> None:
    """Warn where the one observation of a model without a plate holds the
    values of an ``Independent`` likelihood (``.to_event(1)``): they are
    conditionally independent, so they may be meant as observations, which
    a plate declares."""
    for site in observed:
        fn = site["fn"]
        if isinstance(fn, Independent) and fn.event_shape and fn.shape() != (1,):
            warnings.warn(
                f"The observed site '{site['name']}' ({type(fn.base_dist).__name__}"
                f"(...).to_event({fn.reinterpreted_batch_ndims}), event shape "
                f"{fn.event_shape}) is in no plate, so its values form one "
                "observation, scored by their joint predictive (as NumPyro's "
                "log_likelihood counts them). If they are separate observations, "
                "declare them with a plate instead of .to_event: with "
                f"numpyro.plate('data', {fn.event_shape[0]}): numpyro.sample("
                f"'{site['name']}', dist.{type(fn.base_dist).__name__}(...), obs=...).",
                UserWarning,
                stacklevel=2,
            )


def data_sites(
    observed: list[dict[str, Any]], plate: DataPlate
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The observed sites split into the observations' sites (inside the
    data plate) and the other observed sites, which are terms of the joint
    density (scored by none of the predictive scores), with the imputed
    entries of sites that have them
    (:func:`~numpyro_pvi._trace.imputed.imputed_density`)."""
    if plate.name is None:
        return observed, imputed_density(observed)
    if plate.batch:
        inside = [
            s
            for s in observed
            if len(_batch_shape(s)) >= -plate.dim
            and _batch_shape(s)[plate.dim] == plate.size
        ]
    else:
        inside = [s for s in observed if plate.name in {f.name for f in _frames(s)}]
    names = {s["name"] for s in inside}
    outside = [s for s in observed if s["name"] not in names]
    return inside, outside + imputed_density(observed)


def find_data_plate(
    model_trace: dict[str, Any], data_plate: str | int | None
) -> str | None:
    """The name of the data plate of a model trace (``None``: the data form one
    observation), found as :func:`particle_terms` finds it."""
    return plate_of(model_trace, data_plate).name


def plate_axis_first(
    x: jax.Array | np.ndarray, plate: DataPlate, event_ndim: int, xp: Any = jnp
) -> jax.Array:
    """Move the data-plate axis of ``x`` (batch + event dims) to the front and
    broadcast it to the subsample size; returns shape ``(b, rest...)``.
    ``xp=numpy`` keeps a constant a (concrete) NumPy array under ``jit``."""
    x = xp.asarray(x)
    axis = plate.dim - event_ndim  # negative axis in the full shape
    if x.ndim < -axis:
        x = xp.reshape(x, (1,) * (-axis - x.ndim) + x.shape)
    x = xp.moveaxis(x, axis, 0)
    return xp.broadcast_to(x, (plate.subsample_size,) + x.shape[1:])


def per_observation(
    x: jax.Array | np.ndarray, plate: DataPlate, event_ndim: int, xp: Any = jnp
) -> jax.Array:
    """``(b, d)``: one flattened row per observation (``(1, d)`` without a
    data plate: the data form one observation)."""
    if plate.name is None:
        return xp.reshape(xp.asarray(x), (1, -1))
    x = plate_axis_first(x, plate, event_ndim, xp)
    return xp.reshape(x, (plate.subsample_size, -1))


# --------------------------------------------------------------------------
# per-site extraction
# --------------------------------------------------------------------------


def site_log_lik(site: dict[str, Any], plate: DataPlate) -> tuple[jax.Array, jax.Array]:
    """``(b,)`` log-likelihood of each observation, unscaled and with the
    site's own scale applied (``(1,)`` without a data plate)."""
    log_prob, scaled = site_log_prob(site)
    if plate.name is None:
        return jnp.sum(log_prob)[None], jnp.sum(scaled)[None]
    return (
        jnp.sum(per_observation(log_prob, plate, 0), axis=1),
        jnp.sum(per_observation(scaled, plate, 0), axis=1),
    )


def _site_scale_rows(site: dict[str, Any], plate: DataPlate, xp: Any) -> jax.Array:
    """``(b, c)``: the site's scale at each scalar component of each
    observation (``(1, c)`` without a data plate), computed with ``xp``."""
    # the batch shape from shapes alone: a likelihood-free site has no log_prob
    fn, value = site["fn"], site["value"]
    batch_shape = jnp.broadcast_shapes(
        fn.batch_shape, jnp.shape(value)[: max(jnp.ndim(value) - fn.event_dim, 0)]
    )
    scale = site["scale"]
    scale = xp.broadcast_to(
        xp.asarray(1.0 if scale is None else scale, dtype=float), batch_shape
    )
    return per_observation(scale, plate, 0, xp)


def observation_weight(observed: list[dict[str, Any]], plate: DataPlate) -> jax.Array:
    """``(b,)`` the scale shared by every observed site of each observation.

    A predictive score is a function of the whole observation, so it can be
    weighted by one number only: scales that differ between the sites (or
    the components) of one observation have no single meaning. Constant
    scales (the usual case, subsample scales included) are compared when
    the model is traced and refused with an error naming the sites and their
    scales. Scales that are traced values (computed from a model argument
    under ``jit``) can only be compared when the program runs: an
    observation whose sites' scales differ then gets a NaN weight, so the
    loss is NaN rather than a wrong number.
    """
    if any(isinstance(s["scale"], jax.core.Tracer) for s in observed):
        rows = jnp.concatenate([_site_scale_rows(s, plate, jnp) for s in observed], 1)
        equal = jnp.all(rows == rows[:, :1], axis=1)
        return jnp.where(equal, rows[:, 0], jnp.nan)
    site_rows = [_site_scale_rows(s, plate, np) for s in observed]
    values = np.concatenate(site_rows, axis=1)
    if not np.allclose(values, values[:, :1], rtol=1e-6, atol=0.0):
        per_site = {
            s["name"]: np.unique(r).round(6).tolist()
            for s, r in zip(observed, site_rows, strict=True)
        }
        raise ValueError(
            "The observed sites of one observation have different scales "
            f"({per_site}; subsample scale included): a predictive score is a "
            "function of the whole observation and can be weighted by one "
            "number only. Apply numpyro.handlers.scale to all sites of an "
            "observation alike, or score the sites separately (one data plate "
            "per site). The ELBO, PSIS and to_inference_data accept such models."
        )
    return jnp.asarray(values[:, 0])


def joint_log_likelihood(
    model: Callable, inject: Callable[[dict], tuple[tuple, dict]]
) -> Callable[[dict, dict], jax.Array]:
    r"""``f(θ, y) = log p(y | θ)``: every observed site's log density at the
    data set ``y`` given the latent values ``θ``, with the handler scales the
    model applies (the likelihood part of :func:`numpyro.infer.util.log_density`).

    :param model: the model.
    :param inject: ``y -> (args, kwargs)`` that passes a data set to it.
    """

    def log_lik(theta: dict, data: dict) -> jax.Array:
        args, kwargs = inject(data)
        conditioned = substitute(condition(model, data), data=theta)
        tr = trace(seed(conditioned, rng_seed=0)).get_trace(*args, **kwargs)
        return sum_log_density(observed_sites(tr))

    return log_lik


def observed_sites(tr: dict[str, Any]) -> list[dict[str, Any]]:
    """The observed sample sites of a trace, in order, each with the law its
    simulated values follow (:func:`simulation_law`)."""
    return [
        {**s, "fn": simulation_law(s)}
        for s in tr.values()
        if s["type"] == "sample" and s["is_observed"]
    ]


#: the key NumPyro's ``scan`` puts in the ``infer`` of every site of its body
SCAN_INDEX = "_scan_current_index"


def scan_promoted(fn: Distribution) -> Distribution:
    """``fn`` with the batch shapes of the distributions inside it (a
    Student-t's chi-square, a LogNormal's Normal, a wrapper's base) read
    from their parameters. NumPyro's ``scan`` stacks a body site's
    distributions along a leading axis and promotes the outer one's batch
    shape only; the inner ones keep one step's, and their sampler then draws
    one noise shared by every step (a LogNormal, a HalfNormal) or fails on
    the shapes (a Student-t)."""
    fn = promote_batch_shape(fn)
    for name, value in vars(fn).items():
        if isinstance(value, Distribution):
            setattr(fn, name, scan_promoted(value))
    return fn


def simulation_law(msg: dict[str, Any]) -> Distribution:
    """The law an observed site's simulated values follow: its distribution
    broadcast to the batch shape of the values it observes (a likelihood
    written ``Normal(mu, sigma)`` with scalar parameters, observing a vector
    in no plate, draws one value where it observes many), and promoted
    where the site is in the body of a ``scan`` (:func:`scan_promoted`)."""
    fn, value = msg["fn"], msg["value"]
    if not isinstance(fn, Distribution):  # the static structure's stand-in
        return fn
    if SCAN_INDEX in msg.get("infer", {}):
        fn = scan_promoted(fn)
    if value is None:
        return fn
    batch = jnp.shape(value)[: max(jnp.ndim(value) - fn.event_dim, 0)]
    shape = jnp.broadcast_shapes(fn.batch_shape, batch)
    return fn if shape == fn.batch_shape else fn.expand(shape)
