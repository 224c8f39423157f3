"""The compiled fits of a cross-validation: a grid of candidates over all
folds (a ``lax.map`` over λ and folds in chunks run at once, blocks of
steps), and the model's arguments as the programs' inputs. Their held-out
scores: :mod:`~numpyro_pvi.selection._score_programs`."""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from numpyro.handlers import seed, trace
from numpyro.infer import SVI, Trace_ELBO

from numpyro_pvi._trace.autoguide_setup import traceable_guide
from numpyro_pvi._trace.data_plate import DataPlate
from numpyro_pvi._trace.enumeration import summed_out_loss
from numpyro_pvi._trace.structure import feasible_improper
from numpyro_pvi.evaluation.draws import (
    CONCRETE_VALUE_ERRORS,
    join_arrays,
    split_arrays,
)
from numpyro_pvi.objectives.svi_scan import StopRule
from numpyro_pvi.selection._candidates import Grid
from numpyro_pvi.selection._folds import mask_observations

#: Blocks of steps per fit: the progress bar's updates; the last block's
#: mean loss is reported.
_BLOCKS = 20


class ModelData:
    """Model arguments split into array leaves (inputs of the compiled
    programs) and everything else (compile-time constants); with
    ``constant=True`` all of them are constants (no inputs), for models
    that compute with their arguments in Python (:func:`model_data`)."""

    def __init__(self, args: tuple, kwargs: dict, *, constant: bool = False) -> None:
        self.args, self.kwargs, self.constant = args, kwargs, constant
        self._structure, arrays = split_arrays(args, kwargs)
        self.dynamic = [] if constant else [jnp.asarray(x) for x in arrays]

    def rebuild(self, dynamic: list[jax.Array]) -> tuple[tuple, dict]:
        """``(args, kwargs)`` with the array leaves ``dynamic``."""
        if self.constant:
            return self.args, self.kwargs
        return join_arrays(self._structure, dynamic)


def model_data(
    model: Callable, args: tuple, kwargs: dict, rng_key: jax.Array
) -> ModelData:
    """The model's arguments as inputs of the compiled programs, or as
    constants when the model computes with them in Python (``len(np.unique
    (x))``: SVI.run closes over them, and so do the programs then; they are
    compiled for these arguments only)."""
    data = ModelData(args, kwargs)

    def probe(dynamic: list[jax.Array]) -> int:
        a, k = data.rebuild(dynamic)
        trace(seed(feasible_improper(model), rng_key)).get_trace(*a, **k)
        return 0

    try:
        jax.eval_shape(probe, data.dynamic)
    except CONCRETE_VALUE_ERRORS:
        return ModelData(args, kwargs, constant=True)
    except Exception:  # noqa: BLE001 - the programs will say what is wrong
        pass
    return data


def initial_params(
    model: Callable,
    guide: Callable,
    optim: Any,
    args: tuple,
    kwargs: dict,
    rng_key: jax.Array,
    *,
    eager: bool = False,
) -> Any:
    """The shapes of the guide's initial parameters, from ``SVI.init``
    traced abstractly: an autoguide that has not built its prototype builds
    it in that trace, on a copy, and so does every program that fits or
    scores (:func:`~numpyro_pvi._trace.autoguide_setup.traceable_guide`).
    With ``eager``, or where the abstract
    trace fails (a guide that cannot be copied or built under a trace),
    ``SVI.init`` runs eagerly, as ``SVI.run`` runs it: it builds the guide's
    prototype (the programs then use it) and raises NumPyro's own errors,
    such as initial values of zero density, which its search for valid
    initial values cannot raise inside a trace."""

    def init(key: jax.Array) -> Any:
        svi = SVI(model, traceable_guide(guide), optim, loss=Trace_ELBO())
        return svi.get_params(svi.init(key, *args, **kwargs))

    if not eager:
        try:
            return jax.eval_shape(init, rng_key)
        except Exception:  # noqa: BLE001 - the eager call below says what is wrong
            pass
    svi = SVI(model, guide, optim, loss=Trace_ELBO())
    return svi.get_params(svi.init(rng_key, *args, **kwargs))


#: Per-observation particle terms (``M b`` per fit) a ``vmap``-ped batch of
#: fits may hold: only fits small enough that four or more fit in this many
#: terms are batched, where the cost per operation dominates; larger ones
#: run one after another, their step's arrays in the core's cache.
BATCH_TERMS = 1 << 15


