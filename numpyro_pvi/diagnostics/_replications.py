"""The replications of VSBC: one SVI fit per simulated data set, mapped
sequentially, vectorised or sharded over the local devices, in chunks."""

from __future__ import annotations

import contextlib
import inspect
import math
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr
from jax import lax, random
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from numpyro.distributions import (
    Distribution,
    ExpandedDistribution,
    Independent,
    MaskedDistribution,
)
from numpyro.handlers import block, condition, seed, trace
from numpyro.infer import SVI, Predictive
from numpyro.primitives import Messenger

from numpyro_pvi._arviz.idata import draws_dataset
from numpyro_pvi._trace.data_plate import simulation_law
from numpyro_pvi._trace.enumeration import marginalized, summed_out_loss
from numpyro_pvi._trace.imputed import imputed_entries
from numpyro_pvi._trace.numpyro_private import resolve_observed_sites
from numpyro_pvi._trace.recipes import Replications
from numpyro_pvi._trace.site_laws import censoring_refusal
from numpyro_pvi._trace.structure import latent_dependent_observations
from numpyro_pvi._trace.tracing import obs_mask_site
from numpyro_pvi._trace.validation import check_real
from numpyro_pvi.distributions import simulators_without_density
from numpyro_pvi.objectives.svi_scan import drift, svi_scan, svi_scan_until_flat

#: Number of chunks the replications are split into when a progress bar is shown.
_PROGRESS_CHUNKS = 10
_AXIS = "replication"


def replication_fn(
    model: Callable,
    guide: Callable,
    optim: Any,
    loss: Any,
    inject: Callable,
    latent_names: Sequence[str],
    num_svi_steps: int,
    num_draws: int,
    quantities: Mapping[str, Callable] | None = None,
    drawn: frozenset[str] = frozenset(),
    stop_early: bool = False,
) -> Callable:
    """``(key, data, θ*) -> (#{draws < θ*}, final loss, mean of the last 10%
    losses, loss drift)``; the enumerated sites not ``drawn`` by the guide
    are summed out of the fits.

    The counts are integers: ``p = count / num_draws`` lies on an exact grid,
    which the symmetry test needs to recognise ties between ``p`` and ``1 - p``.
    Each test quantity ``f`` of ``quantities`` (a function of the latent
    values and the data set) is counted too: ``#{f(θ_l, y) < f(θ*, y)}``.
    The drift is ``loss_drift`` of the losses.
    """
    quantities = dict(quantities or {})

    def one(inputs: tuple) -> tuple:
        key, data, theta = inputs
        key_svi, key_draw = random.split(key)
        args, kwargs = inject(data)
        # enumerated sites summed out (TraceEnum_ELBO as Trace_ELBO of that)
        params, fit = fit_replication(
            key_svi,
            marginalized(model, drawn, data=data),
            guide,
            optim,
            summed_out_loss(loss),
            args,
            kwargs,
            num_svi_steps=num_svi_steps,
            stop_early=stop_early,
        )
        draws = Predictive(
            guide,
            params=params,
            num_samples=num_draws,
            return_sites=list(latent_names),
            parallel=True,
        )(key_draw, *args, **kwargs)
        below = {n: jnp.sum(draws[n] < theta[n], axis=0) for n in latent_names}
        for name, f in quantities.items():
            at_draws = jax.vmap(lambda th, f=f: f(th, data))(draws)
            below[name] = jnp.sum(at_draws < f(theta, data), axis=0)
        return (below, *fit)

    return one


