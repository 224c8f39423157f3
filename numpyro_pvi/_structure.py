"""The structure of a model run against a guide, without computing it.

:func:`replay_trace` traces the model replayed against the guide under
:func:`jax.eval_shape` (sites, plates, shapes; nothing is computed), and
:func:`check_full_data` refuses subsampled plates for the functions that need
every observation (diagnostics and held-out scores).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from jax import random
from numpyro.handlers import replay, seed, substitute, trace

__all__ = ["check_full_data", "replay_trace"]


def replay_trace(
    rng_key: jax.Array,
    param_map: dict[str, jax.Array],
    model: Callable,
    guide: Callable,
    args: tuple,
    kwargs: dict,
) -> dict[str, Any]:
    """The structure of one trace of ``model`` replayed against ``guide``.

    Traced abstractly (``jax.eval_shape``, nothing is computed): values
    computed from draws are abstract (shapes only); observed values passed
    in as data stay concrete.
    """
    captured = {}

    def run(key: jax.Array, params: dict[str, jax.Array]) -> int:
        model_key, guide_key = random.split(key)
        seeded_guide = substitute(seed(guide, guide_key), data=params)
        guide_trace = trace(seeded_guide).get_trace(*args, **kwargs)
        seeded = substitute(replay(seed(model, model_key), guide_trace), data=params)
        captured["trace"] = trace(seeded).get_trace(*args, **kwargs)
        return 0

    jax.eval_shape(run, rng_key, param_map)
    return captured["trace"]


def check_full_data(tr: Mapping[str, dict[str, Any]], function: str) -> None:
    """Raise if a plate of the trace is subsampled.

    :param tr: a trace, e.g. from :func:`replay_trace`.
    :param function: the calling function's name, for the message.
    """
    for name, site in tr.items():
        if site["type"] != "plate":
            continue
        size, subsample = site["args"][0], np.shape(site["value"])[0]
        if subsample < size:
            raise ValueError(
                f"{function}: the plate '{name}' is subsampled ({subsample} of "
                f"{size}), but {function} needs every observation (a subsampled "
                "plate would give it a random subset of them); call it with the "
                "model arguments that use the full data (no subsample_size)."
            )
