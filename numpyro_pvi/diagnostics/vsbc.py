"""Variational simulation-based calibration (VSBC) as ArviZ ``InferenceData``.

Algorithm 2 of Yao, Vehtari, Simpson & Gelman (2018): draw ``θ*`` from the
prior and ``y`` from the model, fit the guide to ``y``, and record
:math:`p = \\Pr_q(θ < θ^*)` for every scalar component of every latent site.
For a method whose marginals are unbiased on average, ``p`` is distributed
symmetrically around 1/2; the asymmetry says in which direction it errs.

Site discovery follows :func:`numpyro.infer.calibration.vsbc_diagnostic`; the
replications are fitted inside ``jit`` with ``lax.scan`` over SVI steps and
dispatched sequentially (``lax.map``), vectorised (``vmap``) or sharded over
all local devices (``jax.sharding``), in chunks for progress reporting.
"""

from __future__ import annotations

import functools
import inspect
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr
from jax import lax, random
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from numpyro.handlers import block, condition, seed
from numpyro.infer import SVI, Predictive
from numpyro.infer.calibration import _resolve_observed_sites, _validate_latent_sites
from numpyro.primitives import Messenger
from scipy import stats

from numpyro_pvi._structure import check_full_data, model_structure
from numpyro_pvi.diagnostics._idata import draws_dataset, root_attrs, site_dims

__all__ = ["plot_vsbc", "vsbc"]

_CHAIN_METHODS = ("sequential", "vectorized", "sharded")
_CORRECTIONS = ("holm", "bh", None)
#: Number of chunks the replications are split into when a progress bar is shown.
_PROGRESS_CHUNKS = 10
_AXIS = "replication"


class _unobserve(Messenger):
    """Sample the named sites from the model even when they are observed."""

    def __init__(self, fn: Callable, names: Sequence[str]) -> None:
        self.names = frozenset(names)
        super().__init__(fn)

    def process_message(self, msg: dict[str, Any]) -> None:
        if msg["type"] == "sample" and msg["name"] in self.names:
            msg["value"] = None
            msg["is_observed"] = False


# --------------------------------------------------------------------------
# simulated data → model arguments
# --------------------------------------------------------------------------