def fit_replication(
    rng_key: jax.Array,
    model: Callable,
    guide: Callable,
    optim: Any,
    loss: Any,
    args: tuple,
    kwargs: dict,
    *,
    num_svi_steps: int,
    stop_early: bool = False,
) -> tuple[dict, tuple[jax.Array, jax.Array, jax.Array]]:
    """One replication's fit, from the guide's initial parameters:
    ``num_svi_steps`` SVI steps in one ``lax.scan`` (with ``stop_early``, at
    most that many, stopped by the stopping rule).

    :return: the fitted parameters and ``(final loss, mean of the last 10%
        losses, loss drift)`` (with ``stop_early``, of the steps taken, and
        the drift of the rule's last two blocks).
    """
    svi = SVI(model, guide, optim, loss)
    state = svi.init(rng_key, *args, **kwargs)
    tail = max(1, num_svi_steps // 10)
    if not stop_early:
        state, losses = svi_scan(
            svi, state, num_steps=num_svi_steps, args=args, kwargs=kwargs
        )
        stats = (losses[-1], jnp.mean(losses[-tail:]), loss_drift(losses))
        return svi.get_params(state), stats
    state, losses, done, last_drift = svi_scan_until_flat(
        svi, state, num_steps=num_svi_steps, args=args, kwargs=kwargs
    )
    tail_losses = lax.dynamic_slice(losses, (done - tail,), (tail,))
    stats = (losses[done - 1], jnp.mean(tail_losses), last_drift)
    return svi.get_params(state), stats


#: Replications whose loss drift exceeds this many standard errors have not
#: converged.
DRIFT_THRESHOLD = 3.0
#: Fraction of unconverged replications above which vsbc warns.
UNCONVERGED_WARNING = 0.1


def loss_drift(losses: jax.Array) -> jax.Array:
    r"""How far a fit still was from convergence at its end.

    With :math:`t = \max(2, \lfloor n/10 \rfloor)` and the means
    :math:`\bar L_{\rm prev}`, :math:`\bar L_{\rm last}` of the last two
    blocks of :math:`t` losses, the decrease of the mean loss over the last
    tenth of the steps in standard errors,

    .. math::

        d = \frac{\bar L_{\rm prev} - \bar L_{\rm last}}
        {\sqrt{(s^2_{\rm prev} + s^2_{\rm last}) / t}},

    is of order one for a fit that fluctuates around its optimum and large
    while the loss still falls (``nan`` with fewer than 4 steps). The
    denominator has a floor of :math:`10^{-5}(1 + |\bar L_{\rm last}|)`
    for losses without Monte Carlo noise.

    :param losses: ``(n,)`` the losses of the SVI steps.
    """
    n = losses.shape[0]
    if n < 4:
        return jnp.asarray(jnp.nan, losses.dtype)
    t = min(max(2, n // 10), n // 2)
    prev, last = losses[-2 * t : -t], losses[-t:]
    return drift(
        (jnp.mean(prev), jnp.var(prev, ddof=1)),
        (jnp.mean(last), jnp.var(last, ddof=1)),
        t,
    )


def dispatcher(one: Callable, chain_method: str | Callable) -> Callable:
    """Compile-once map of ``one`` over the leading axis of its input pytree.

    ``"sharded"`` places the batch over all local devices (a 1-axis mesh) and
    maps each device's replications with ``vmap``; the batch size must be a
    multiple of the device count.
    """
    if chain_method == "sequential":
        return jax.jit(lambda xs: lax.map(one, xs))
    if chain_method == "vectorized":
        return jax.jit(jax.vmap(one))
    if callable(chain_method):
        return jax.jit(chain_method(one))
    mesh = Mesh(np.asarray(jax.local_devices()), (_AXIS,))
    spec = PartitionSpec(_AXIS)
    sharding = NamedSharding(mesh, spec)
    # Each device maps its own replications; there are no collectives.
    # (The varying-axes check is off: with it on, JAX 0.10 gave results that
    # differed from ``vmap`` for SVI loops inside ``lax.scan``.)
    sharded = jax.jit(
        jax.shard_map(
            jax.vmap(one), mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False
        )
    )
    return lambda xs: sharded(jax.device_put(xs, sharding))


#: What JAX raises where Python or NumPy meets a traced value.
TRACER_ERRORS = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerArrayConversionError,
    jax.errors.TracerBoolConversionError,
    jax.errors.TracerIntegerConversionError,
)


def traced_argument_error(desc: str, err: Exception) -> ValueError:
    """What JAX's error of Python on a traced value (``err``, one of
    :data:`TRACER_ERRORS`) means while fitting simulated data sets, and the
    remedy."""
    return ValueError(
        f"{desc}: the model ran Python or NumPy on a traced value while "
        f"fitting a simulated data set ({type(err).__name__}). The "
        "simulated data sets reach the model through its arguments named "
        "after observed sites, as traced arrays, and a model that reads "
        "such an argument with NumPy (np.isnan, np.unique), len() or an if "
        "cannot take them. The observed sites are conditioned on the "
        "simulated data in any case: unless the guide reads the data, keep "
        "the model's own arguments with Replications("
        "simulated_data_to_args=lambda data, *args, **kwargs: "
        "(args, kwargs))."
    )


@contextlib.contextmanager
def _traced_arguments(desc: str) -> Iterator[None]:
    try:
        yield
    except TRACER_ERRORS as err:
        raise traced_argument_error(desc, err) from err


def run_replications(
    one: Callable,
    inputs: Any,
    replications: Replications,
    *,
    desc: str = "VSBC",
    function: str = "vsbc",
) -> Any:
    """Map ``one`` over the leading axis of ``inputs`` in equal, padded chunks,
    as ``replications`` says (``desc`` labels the progress bar, ``function``
    names the caller in errors).

    The replication count is padded (by repeating the last replication) to a
    whole number of chunks, each a multiple of the device count when sharded,
    so every chunk has one shape and compiles once; padded results are
    dropped. Every replication has its own key and data, so the result does
    not depend on the chunking.
    """
    from tqdm.auto import tqdm

    num, chain_method = replications.num_simulations, replications.chain_method
    chunk_size, progress_bar = replications.chunk_size, replications.progress_bar
    num_devices = jax.local_device_count() if chain_method == "sharded" else 1
    if chunk_size is None:
        chunk_size = math.ceil(num / _PROGRESS_CHUNKS) if progress_bar else num
    chunk_size = math.ceil(min(chunk_size, num) / num_devices) * num_devices
    num_chunks = math.ceil(num / chunk_size)
    pad = num_chunks * chunk_size - num
    if pad:
        inputs = jax.tree.map(
            lambda x: jnp.concatenate([x, jnp.repeat(x[-1:], pad, axis=0)]), inputs
        )
    run = dispatcher(one, chain_method)
    outputs = []
    with tqdm(
        total=num, disable=not progress_bar, desc=desc, unit="replication"
    ) as bar:
        for c in range(num_chunks):
            chunk = jax.tree.map(
                lambda x, c=c: x[c * chunk_size : (c + 1) * chunk_size], inputs
            )
            with _traced_arguments(function):
                outputs.append(jax.device_get(run(chunk)))
            bar.update(min(chunk_size, num - c * chunk_size))
    return jax.tree.map(lambda *xs: np.concatenate(xs)[:num], *outputs)


def fit_stats(
    final_loss: np.ndarray,
    tail_loss: np.ndarray,
    drift: np.ndarray,
    attrs: dict,
    *,
    function: str,
    group: str,
    stacklevel: int = 3,
) -> xr.Dataset:
    """The fit statistics of the replications (``loss``, ``loss_tail``,
    ``loss_drift``, ``converged``) for the result's ``group``; warns, naming
    ``function``, when too many
    had not converged (attribute ``num_unconverged``); ``stacklevel`` points
    the warning at the user's call."""
    num_simulations = drift.shape[0]
    converged = ~(drift > DRIFT_THRESHOLD)  # nan (too few steps) counts as converged
    num_unconverged = int(np.sum(~converged))
    if num_unconverged > UNCONVERGED_WARNING * num_simulations:
        warnings.warn(
            f"{function}: {num_unconverged} of {num_simulations} replications had not "
            f"converged after {attrs['num_svi_steps']} SVI steps (loss still "
            f"falling by more than {DRIFT_THRESHOLD:g} standard errors over the "
            f"last tenth of the steps, loss_drift of the {group} group): their "
            "ranks measure an unfinished fit, not the method. Increase "
            "Replications(num_svi_steps=...) or the step size.",
            UserWarning,
            stacklevel=stacklevel,
        )
    return draws_dataset(
        {
            "loss": final_loss,
            "loss_tail": tail_loss,
            "loss_drift": drift,
            "converged": converged,
        },
        attrs={
            **attrs,
            "drift_threshold": DRIFT_THRESHOLD,
            "num_unconverged": num_unconverged,
        },
    )


_CORRECTIONS = ("holm", "bh", None)


def check_verdict(function: str, correction: Any, alpha: Any) -> None:
    """Refuse a multiplicity correction or a level the tests do not know."""
    if correction not in _CORRECTIONS:
        raise ValueError(
            f"{function}: correction must be 'holm', 'bh' or None, got {correction!r}."
        )
    check_real(
        alpha, "alpha", function, low=0.0, high=1.0, low_open=True, high_open=True
    )


class unobserve(Messenger):
    """Sample the named sites from the model even when they are observed."""

    def __init__(self, fn: Callable, names: Sequence[str]) -> None:
        self.names = frozenset(names)
        super().__init__(fn)

    def process_message(self, msg: dict[str, Any]) -> None:
        if msg["type"] == "sample" and msg["name"] in self.names:
            msg["fn"] = simulation_law(msg)
            msg["value"] = None
            msg["is_observed"] = False


def data_injector(
    model: Callable,
    observed: Sequence[str],
    args: tuple,
    kwargs: dict,
    simulated_data_to_args: Callable | None,
    model_trace: dict | None = None,
    function: str = "",
) -> Callable[[dict], tuple[tuple, dict]]:
    """Return ``data -> (args, kwargs)`` that passes simulated data to the model.

    An observed site whose name is a parameter of ``model`` receives its
    simulated value through that argument (so a guide that reads the data sees
    the simulated data); every observed site is also conditioned on, which
    overrides any ``obs=`` the model was called with. With ``model_trace``,
    an argument whose shape is not its observed site's is refused (naming
    ``function``), with ``simulated_data_to_args`` as the remedy.
    """
    if simulated_data_to_args is not None:
        if not callable(simulated_data_to_args):
            raise TypeError("Replications: simulated_data_to_args must be callable.")

        def inject_custom(data: dict) -> tuple[tuple, dict]:
            out = simulated_data_to_args(data, *args, **kwargs)
            if not (isinstance(out, tuple) and len(out) == 2):
                raise ValueError(
                    "Replications: simulated_data_to_args must return a pair "
                    "(args, kwargs)."
                )
            return tuple(out[0]), dict(out[1])

        return inject_custom

    try:
        signature = inspect.signature(model)
    except (TypeError, ValueError):  # builtins, some callables
        return lambda data: (args, kwargs)
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    names = [
        n
        for n in observed
        if n in signature.parameters and signature.parameters[n].kind in kinds
    ]
    if model_trace is not None:
        _check_argument_shapes(signature, names, model_trace, args, kwargs, function)

    def inject(data: dict) -> tuple[tuple, dict]:
        if not names:
            return args, kwargs
        bound = signature.bind_partial(*args, **kwargs)
        for n in names:
            bound.arguments[n] = data[n]
        return tuple(bound.args), dict(bound.kwargs)

    return inject


def _check_argument_shapes(
    signature: inspect.Signature,
    names: Sequence[str],
    model_trace: dict,
    args: tuple,
    kwargs: dict,
    function: str,
) -> None:
    """Raise when the model's argument named after an observed site is not
    that site's observed value (NumPyro's AR(2) example takes the series
    ``y`` and observes ``y[2:]``): a simulated data set passed through it
    would not fit, and the model would mix simulated and real values."""
    bound = signature.bind_partial(*args, **kwargs).arguments
    for name in names:
        if bound.get(name) is None:
            continue
        given, observed = np.shape(bound[name]), np.shape(model_trace[name]["value"])
        if given != observed:
            raise ValueError(
                f"{function}: the model's argument '{name}' has shape {given}, "
                f"but its observed site '{name}' has shape {observed}, so a "
                "simulated data set cannot be passed through that argument as "
                "it is. Pass replications=Replications(simulated_data_to_args="
                "f), with f(data, *args, **kwargs) -> (args, kwargs) building "
                f"the model's arguments from a simulated data set (data['{name}'] "
                "has the observed site's shape), or giving each fit the "
                "arguments the data sets were simulated with, f = lambda data, "
                "*args, **kwargs: (args, kwargs) (the observed sites are "
                "conditioned on the simulated data in any case)."
            )


def generated_data(
    key: jax.Array,
    num: int,
    model: Callable,
    observed: Sequence[str],
    model_trace: dict,
    data_generator: Callable | None,
    args: tuple,
    kwargs: dict,
    *,
    function: str,
) -> dict[str, jax.Array]:
    """``num`` data sets: the model's prior predictive, or the generator's
    (``rng_key -> {observed site: value}``, called once per data set outside
    ``jit``, checked against the shapes the model observes)."""
    if data_generator is None:
        prior = Predictive(
            unobserve(model, observed),
            num_samples=num,
            return_sites=list(observed),
            parallel=True,
        )
        return jax.jit(lambda k: prior(k, *args, **kwargs))(key)
    if not callable(data_generator):
        raise TypeError(f"{function}: data_generator must be callable f(rng_key).")
    sets = [data_generator(k) for k in random.split(key, num)]
    for name in observed:
        expected = np.shape(model_trace[name]["value"])
        got = [np.shape(s[name]) if name in s else None for s in sets[:1]]
        if got[0] != expected:
            raise ValueError(
                f"{function}: data_generator must return a dict with the observed "
                f"site '{name}' of shape {expected} (as the model observes it), "
                f"got {'no such key' if got[0] is None else got[0]}."
            )
    return {n: jnp.stack([jnp.asarray(s[n]) for s in sets]) for n in observed}


def resolve_sites(
    model_trace: dict,
    observed_sites: Sequence[str] | None,
    *,
    function: str,
    model: Callable,
    args: tuple,
    kwargs: dict,
    prior_draws: bool = True,
) -> tuple[list[str], list[str]]:
    """The observed (data) and latent site names, as NumPyro's VSBC
    resolves them, or an error naming ``function`` and what to pass.

    Observed sites whose value changes with the latent draws (a prior
    written as an observed site) are terms of the joint density, not data:
    they are neither simulated nor passed. ``prior_draws``: the procedure
    draws the latents from the prior, which an improper prior refuses, and
    so does such a term (the prior's draws do not see it).
    """
    for name in model_trace:
        base = obs_mask_site(name, model_trace)
        if base is not None:
            raise ValueError(
                f"{function}: the model's site '{base}' uses obs_mask=, so its "
                f"missing entries are the latent site '{name}', whose observed "
                "entries have no density: prior draws of them are not draws of "
                f"the model, and a refit cannot be ranked there. {function} "
                "simulates complete data sets: call it with the model's "
                "arguments for complete data (obs_mask=None)."
            )
    refuse_censored(model_trace, function)
    improper = [
        name
        for name, site in model_trace.items()
        if site["type"] == "sample" and not site["is_observed"] and site["fn"].improper
    ]
    if improper and prior_draws:
        instead = (
            "pass replications=Replications(data_generator=...) (data sets from "
            "a process of your own: no prior draws are needed)"
            if function == "predictive_calibration"
            else "VSBC compares fits with the prior's draws, so give it a proper "
            "prior, or check the predictive calibration of the fits with "
            "predictive_calibration(..., replications=Replications("
            "data_generator=...)), which needs none"
        )
        raise ValueError(
            f"{function}: the latent site '{improper[0]}' has an improper prior "
            "(ImproperUniform), which has no draws to simulate data sets from; "
            f"{instead}."
        )
    sites = model_trace.values()
    if observed_sites is None and not any(
        site["type"] == "sample" and site["is_observed"] for site in sites
    ):
        raise ValueError(
            f"{function}: the model, called with these arguments, has no "
            "observed site. If it observes data when given them, pass the data "
            "as for SVI, or name the sites it simulates with observed_sites=[...]. "
            f"A model without data (a target density) has no data sets for "
            f"{function} to simulate and fit: check it with diagnostics.psis or "
            "report (k̂ of the guide against it)."
        )
    try:
        observed, latent = resolve_observed_sites(model_trace, observed_sites)
    except ValueError as err:
        raise ValueError(
            f"{function}: {err} Pass the observed data as for SVI, or name the "
            "observed sites with `observed_sites=`."
        ) from None
    density_terms = latent_dependent_observations(model, args, kwargs)
    refuse_imputed(model, args, kwargs, density_terms, function)
    if prior_draws:
        refuse_density_terms(density_terms, function)
        refuse_tempered_priors(model_trace, function)
    if observed_sites is None:
        observed = [name for name in observed if name not in density_terms]
    refuse_factors(model_trace, observed, function, prior_draws)
    refuse_unsampled(model_trace, observed, function)
    return list(observed), list(latent)


def set_up_guide(
    guide: Callable, rng_key: jax.Array, inject: Callable, data: dict, function: str
) -> frozenset[str]:
    """Run ``guide`` once on the first simulated data set, outside any trace:
    an autoguide sets up its prototype on its first call, which must not
    happen under ``jit``/``vmap`` (it stores concrete initial values). A
    failure there is NumPyro's own (``SVI.init`` fails alike) and is
    re-raised with the stage and what to try.

    :return: the sample sites the guide draws (an enumerated site among
        them is not summed out of the fits)."""
    with simulators_without_density(), block():
        args, kwargs = inject({name: value[0] for name, value in data.items()})
        try:
            tr = trace(seed(guide, rng_key)).get_trace(*args, **kwargs)
        except Exception as err:
            raise ValueError(
                f"{function}: the guide's set-up on the first simulated data set "
                f"failed ({type(err).__name__}: {err}). An autoguide runs the "
                "model at prior draws and at its initial values to set itself "
                "up, as SVI.init does on the same data; a model "
                "whose numerics fail at some of those draws (an ODE that "
                "diverges, a log of a negative value) fails for some keys. Make "
                "the model robust there (a tighter prior, clipped values), or "
                "pass another rng_key."
            ) from err
    return frozenset(n for n, site in tr.items() if site["type"] == "sample")


def refuse_imputed(
    model: Callable, args: tuple, kwargs: dict, dependent: list[str], function: str
) -> None:
    """Raise where an observed site fills missing entries of its data with
    latent draws (:func:`~numpyro_pvi._trace.imputed.imputed_entries`), as
    ``obs_mask=`` does: the procedures simulate complete data sets."""
    imputed = imputed_entries(model, args, kwargs, dependent) if dependent else {}
    for name, entries in (imputed or {}).items():
        raise ValueError(
            f"{function}: the model's site '{name}' fills {int(entries.sum())} "
            "missing entries of its data with latent draws (imputed values), "
            f"and {function} simulates complete data sets, which the "
            "imputation does not describe. Check the fitting procedure on the "
            "model of complete data (without the imputed site), and this fit "
            "with diagnostics.psis and predictive_score, which take it."
        )


def refuse_density_terms(dependent: list[str], function: str) -> None:
    """Raise, naming the site, at an observed site whose value is computed
    from the latent draws when the procedure draws the latents from the
    prior: like a ``numpyro.factor``, it is a term of the joint density that
    the prior's draws do not see, so neither those draws nor the data sets
    simulated from them would be the model's (an exact fit would look
    miscalibrated)."""
    for name in dependent:
        instead = (
            ", or pass replications=Replications(data_generator=...) (data "
            "sets from a process of your own: no prior draws are needed, and "
            "the fits keep the term)"
            if function == "predictive_calibration"
            else ""
        )
        raise ValueError(
            f"{function}: the observed site '{name}' observes a value computed "
            "from the latent draws (a prior written as an observed site, or a "
            "residual such as obs=y - mu), a term of the model's log density "
            f"that no draw simulates: {function} draws the latents from the "
            "sample sites' priors, which do not see it, so those draws and the "
            "data sets simulated from them would not be the model's, and an "
            "exact fit would look miscalibrated. Write the term into the "
            "distributions (the latent site's own prior; dist.Normal(mu, "
            "sigma), obs=y rather than dist.Normal(0, sigma), obs=y - mu)"
            f"{instead}. diagnostics.psis checks a fit of the model as it is."
        )


def refuse_tempered_priors(model_trace: dict, function: str) -> None:
    """Raise, naming the site, at a latent site with a handler scale other
    than 1 (``numpyro.handlers.scale`` on a prior, as in consensus Monte
    Carlo's subposteriors): its density is the tempered prior
    p(theta)^s, whose draws are not the distribution's."""
    for name, site in model_trace.items():
        if site["type"] == "sample" and not site["is_observed"] and site["tempered"]:
            instead = (
                ", or pass replications=Replications(data_generator=...) (data "
                "sets from a process of your own: no prior draws are needed)"
                if function == "predictive_calibration"
                else ""
            )
            raise ValueError(
                f"{function}: the latent site '{name}' has a handler scale "
                "(numpyro.handlers.scale) other than 1, so the model's prior "
                "density is the tempered p(theta)^scale, while "
                f"{function} draws the latents from the site's distribution: "
                "those draws and the data sets simulated from them would not "
                "be the model's, and an exact fit would look miscalibrated. "
                "Call it with the model's prior unscaled (scale=1), or give "
                f"the site the prior the scale stands for{instead}."
            )


#: Why a procedure on simulated data sets cannot take a censored likelihood,
#: and what works instead.
_CENSORED_REMEDY = {
    "vsbc": "VSBC fits data sets simulated with that sampler, which are not "
    "data sets of the model. Run vsbc on the model with the uncensored "
    "likelihood (the censored distribution's base_dist): it checks the same "
    "fitting procedure on complete data.",
    "predictive_calibration": "The PIT ranks each observation among "
    "simulated outcomes, which would be wrong here whatever simulates the "
    "data sets. Compare fits by their held-out log score instead "
    "(cross_validate, predictive_score), or run predictive_calibration on the "
    "model with the uncensored likelihood (the censored distribution's "
    "base_dist).",
}


def refuse_censored(model_trace: dict, function: str) -> None:
    """Raise, naming the site, when an observed site is censored."""
    for name, site in model_trace.items():
        family = site["fn"].censored if site["type"] == "sample" else None
        if site["is_observed"] and family is not None:
            raise ValueError(
                f"{function}: {censoring_refusal(name, family)} "
                + _CENSORED_REMEDY[function]
            )


def refuse_factors(
    model_trace: dict, observed: Sequence[str], function: str, prior_draws: bool
) -> None:
    """Raise, naming the site, at a ``numpyro.factor`` that the simulated data
    sets cannot honour: one in a plate among the data (a likelihood term,
    no outcome to simulate), or any other when it is simulated or the
    procedure draws the latents from the prior (the draws do not see it)."""
    for name, site in model_trace.items():
        if site["type"] != "sample" or not site["fn"].factor:
            continue
        if name in observed and site["cond_indep_stack"]:
            raise ValueError(
                f"{function}: the observed site '{name}' is a numpyro.factor, "
                "a term of the log density with no outcome to simulate, so the "
                "model has no simulated data sets. Write the likelihood as an "
                "observed sample site (numpyro.sample(name, distribution, "
                "obs=y)), whose outcomes it simulates."
            )
        if name in observed or prior_draws:
            instead = (
                ", or pass replications=Replications(data_generator=...) "
                "(data sets from a process of your own: no prior draws are "
                "needed)"
                if function == "predictive_calibration" and name not in observed
                else ""
            )
            raise ValueError(
                f"{function}: the model's numpyro.factor site '{name}' is a "
                "term of its log density that no draw simulates: draws from "
                "the sample sites' priors do not see it, so the simulated data "
                "sets would not be the model's. Write that term as the "
                "distribution of a sample site (an observed one for a "
                f"likelihood){instead}."
            )


def refuse_unsampled(model_trace: dict, observed: Sequence[str], function: str) -> None:
    """Raise, naming the site, when an observed site's distribution has no
    sampler: the procedure simulates its outcomes."""
    for name in observed:
        why = model_trace[name]["fn"].unsampled
        if why is not None:
            instead = (
                ", or pass replications=Replications(data_generator=...) "
                "(data sets from a process of your own)"
                if function == "predictive_calibration"
                else ""
            )
            raise ValueError(
                f"{function}: the observed site '{name}' cannot be simulated: "
                f"{why}; and {function} simulates data sets of the model. Give "
                f"its distribution a sampler that draws{instead}."
            )


#: Relative and absolute tolerance on a site's summed log density (float32).
RTOL = 1e-5
ATOL = 1e-4


class EagerRuns(NamedTuple):
    """The model run eagerly at one simulated data set and one draw of the
    latents: ``simulating`` with the user's arguments, ``fitted`` with those
    the data set's fit is given (both traces without masks), and
    ``masked``: the sites whose masks leave out entries in the fitted run."""

    simulating: dict[str, Any]
    fitted: dict[str, Any]
    masked: frozenset[str]


def eager_runs(
    rng_key: jax.Array,
    model: Callable,
    args: tuple,
    kwargs: dict,
    inject: Callable[[dict], tuple[tuple, dict]],
    data: dict[str, jax.Array],
) -> EagerRuns | None:
    """:class:`EagerRuns` at ``data`` (site -> value of one data set), or
    ``None`` where the model does not run eagerly on these values (the fits
    then raise and explain their own errors)."""
    fit_args, fit_kwargs = inject(data)
    fitted_masks = _unmasked()
    try:
        draw = trace(seed(_unmasked(condition(model, data)), rng_key)).get_trace(
            *args, **kwargs
        )
        values = {n: s["value"] for n, s in draw.items() if s["type"] == "sample"}
        # every sample site given, in both runs: the same keys reach the rest
        # (numpyro.prng_key, e.g. a network's dropout)
        simulating = trace(
            seed(_unmasked(condition(model, values)), rng_key)
        ).get_trace(*args, **kwargs)
        with fitted_masks:
            fitted = trace(seed(condition(model, values), rng_key)).get_trace(
                *fit_args, **fit_kwargs
            )
    except Exception:  # noqa: BLE001 - the fits raise and explain their own errors
        return None
    return EagerRuns(simulating, fitted, frozenset(fitted_masks.masked))


def check_fits_are_the_simulating_model(
    runs: EagerRuns | None, *, function: str, alternative: str = ""
) -> None:
    """Raise, naming the site, where a site's log density differs between
    the two runs: the model fitted to the data set is not the one that
    simulated it. Masks are left out of the comparison (:class:`_unmasked`).
    """
    if runs is None:
        return
    before, after = _log_densities(runs.simulating), _log_densities(runs.fitted)
    for name in before.keys() & after.keys():
        if not np.isclose(
            before[name], after[name], rtol=RTOL, atol=ATOL, equal_nan=True
        ):
            raise ValueError(
                _message(name, before[name], after[name], function, alternative)
            )


class _unmasked(Messenger):
    """The sites' distributions without their masks, and the names of the
    sites whose masks leave out entries (``masked``). A mask computed from
    the data (NumPyro's Lotka-Volterra notebook masks its missing values)
    leaves out terms of the original data that a complete simulated data
    set has; the draws do not see masks, so the fits are those of the
    simulating model."""

    def __init__(self, fn: Callable | None = None) -> None:
        self.masked: set[str] = set()
        super().__init__(fn)

    def process_message(self, msg: dict[str, Any]) -> None:
        if msg["type"] == "sample":
            if _leaves_out_entries(msg["fn"]):
                self.masked.add(msg["name"])
            msg["fn"] = _without_mask(msg["fn"])


def _leaves_out_entries(fn: Distribution) -> bool:
    while isinstance(fn, (Independent, ExpandedDistribution, MaskedDistribution)):
        if isinstance(fn, MaskedDistribution) and not np.all(np.asarray(fn._mask)):
            return True
        fn = fn.base_dist
    return False


def _without_mask(fn: Distribution) -> Distribution:
    if isinstance(fn, MaskedDistribution):
        return _without_mask(fn.base_dist)
    if isinstance(fn, Independent):
        return Independent(_without_mask(fn.base_dist), fn.reinterpreted_batch_ndims)
    if isinstance(fn, ExpandedDistribution):
        return _without_mask(fn.base_dist).expand(fn.batch_shape)
    return fn


def _log_densities(tr: dict[str, Any]) -> dict[str, float]:
    """Each sample site's summed log density (sites without one left out)."""
    out = {}
    for name, site in tr.items():
        if site["type"] != "sample":
            continue
        try:
            out[name] = float(jnp.sum(site["fn"].log_prob(site["value"])))
        except Exception:  # noqa: BLE001 - a simulator without a density
            continue
    return out


def _message(
    name: str, before: float, after: float, function: str, alternative: str
) -> str:
    return (
        f"{function}: the distribution of the site '{name}' reads the data the "
        "model is given (its log density at one simulated data set is "
        f"{before:.6g} with the original data as the model's argument, "
        f"{after:.6g} with the simulated data set), e.g. a prior centred on "
        "y.mean() or a likelihood of lagged values y[t - 1]. Each data set is "
        "simulated by the model given the original data, and each fit is given "
        "the simulated data set: the draws and data sets would not be those of "
        "the models fitted, and an exact fit would look miscalibrated. Compute "
        "such constants once and pass them as arguments of their own "
        "(prior_loc=y.mean()), carry lagged values through the sampled ones "
        "(numpyro.contrib.control_flow.scan), or give each fit the arguments "
        "its data set was simulated with (the observed sites are conditioned "
        "on the simulated data in any case): replications=Replications("
        "simulated_data_to_args=lambda data, *args, **kwargs: (args, kwargs))"
        f"{alternative}."
    )