class FitLayout(NamedTuple):
    """How a grid's ``G · K`` fits are run: in ``chunks`` calls of the same
    program at once (one per core), each a ``lax.map`` over ``per_chunk``
    fits in ``vmap`` batches of ``batch`` (the last chunk padded with
    copies of the last fit). On CPU small fits are batched and large ones
    run one at a time (:data:`BATCH_TERMS`); an accelerator gets all the
    fits in one batch."""

    fits: int
    chunks: int
    per_chunk: int
    batch: int

    @classmethod
    def of(cls, num_fits: int, terms_per_fit: int, *, cpu: bool = True) -> FitLayout:
        if not cpu:
            return cls(num_fits, 1, num_fits, num_fits)
        chunks = min(os.cpu_count() or 1, num_fits)
        per_chunk = -(-num_fits // chunks)
        most = BATCH_TERMS // max(terms_per_fit, 1)
        most = most if most >= 4 else 1  # batches of 2 were slower than 1
        batch = -(-per_chunk // -(-per_chunk // most))  # balanced batches
        return cls(num_fits, chunks, -(-per_chunk // batch) * batch, batch)

    def chunk(self, x: np.ndarray, c: int) -> np.ndarray:
        """Chunk ``c`` of the per-fit rows of ``x``, padded with the last."""
        rows = np.minimum(np.arange(self.per_chunk) + c * self.per_chunk, self.fits - 1)
        return x[rows]


class GridProgram(NamedTuple):
    """The lowered programs of one grid's fits, their layout and inputs."""

    grid: Grid
    init: Any  # lowered, then compiled: (*chunk, *shared) -> states
    #: lowered, then compiled: (states, n, *chunk, *shared) -> (states, loss, params)
    run: Any
    layout: FitLayout
    chunks: list[tuple]  # per chunk: (values, folds) of its fits
    shared: tuple  # (keeps, key, dynamic)
    shapes: Any  # the fitted parameters' shapes, leading axes (G, K)


def lower_grid(
    grid: Grid,
    model: Callable,
    guide: Callable,
    optim: Any,
    plate: DataPlate,
    keeps: jax.Array,
    rng_key: jax.Array,
    data: ModelData,
) -> GridProgram:
    """Trace and lower the fits of every λ of ``grid`` on every fold's
    complement (``keeps``, ``(K, N)``) from the same key, in the chunks of
    their :class:`FitLayout`, ``n`` steps per call (a traced count)."""
    num_lams, num_folds = len(grid.values), keeps.shape[0]
    values = np.repeat(np.asarray(grid.values, jnp.result_type(float)), num_folds, 0)
    folds = np.tile(np.arange(num_folds, dtype=np.int32), num_lams)
    particles = getattr(grid.make_loss(values[0]), "num_particles", 1)
    layout = FitLayout.of(
        len(folds), particles * plate.subsample_size, cpu=jax.default_backend() == "cpu"
    )

    def svi(value: jax.Array, fold: jax.Array, keeps: jax.Array, g: Callable) -> SVI:
        assert plate.selector is not None  # cross-validation has a data plate
        masked = mask_observations(model, keep=keeps[fold], data_plate=plate.selector)
        # an enumerated model is summed out here: its TraceEnum_ELBO fits
        # the masked folds as Trace_ELBO
        return SVI(masked, g, optim, loss=summed_out_loss(grid.make_loss(value)))

    def over_fits(one: Callable, xs: tuple) -> Any:
        batch = layout.batch if layout.batch > 1 else None
        return lax.map(lambda x: one(*x), xs, batch_size=batch)

    # values, folds, keys and data are inputs, not constants: the chunks
    # run the same program (cached when a compilation cache is on)
    def init(values, folds, keeps, key, dynamic: list):  # noqa: ANN001, ANN202
        args, kwargs = data.rebuild(dynamic)
        g = traceable_guide(guide)  # the prototype stays in this trace

        def one(value: jax.Array, fold: jax.Array) -> Any:
            return svi(value, fold, keeps, g).init(key, *args, **kwargs)

        return over_fits(one, (values, folds))

    def run(states, n, values, folds, keeps, key, dynamic: list):  # noqa: ANN001, ANN202
        args, kwargs = data.rebuild(dynamic)
        g = traceable_guide(guide)

        def one(value: jax.Array, fold: jax.Array, state: Any) -> Any:
            s = svi(value, fold, keeps, g)
            s.init(key, *args, **kwargs)  # sets s up; the result is unused

            def step(i: Any, carry: tuple) -> tuple:
                state, total, running, m2 = carry
                state, loss = s.update(state, *args, **kwargs)
                # Welford's update: no cancellation of large losses' squares
                delta = loss - running
                running = running + delta / (i + 1)
                return state, total + loss, running, m2 + delta * (loss - running)

            zero = jnp.zeros(())
            carry = (state, zero, zero, zero)
            state, total, _, m2 = lax.fori_loop(0, n, step, carry)
            var = m2 / jnp.maximum(n - 1, 1)
            return state, (total / n, var), s.get_params(state)

        return over_fits(one, (values, folds, states))

    chunks = [
        (layout.chunk(values, c), layout.chunk(folds, c)) for c in range(layout.chunks)
    ]
    shared = (keeps, rng_key, data.dynamic)
    init_lowered = jax.jit(init).lower(*chunks[0], *shared)
    states = init_lowered.out_info
    count = jax.ShapeDtypeStruct((), jnp.int32)
    run_lowered = jax.jit(run).lower(states, count, *chunks[0], *shared)
    shapes = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct((num_lams, num_folds) + x.shape[1:], x.dtype),
        run_lowered.out_info[2],
    )
    return GridProgram(grid, init_lowered, run_lowered, layout, chunks, shared, shapes)


#: XLA's options for the programs of a cross-validation on CPU: the backend
#: (LLVM) optimisation level 1 instead of 2: they compile sooner and run as
#: fast.
CPU_COMPILER_OPTIONS = {"xla_backend_optimization_level": 1}


def compile_all(lowered: list[Any]) -> list[Any]:
    """Compile lowered programs one after the other, with
    :data:`CPU_COMPILER_OPTIONS` on CPU."""
    options = CPU_COMPILER_OPTIONS if jax.default_backend() == "cpu" else None
    return [p.compile(compiler_options=options) for p in lowered]


def fit_grid(
    program: GridProgram,
    *,
    num_steps: int,
    progress_bar: bool,
    stop: threading.Event | None = None,
    stop_early: bool = False,
) -> tuple[Grid, Any, np.ndarray] | None:
    """Compile a lowered :class:`GridProgram` and run its chunks at once for
    ``num_steps`` steps in blocks (the bar shows the steps every fit has
    done); with ``stop_early``, a chunk ends once the losses of all its fits
    are flat (:class:`~numpyro_pvi.objectives.svi_scan.StopRule`). Once
    ``stop`` is set (the caller met an error, or an interrupt), every chunk
    ends after its current block and the result is ``None``.

    :return: its grid, the fitted parameters with leading axes ``(G, K)``
        and the mean loss of each fit over its last block of steps (the last
        5%), ``(G, K)``.
    """
    from tqdm.auto import tqdm

    init, run = compile_all([program.init, program.run])
    block = math.ceil(num_steps / _BLOCKS)
    done = [0] * len(program.chunks)
    desc = f"CV {', '.join(program.grid.labels)}"
    with tqdm(total=num_steps, disable=not progress_bar, desc=desc) as bar:
        lock = threading.Lock()

        def one(c: int) -> tuple | None:
            states = init(*program.chunks[c], *program.shared)
            rule, flat = StopRule(num_steps), False
            while done[c] < num_steps and not flat and not (stop and stop.is_set()):
                n = min(block, num_steps - done[c])
                states, (losses, var), params = run(
                    states,
                    jnp.asarray(n, jnp.int32),
                    *program.chunks[c],
                    *program.shared,
                )
                flat = stop_early and rule.update(losses, var, n, done[c] + n)
                with lock:
                    done[c] = num_steps if flat else done[c] + n
                    bar.update(min(done) - bar.n)
            if stop and stop.is_set():
                return None
            return jax.device_get((params, losses))

        with ThreadPoolExecutor(max_workers=len(program.chunks)) as pool:
            outs = list(pool.map(one, range(len(program.chunks))))
    if any(out is None for out in outs):
        return None
    lead = jax.tree.leaves(program.shapes)[0].shape[:2]  # (G, K)
    params, losses = jax.tree.map(
        lambda *xs: np.concatenate(xs)[: program.layout.fits].reshape(
            lead + xs[0].shape[1:]
        ),
        *outs,
    )
    return program.grid, params, losses