def _data_injector(
    model: Callable,
    observed: Sequence[str],
    args: tuple,
    kwargs: dict,
    simulated_data_to_args: Callable | None,
) -> Callable[[dict], tuple[tuple, dict]]:
    """Return ``data -> (args, kwargs)`` that passes simulated data to the model.

    An observed site whose name is a parameter of ``model`` receives its
    simulated value through that argument (so a guide that reads the data sees
    the simulated data); every observed site is also conditioned on, which
    overrides any ``obs=`` the model was called with.
    """
    if simulated_data_to_args is not None:
        if not callable(simulated_data_to_args):
            raise TypeError("`simulated_data_to_args` must be callable.")

        def inject_custom(data: dict) -> tuple[tuple, dict]:
            out = simulated_data_to_args(data, *args, **kwargs)
            if not (isinstance(out, tuple) and len(out) == 2):
                raise ValueError(
                    "`simulated_data_to_args` must return a pair (args, kwargs)."
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

    def inject(data: dict) -> tuple[tuple, dict]:
        if not names:
            return args, kwargs
        bound = signature.bind_partial(*args, **kwargs)
        for n in names:
            bound.arguments[n] = data[n]
        return tuple(bound.args), dict(bound.kwargs)

    return inject


# --------------------------------------------------------------------------
# one replication and the dispatch over replications
# --------------------------------------------------------------------------


def _replication_fn(
    model: Callable,
    guide: Callable,
    optim: Any,
    loss: Any,
    inject: Callable,
    latent_names: Sequence[str],
    num_svi_steps: int,
    num_draws: int,
) -> Callable:
    """``(key, data, θ*) -> (#{draws < θ*}, final loss, mean of the last 10%
    losses, loss drift)``.

    The counts are integers: ``p = count / num_draws`` lies on an exact grid,
    which the symmetry test needs to recognise ties between ``p`` and ``1 - p``.
    The drift is :func:`loss_drift` of the losses.
    """
    tail = max(1, num_svi_steps // 10)

    def one(inputs: tuple) -> tuple[dict, jax.Array, jax.Array]:
        key, data, theta = inputs
        key_svi, key_draw = random.split(key)
        args, kwargs = inject(data)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Found non-auxiliary vars")
            svi = SVI(condition(model, data), guide, optim, loss)
            state = svi.init(key_svi, *args, **kwargs)
            state, losses = lax.scan(
                lambda s, _: svi.update(s, *args, **kwargs),
                state,
                None,
                length=num_svi_steps,
            )
        draws = Predictive(
            guide,
            params=svi.get_params(state),
            num_samples=num_draws,
            return_sites=list(latent_names),
            parallel=True,
        )(key_draw, *args, **kwargs)
        below = {n: jnp.sum(draws[n] < theta[n], axis=0) for n in latent_names}
        return below, losses[-1], jnp.mean(losses[-tail:]), loss_drift(losses)

    return one


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
    var = (jnp.var(prev, ddof=1) + jnp.var(last, ddof=1)) / t
    diff = jnp.mean(prev) - jnp.mean(last)
    # a relative floor: a deterministic loss (a point-mass guide) has no noise
    floor = 1e-5 * (1.0 + jnp.abs(jnp.mean(last)))
    return diff / (jnp.sqrt(var) + floor)


def _dispatcher(one: Callable, chain_method: str | Callable) -> Callable:
    """Compile-once map of ``one`` over the leading axis of its input pytree.

    ``"sharded"`` places the batch over all local devices (a 1-axis mesh) and
    maps each device's replications with ``vmap``; the batch size must be a
    multiple of the device count.
    """
    if chain_method == "sequential":
        return jax.jit(lambda xs: lax.map(one, xs))
    if chain_method == "vectorized":
        return jax.jit(jax.vmap(one))
    if chain_method != "sharded":
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


def _run_replications(
    one: Callable,
    inputs: Any,
    num: int,
    chain_method: str | Callable,
    chunk_size: int | None,
    progress_bar: bool,
) -> Any:
    """Map ``one`` over the leading axis of ``inputs`` in equal, padded chunks.

    The replication count is padded (by repeating the last replication) to a
    whole number of chunks, each a multiple of the device count when sharded,
    so every chunk has one shape and compiles once; padded results are
    dropped. Every replication has its own key and data, so the result does
    not depend on the chunking.
    """
    from tqdm.auto import tqdm

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
    run = _dispatcher(one, chain_method)
    outputs = []
    with tqdm(
        total=num, disable=not progress_bar, desc="VSBC", unit="replication"
    ) as bar:
        for c in range(num_chunks):
            chunk = jax.tree.map(
                lambda x, c=c: x[c * chunk_size : (c + 1) * chunk_size], inputs
            )
            outputs.append(jax.device_get(run(chunk)))
            bar.update(min(chunk_size, num - c * chunk_size))
    return jax.tree.map(lambda *xs: np.concatenate(xs)[:num], *outputs)


# --------------------------------------------------------------------------
# statistics
# --------------------------------------------------------------------------


def _holm(p_values: np.ndarray) -> np.ndarray:
    """Holm (1979) step-down adjusted p-values."""
    p = np.asarray(p_values, dtype=float)
    m = p.size
    order = np.argsort(p, kind="stable")
    adjusted = np.maximum.accumulate((m - np.arange(m)) * p[order])
    out = np.empty(m)
    out[order] = np.minimum(adjusted, 1.0)
    return out


def _adjust(p_values: np.ndarray, correction: str | None) -> np.ndarray:
    """Multiplicity-corrected p-values: Holm, Benjamini–Hochberg or none."""
    p = np.asarray(p_values, dtype=float)
    if correction is None or p.size == 0:
        return p.copy()
    if correction == "holm":
        return _holm(p)
    return stats.false_discovery_control(p, method="bh")


def _reflection_walk(below: np.ndarray, num_draws: int) -> tuple[np.ndarray, list]:
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


def _reflection_tail(sizes: Sequence[int], level: int, *, two_sided: bool) -> float:
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


def _symmetry(
    below: np.ndarray, num_draws: int, correction: str | None, alpha: float
) -> dict[str, np.ndarray]:
    """KS tests of ``p`` against ``1 - p`` for each column of ``below`` (R, C).

    ``p = below / num_draws``. The statistic is the two-sample KS statistic
    of ``p`` against ``1 - p`` (Yao et al. 2018); its p-values are exact
    under the null that ``p`` is symmetric about 1/2 (conditional on
    ``|p - 1/2|``): the two-sample KS distribution assumes independent
    samples, which ``p`` and ``1 - p`` are not, and rejects a symmetric ``p``
    far more often than its level (about 13% at level 5% for 40 uniform
    ``p``). The two-sided p-value is corrected for multiplicity over the
    columns; a column whose corrected p-value is below ``alpha`` gets the
    direction of the one-sided test with the smaller p-value: ``"over"``
    when the ECDF of ``p`` rises above that of ``1 - p`` (``p`` piles up near
    0: q overestimates θ), ``"under"`` when it falls below.
    """
    num, cols = below.shape
    out = {k: np.empty(cols) for k in ("ks", "two", "over", "under")}
    for j in range(cols):
        walk, sizes = _reflection_walk(below[:, j], num_draws)
        over, under = int(max(0.0, -walk.min())), int(max(0.0, walk.max()))
        out["ks"][j] = max(over, under) / num
        out["two"][j] = _reflection_tail(sizes, max(over, under), two_sided=True)
        out["over"][j] = _reflection_tail(sizes, over, two_sided=False)
        out["under"][j] = _reflection_tail(sizes, under, two_sided=False)
    adjusted = _adjust(out["two"], correction)
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


def _num_bins(num: int) -> int:
    return int(np.clip(math.ceil(math.sqrt(num)), 5, 20))


# --------------------------------------------------------------------------
# InferenceData layout
# --------------------------------------------------------------------------


def _component_labels(name: str, shape: tuple[int, ...]) -> list[str]:
    if not shape:
        return [name]
    return [f"{name}[{', '.join(map(str, idx))}]" for idx in np.ndindex(*shape)]


def _setup(
    rng_key: jax.Array,
    model: Callable,
    guide: Callable,
    optim: Any,
    loss: Any,
    args: tuple,
    kwargs: dict,
    *,
    num_simulations: int,
    num_svi_steps: int,
    num_draws: int,
    observed_sites: Sequence[str] | None,
    simulated_data_to_args: Callable | None,
) -> tuple[Callable, tuple, dict, list[str]]:
    """Sites, prior predictive draws and the function of one replication.

    :return: ``one``, its batched inputs ``(keys, data, θ*)``, an abstract
        model trace and the latent site names.
    """
    key_trace, key_prior, key_warmup, key_fit = random.split(rng_key, 4)
    model_trace = model_structure(model, key_trace, args, kwargs)
    check_full_data(model_trace, "vsbc")
    try:
        observed, latent_names = _resolve_observed_sites(model_trace, observed_sites)
    except ValueError as err:
        raise ValueError(
            f"vsbc: {err} Pass the observed data as for SVI, or name the "
            "observed sites with `observed_sites=`."
        ) from None
    _validate_latent_sites(model_trace, latent_names)
    inject = _data_injector(model, observed, args, kwargs, simulated_data_to_args)

    prior_predictive = Predictive(
        _unobserve(model, observed),
        num_samples=num_simulations,
        return_sites=list(observed) + list(latent_names),
        parallel=True,
    )
    sims = jax.jit(lambda key: prior_predictive(key, *args, **kwargs))(key_prior)
    data = {n: sims[n] for n in observed}
    theta = {n: sims[n] for n in latent_names}

    # Autoguides set up their prototype on the first call; that must happen
    # outside of jit/vmap (it stores concrete initial values on the guide).
    data0 = {n: v[0] for n, v in data.items()}
    with warnings.catch_warnings(), block():
        warnings.filterwarnings("ignore", message="Found non-auxiliary vars")
        args0, kwargs0 = inject(data0)
        seed(guide, key_warmup)(*args0, **kwargs0)

    one = _replication_fn(
        model, guide, optim, loss, inject, latent_names, num_svi_steps, num_draws
    )
    keys = random.split(key_fit, num_simulations)
    return one, (keys, data, theta), model_trace, latent_names


def _validate(
    num_simulations: int,
    num_svi_steps: int,
    num_draws: int,
    chain_method: Any,
    correction: Any,
    alpha: float,
    chunk_size: int | None,
) -> None:
    for arg, value, low in (
        ("num_simulations", num_simulations, 2),
        ("num_svi_steps", num_svi_steps, 1),
        ("num_draws", num_draws, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"`{arg}` must be an integer, got {value!r}.")
        if value < low:
            raise ValueError(f"`{arg}` must be at least {low}, got {value}.")
    if not callable(chain_method) and chain_method not in _CHAIN_METHODS:
        raise ValueError(
            f"`chain_method` must be one of {_CHAIN_METHODS} or a callable such "
            f"as jax.vmap, got {chain_method!r}."
        )
    if correction not in _CORRECTIONS:
        raise ValueError(
            f"`correction` must be 'holm', 'bh' or None, got {correction!r}."
        )
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"`alpha` must lie in (0, 1), got {alpha!r}.")
    if chunk_size is not None and (
        isinstance(chunk_size, bool)
        or not isinstance(chunk_size, (int, np.integer))
        or chunk_size < 1
    ):
        raise ValueError(
            f"`chunk_size` must be a positive integer or None, got {chunk_size!r}."
        )


def vsbc(
    rng_key: jax.Array,
    model: Callable,
    guide: Callable,
    optim: Any,
    loss: Any,
    *args: Any,
    num_simulations: int = 100,
    num_svi_steps: int = 1000,
    num_draws: int = 1000,
    observed_sites: Sequence[str] | None = None,
    chain_method: str | Callable = "vectorized",
    correction: str | None = "holm",
    progress_bar: bool = True,
    alpha: float = 0.05,
    chunk_size: int | None = None,
    simulated_data_to_args: Callable | None = None,
    **kwargs: Any,
) -> az.InferenceData:
    r"""Variational simulation-based calibration (Yao et al. 2018, Algorithm 2).

    For each of ``num_simulations`` replications: draw :math:`θ^*` and
    :math:`y` from the prior predictive, fit a fresh guide to :math:`y` with
    ``num_svi_steps`` SVI steps of ``loss`` (any NumPyro ELBO, the objectives
    of this package included), and estimate

    .. math::

        p = \Pr_q(θ < θ^*) \approx \frac{1}{L} \sum_{l=1}^{L}
        \mathbb{1}\{θ^{(l)} < θ^*\}, \qquad θ^{(l)} \sim q,

    per scalar component, with :math:`L` = ``num_draws``. If the method's
    marginals are unbiased on average, :math:`p` and :math:`1 - p` have the
    same distribution; each component is tested with a two-sample
    Kolmogorov–Smirnov statistic of :math:`p` against :math:`1 - p`, whose
    p-value is exact under the null that :math:`p` is symmetric about 1/2
    (a sign-flip null, conditional on :math:`|p - 1/2|`; the usual
    two-sample KS p-value treats :math:`p` and :math:`1 - p` as independent,
    which they are not), corrected for multiplicity over
    all components of all latent sites. The one-sided tests give the
    direction: ``"over"`` when :math:`p` piles up near 0 (q overestimates
    θ, the paper's right-skewed histogram), ``"under"`` when it piles up near
    1, ``"ok"`` when symmetry is not rejected at level ``alpha``. A symmetric
    but U-shaped histogram (too narrow but unbiased) or hump-shaped one (too
    wide) is not flagged: read the histograms (:func:`plot_vsbc`).

    The model must be generative: observed sites are sampled from the prior
    predictive whatever data the model is called with (only their shapes are
    used), and each fit conditions on the simulated values. An observed site
    whose name is an argument of the model also receives its simulated value
    through that argument, so guides that read the data see the simulated
    data; for data passed in another way use ``simulated_data_to_args``.
    Only continuous latent sites are supported.

    Every replication starts from the same initial guide parameters (those of
    the guide's initialisation strategy) and has its own key, so results do
    not depend on ``chain_method`` or on the chunking (up to floating-point
    reassociation between batch sizes).

    **Example**::

        >>> idata = vsbc(random.PRNGKey(0), model, AutoNormal(model),
        ...              optax.adam(1e-2), Trace_ELBO(), x, y,
        ...              num_simulations=200, num_svi_steps=2000)
        >>> idata.vsbc_symmetry.to_dataframe()
        >>> plot_vsbc(idata)

    :param rng_key: PRNG key.
    :param model: NumPyro model; generative (it samples its observed sites
        when they are not given).
    :param guide: guide for ``model`` (an autoguide or a hand-written guide);
        refitted from its initial parameters in every replication.
    :param optim: NumPyro optimizer or optax ``GradientTransformation``.
    :param loss: the objective, e.g. ``Trace_ELBO()`` or ``PACmELBO()``.
    :param args: positional arguments of the model and guide.
    :param num_simulations: number of replications (≥ 2).
    :param num_svi_steps: SVI steps per replication.
    :param num_draws: guide draws per replication to estimate :math:`p`.
    :param observed_sites: names of the observed sites; by default the sites
        observed in a trace of ``model(*args, **kwargs)``.
    :param chain_method: ``"sequential"`` (``lax.map``, least memory),
        ``"vectorized"`` (``vmap``), ``"sharded"`` (replications split over
        all local devices with :mod:`jax.sharding`, ``vmap`` within each;
        any number of replications) or a callable such as ``jax.vmap`` that
        maps a function of one replication over a batch (the result is
        jit-compiled).
    :param correction: ``"holm"`` (family-wise error), ``"bh"``
        (Benjamini–Hochberg false discovery rate) or ``None``.
    :param progress_bar: show a progress bar over chunks of replications.
    :param alpha: level at which a corrected p-value flags a direction.
    :param chunk_size: replications per compiled call; default all of them
        without a progress bar, a tenth of them with one. Rounded up to a
        multiple of the device count when sharded.
    :param simulated_data_to_args: optional ``f(data, *args, **kwargs) ->
        (args, kwargs)`` that passes the simulated data (a dict site →
        value) to the model and guide, when they take it in a container.
    :param kwargs: keyword arguments of the model and guide.
    :return: :class:`arviz.InferenceData` with replications along ``draw``
        (one ``chain``): ``prior`` (:math:`θ^*`), ``vsbc`` (:math:`p`, same
        variables and dims), ``vsbc_symmetry`` (per scalar ``component``:
        ``ks_statistic``, ``p_value``, ``p_value_adjusted``,
        ``p_value_over``, ``p_value_under``, ``direction``, and
        ``num_extreme``: replications with :math:`p` exactly 0 or 1, whose
        guide put no mass on the far side of :math:`θ^*`; attribute
        ``num_unconverged``), ``vsbc_fit_stats`` (``loss``: final loss;
        ``loss_tail``: mean loss over the last 10% of steps; ``loss_drift``:
        :func:`loss_drift`, the fall of the loss over the last tenth of the
        steps in standard errors; ``converged``: drift at most 3; a warning
        is raised when more than 10% of the replications have not converged)
        and ``vsbc_histogram`` (``count`` per
        ``component`` and ``bin``, with ``bin_left``/``bin_right`` coords).

    **References**

    - Yao, Y., Vehtari, A., Simpson, D. & Gelman, A. (2018). *Yes, but did
      it work?: Evaluating variational inference.* ICML.
    - Talts, S., Betancourt, M., Simpson, D., Vehtari, A. & Gelman, A.
      (2018). *Validating Bayesian inference algorithms with
      simulation-based calibration.* arXiv:1804.06788.
    - Holm, S. (1979). *A simple sequentially rejective multiple test
      procedure.* Scandinavian Journal of Statistics.
    - Benjamini, Y. & Hochberg, Y. (1995). *Controlling the false discovery
      rate.* JRSS B.
    """
    _validate(
        num_simulations,
        num_svi_steps,
        num_draws,
        chain_method,
        correction,
        alpha,
        chunk_size,
    )
    one, inputs, model_trace, latent_names = _setup(
        rng_key,
        model,
        guide,
        optim,
        loss,
        args,
        kwargs,
        num_simulations=num_simulations,
        num_svi_steps=num_svi_steps,
        num_draws=num_draws,
        observed_sites=observed_sites,
        simulated_data_to_args=simulated_data_to_args,
    )
    theta = inputs[2]
    below, final_loss, tail_loss, drift = _run_replications(
        one,
        inputs,
        num_simulations,
        chain_method,
        chunk_size,
        progress_bar,
    )

    theta = {n: np.asarray(v) for n, v in theta.items()}
    shapes = {n: theta[n].shape[1:] for n in latent_names}
    dims = {n: d for n, d in site_dims(model_trace).items() if n in latent_names}
    labels = [lab for n in latent_names for lab in _component_labels(n, shapes[n])]
    variable = [n for n in latent_names for _ in range(math.prod(shapes[n]))]
    p = {n: below[n] / num_draws for n in latent_names}
    below_flat = np.concatenate(
        [below[n].reshape(num_simulations, -1) for n in latent_names], axis=1
    )
    p_flat = below_flat / num_draws
    symmetry = _symmetry(below_flat, num_draws, correction, alpha)
    num_bins = _num_bins(num_simulations)
    edges = np.linspace(0.0, 1.0, num_bins + 1)
    counts = np.stack(
        [np.histogram(p_flat[:, j], bins=edges)[0] for j in range(p_flat.shape[1])]
    )

    component = {"component": labels, "variable": ("component", variable)}
    extreme = np.sum((below_flat == 0) | (below_flat == num_draws), axis=0)
    sym_ds = xr.Dataset(
        {
            **{k: ("component", v) for k, v in symmetry.items()},
            "num_extreme": ("component", extreme),
        },
        coords=component,
        attrs={
            "test": "Kolmogorov-Smirnov statistic of p against 1 - p; exact "
            "p-values under symmetry of p about 1/2 (sign-flip null)",
            "correction": str(correction),
            "alpha": alpha,
            "num_simulations": num_simulations,
        },
    )
    hist_ds = xr.Dataset(
        {"count": (("component", "bin"), counts)},
        coords={
            **component,
            "bin": np.arange(num_bins),
            "bin_left": ("bin", edges[:-1]),
            "bin_right": ("bin", edges[1:]),
        },
    )

    attrs = {
        "num_svi_steps": num_svi_steps,
        "num_draws": num_draws,
        "chain_method": getattr(chain_method, "__name__", str(chain_method)),
    }
    prior_ds = draws_dataset(theta, dims=dims)
    vsbc_ds = draws_dataset(
        p, dims=dims, attrs={**attrs, "quantity": "p = Pr_q(theta < theta*)"}
    )
    converged = ~(drift > DRIFT_THRESHOLD)  # nan (too few steps) counts as converged
    num_unconverged = int(np.sum(~converged))
    if num_unconverged > UNCONVERGED_WARNING * num_simulations:
        warnings.warn(
            f"vsbc: {num_unconverged} of {num_simulations} replications had not "
            f"converged after {num_svi_steps} SVI steps (loss still falling by more "
            f"than {DRIFT_THRESHOLD:g} standard errors over the last tenth of the "
            "steps, vsbc_fit_stats.loss_drift): their p values measure an "
            "unfinished fit, not the method. Increase num_svi_steps or the step "
            "size.",
            UserWarning,
            stacklevel=2,
        )
    sym_ds.attrs["num_unconverged"] = num_unconverged
    fit_ds = draws_dataset(
        {
            "loss": final_loss,
            "loss_tail": tail_loss,
            "loss_drift": drift,
            "converged": converged,
        },
        attrs={**attrs, "drift_threshold": DRIFT_THRESHOLD},
    )
    idata = az.InferenceData(
        prior=prior_ds,
        vsbc=vsbc_ds,
        vsbc_symmetry=sym_ds,
        vsbc_fit_stats=fit_ds,
        vsbc_histogram=hist_ds,
    )
    idata.attrs.update(root_attrs(guide, loss=type(loss).__name__, diagnostic="vsbc"))
    return idata


# --------------------------------------------------------------------------
# plots
# --------------------------------------------------------------------------


def plot_vsbc(
    idata: az.InferenceData,
    kind: str = "hist",
    var_names: str | Sequence[str] | None = None,
    *,
    figsize: tuple[float, float] | None = None,
) -> np.ndarray:
    """Plot VSBC results, one panel per scalar component.

    ``kind="hist"`` draws the histogram of :math:`p` with the corrected
    p-value and direction in each title (and, above the panels, how many
    replications had not converged) (as Figures 1, 6 and 8 of Yao et al.
    2018); ``kind="ecdf"`` draws the ECDF difference of :math:`p` against the
    uniform distribution with simultaneous 94% bands (:func:`arviz.plot_ecdf`;
    uniformity is what an exact posterior gives, symmetry what VSBC tests).

    :param idata: the result of :func:`vsbc`.
    :param kind: ``"hist"`` or ``"ecdf"``.
    :param var_names: latent site name(s) to plot; default all.
    :param figsize: figure size; default scales with the number of panels.
    :return: 1-D array of the matplotlib axes, one per component.

    **References**

    - Yao, Y., Vehtari, A., Simpson, D. & Gelman, A. (2018). *Yes, but did
      it work?: Evaluating variational inference.* ICML.
    - Säilynoja, T., Bürkner, P.-C. & Vehtari, A. (2022). *Graphical test for
      discrete uniformity and its applications in goodness-of-fit evaluation
      and multiple sample comparison.* Statistics and Computing.
    """
    import matplotlib.pyplot as plt

    if kind not in ("hist", "ecdf"):
        raise ValueError(f"`kind` must be 'hist' or 'ecdf', got {kind!r}.")
    for group in ("vsbc", "vsbc_symmetry", "vsbc_histogram"):
        if group not in idata.groups():
            raise ValueError(
                f"`idata` has no `{group}` group: pass the result of vsbc()."
            )
    sym, hist = idata.vsbc_symmetry, idata.vsbc_histogram
    available = list(dict.fromkeys(sym["variable"].values.tolist()))
    if var_names is None:
        var_names = available
    elif isinstance(var_names, str):
        var_names = [var_names]
    unknown = [v for v in var_names if v not in available]
    if unknown:
        raise ValueError(
            f"`var_names` {unknown} are not latent sites of this VSBC run; "
            f"choose from {available}."
        )
    selected = np.isin(sym["variable"].values, list(var_names))
    labels = sym["component"].values[selected]
    n = len(labels)
    ncols = min(4, n)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=figsize or (3.2 * ncols, 2.6 * nrows),
        squeeze=False,
        constrained_layout=True,
    )
    axes = axes.ravel()
    for ax in axes[n:]:
        fig.delaxes(ax)
    axes = axes[:n]
    unconverged = int(sym.attrs.get("num_unconverged", 0))
    if unconverged:
        fig.suptitle(
            f"{unconverged} of {int(sym.attrs['num_simulations'])} replications had "
            "not converged: their p measure an unfinished fit",
            fontsize=9,
            color="tab:red",
        )
    p_by_label = {}
    for var in var_names:
        values = np.asarray(idata.vsbc[var])  # (chain, draw, *shape)
        columns = values.reshape(-1, math.prod(values.shape[2:])).T
        for lab, col in zip(
            _component_labels(var, values.shape[2:]), columns, strict=True
        ):
            p_by_label[lab] = col
    edges = np.append(hist["bin_left"].values, hist["bin_right"].values[-1])
    for ax, label in zip(axes, labels, strict=True):
        row = sym.sel(component=label)
        if kind == "hist":
            ax.stairs(
                hist["count"].sel(component=label).values,
                edges,
                fill=True,
                alpha=0.7,
            )
            ax.axvline(0.5, color="k", lw=0.8, ls="--")
            ax.set_xlim(0.0, 1.0)
        else:
            az.plot_ecdf(
                np.array(p_by_label[label], copy=True),
                cdf=stats.uniform().cdf,
                eval_points=np.linspace(0.0, 1.0, 101),
                difference=True,
                confidence_bands=True,
                random_state=0,
                ax=ax,
            )
        ax.set_title(
            f"{label}\nsymmetry test p-value {float(row['p_value_adjusted']):.2g}: "
            f"{row['direction'].item()}",
            fontsize=9,
        )
        ax.set_xlabel("Pr_q(θ < θ*)")
    return axes
