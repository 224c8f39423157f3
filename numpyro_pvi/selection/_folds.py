"""The model that sees one fold's complement: :func:`mask_observations`
wraps a model so that only the kept observations enter any objective, with
every other site unchanged (the folds themselves:
:func:`numpyro_pvi.selection.fold_ids.fold_ids`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
from numpyro.primitives import Messenger


class mask_observations(Messenger):
    r"""Keep only some observations of the data plate in a model.

    Every observed site inside the plate ``data_plate`` gets, at
    observation :math:`i`, its log density masked to zero and its handler
    scale multiplied by :math:`k_i \in \{0, 1\}`, where ``keep`` is
    :math:`k` over all :math:`N` observations of the plate (indexed by the
    plate's subsample when it is subsampled). Dropped observations then
    contribute nothing to any objective of the package or of NumPyro — a
    predictive score weights each observation by its scale — while latent
    sites, local ones included, are untouched: a dropped observation's local
    latent keeps its prior term, so the guide's factor for it is fitted by
    the prior side of the objective only. Observed sites outside the data
    plate are terms of the joint density, not observations, and are left
    alone too.

    ``data_plate`` may be a negative batch dimension instead of a plate's
    name, for models written without a plate: the observed values whose
    batch shape has :math:`N` entries along it are masked along it.

    ``keep`` may be a traced array, so that one compiled program fits every
    fold of a cross-validation under ``vmap``.

    :param fn: the model.
    :param keep: ``(N,)`` array, nonzero for the observations kept.
    :param data_plate: name of the plate that indexes observations, or a
        negative batch dimension.
    """

    def __init__(
        self, fn: Callable | None = None, *, keep: Any, data_plate: str | int
    ) -> None:
        if jnp.ndim(keep) != 1:
            raise ValueError(
                "mask_observations: keep must be a 1-d array over the "
                f"observations of data_plate={data_plate!r}, got shape "
                f"{jnp.shape(keep)}."
            )
        self.keep = jnp.asarray(keep) != 0
        self.data_plate = data_plate
        # (size, subsample indices) of the data plate
        self._plate: tuple[Any, Any] | None = None
        super().__init__(fn)

    def __enter__(self) -> Any:
        self._plate = None
        return super().__enter__()

    def postprocess_message(self, msg: dict[str, Any]) -> None:
        if msg["type"] == "plate" and msg["name"] == self.data_plate:
            self._plate = (msg["args"][0], msg["value"])

    def process_message(self, msg: dict[str, Any]) -> None:
        if msg["type"] != "sample" or not msg["is_observed"]:
            return
        if isinstance(self.data_plate, int):
            dim, indices = self._batch_dim(msg)
        else:
            dim, indices = self._plate_dim(msg)
        if dim is None:  # outside the data plate: a term of the joint density
            return
        keep = jnp.reshape(self.keep[indices], (-1,) + (1,) * (-dim - 1))
        msg["fn"] = msg["fn"].mask(keep)
        weight = keep.astype(jnp.result_type(float))
        msg["scale"] = weight if msg["scale"] is None else msg["scale"] * weight

    def _batch_dim(self, msg: dict[str, Any]) -> tuple[int | None, Any]:
        shape = jnp.shape(msg["value"])
        batch = shape[: max(len(shape) - msg["fn"].event_dim, 0)]
        dim, size = int(self.data_plate), self.keep.shape[0]
        if len(batch) < -dim or batch[dim] != size:
            return None, None
        return dim, jnp.arange(size)

    def _plate_dim(self, msg: dict[str, Any]) -> tuple[int | None, Any]:
        frame = next(
            (f for f in msg["cond_indep_stack"] if f.name == self.data_plate), None
        )
        if frame is None:
            return None, None
        if self._plate is None:
            raise ValueError(
                f"mask_observations: the plate '{self.data_plate}' of site "
                f"'{msg['name']}' was not opened inside the model; open it "
                "with numpyro.plate inside the model function."
            )
        size, indices = self._plate
        if self.keep.shape[0] != size:
            raise ValueError(
                f"mask_observations: keep has {self.keep.shape[0]} entries but "
                f"the plate '{self.data_plate}' of site '{msg['name']}' has size "
                f"{size}; pass one entry per observation of the plate."
            )
        return frame.dim, indices
