"""Observed sites with imputed entries: missing values filled by latent draws.

NumPyro's Bayesian-imputation idiom fills the missing entries of the data
with a latent site and observes the result::

    age_impute = numpyro.sample("age_impute", dist.Normal(mu, s).mask(False))
    age = jnp.asarray(age).at[missing].set(age_impute)
    numpyro.sample("age", dist.Normal(mu, s), obs=age)

The observed value then depends on the latent draws at the missing entries
only. There the site's density is the prior of the imputed values (a term of
the joint density, as NumPyro's ``obs_mask`` makes it); at the others it is
the likelihood of data. :func:`imputed_entries` finds which entries come
from the latents, and :func:`split_imputed` makes the site score the data
alone and carry the imputed entries' density with the prior
(:func:`imputed_density`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import random
from numpyro.handlers import Messenger, seed, substitute, trace
from numpyro.infer import init_to_uniform

__all__ = [
    "IMPUTED",
    "NeedsConstantArguments",
    "data_value",
    "imputed_density",
    "imputed_entries",
    "split_imputed",
    "with_imputed_entries",
]

#: The key of a site's ``infer`` dict that holds its distribution before the
#: split and the mask of its imputed entries (set by :func:`split_imputed`).
IMPUTED = "_pvi_imputed"


def _observed_values(
    model: Callable, args: tuple, kwargs: dict, names: list[str], seed_: int
) -> dict[str, tuple[np.ndarray, int]] | None:
    """The values of the observed sites ``names`` (with their distributions'
    event dims) under latent values drawn uniformly on ``(-2, 2)`` of their
    unconstrained space (improper priors included); ``None`` where a plate
    is subsampled (each run would see other observations)."""
    key = random.PRNGKey(seed_)
    model = substitute(seed(model, key), substitute_fn=init_to_uniform)
    tr = trace(model).get_trace(*args, **kwargs)
    if any(
        s["type"] == "plate"
        and s["args"][1] is not None
        and s["args"][1] < s["args"][0]
        for s in tr.values()
    ):
        return None
    return {
        n: (np.asarray(tr[n]["value"]), tr[n]["fn"].event_dim) for n in names if n in tr
    }


class NeedsConstantArguments(ValueError):
    """A value the program needs when it is compiled comes from a traced
    argument (an observed site's imputed entries, a count's largest
    ``total_count``): a program that can take the arguments as constants
    does (:func:`~numpyro_pvi.evaluation.draws.compiled`); elsewhere, the
    refusal, its message saying what to do."""


def imputed_entries(
    model: Callable, args: tuple, kwargs: dict, names: list[str]
) -> dict[str, np.ndarray] | None:
    """``{site: mask}``, ``True`` at the entries of each observed site of
    ``names`` (sites whose value depends on the latent draws) that come from
    the latents, for the sites where some entries do and others do not.

    Found by running the model twice with different latent values, eagerly:
    an entry that changes comes from the latents. (An entry that depends on
    them yet takes one value at both points, a piecewise-constant function
    of them, would count as data; imputation by assignment, ``.at[].set``
    or ``jnp.where``, takes the latent value itself.) Needs concrete model
    arguments (as ``SVI.run`` passes them): with traced ones, ``None``
    (unknown); with a subsampled plate or a model that fails at those
    values, nothing is found and the sites stay as they are. An event (the
    value of a vector-valued site at one index) counts when all of its
    entries are imputed; partly imputed events are not split.
    """
    try:
        with jax.ensure_compile_time_eval():
            first, second = (
                _observed_values(model, args, kwargs, names, s) for s in (0, 1)
            )
    except jax.errors.JAXTypeError:  # traced arguments: not known here
        return None
    except Exception:  # noqa: BLE001 - a model that fails at these values:
        # nothing is split, and the site is refused, naming the remedies
        return {}
    if first is None or second is None:
        return {}
    entries = {}
    for name, (value, event_dim) in first.items():
        other = second[name][0]
        if value.shape != other.shape:
            continue
        changed = ~((value == other) | (np.isnan(value) & np.isnan(other)))
        events = tuple(range(changed.ndim - event_dim, changed.ndim))
        imputed = changed.any(axis=events)
        if (
            imputed.any()
            and not imputed.all()
            and (changed.all(axis=events) == imputed).all()
        ):
            entries[name] = imputed  # whole events imputed: a mask of the batch
    return entries


class _SplitImputed(Messenger):
    def __init__(self, fn: Callable, entries: dict[str, np.ndarray]) -> None:
        self.entries = entries
        super().__init__(fn)

    def process_message(self, msg: dict[str, Any]) -> None:
        if msg["type"] != "sample" or not msg["is_observed"]:
            return  # (a scan's control-flow message has no name)
        imputed = self.entries.get(msg["name"])
        if imputed is None:
            return
        fn = msg["fn"]
        msg["infer"] = {**msg["infer"], IMPUTED: (fn, imputed)}
        msg["fn"] = fn.mask(~imputed)


def split_imputed(model: Callable, entries: dict[str, np.ndarray]) -> Callable:
    """``model`` with each observed site of ``entries`` masked to its data
    (the entries not imputed), its distribution and the imputed entries'
    mask kept in the site's ``infer`` dict for :func:`imputed_density`."""
    return _SplitImputed(model, entries) if entries else model


def with_imputed_entries(
    model: Callable, args: tuple, kwargs: dict, dependent: list[str]
) -> tuple[Callable, dict[str, np.ndarray] | None]:
    """``model`` with those of the observed sites ``dependent`` (whose value
    depends on the latent draws) that fill missing entries with latent draws
    split (:func:`split_imputed`), and their masks (:func:`imputed_entries`;
    ``None`` where the arguments are traced)."""
    entries = imputed_entries(model, args, kwargs, dependent) if dependent else {}
    return split_imputed(model, entries or {}), entries


def _parts(site: dict[str, Any]) -> tuple[Any, np.ndarray] | None:
    return site.get("infer", {}).get(IMPUTED)


def imputed_density(sites: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The density terms of the imputed entries of ``sites`` (split by
    :func:`split_imputed`): each such site with its distribution masked to
    them, a term of the joint density like a prior."""
    out = []
    for site in sites:
        parts = _parts(site)
        if parts is not None:
            out.append({**site, "fn": parts[0].mask(parts[1])})
    return out


def data_value(site: dict[str, Any]) -> Any:
    """An observed site's value, ``NaN`` at its imputed entries (split by
    :func:`split_imputed`): the data, as ``obs_mask=`` leaves them."""
    parts = _parts(site)
    if parts is None:
        return site["value"]
    fn, imputed = parts
    mask = np.reshape(imputed, imputed.shape + (1,) * fn.event_dim)
    return jnp.where(mask, jnp.nan, jnp.asarray(site["value"]))
