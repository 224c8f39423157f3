"""Python's cyclic garbage collector in the test processes (xdist workers,
notebook kernels, device subprocesses).

Tracing allocates, and keeps in JAX's caches, millions of small objects.
With Python's defaults (a young-generation pass every 700 net allocations
of containers, full passes over everything alive) the collector took 15% of
a worker's time: 5.9 s of 40 s on two corpus programs, 2.1 s with
:data:`THRESHOLDS` after :func:`settle`, the peak memory the same.
"""

import gc

#: A young-generation pass every 50,000 net allocations instead of 700.
THRESHOLDS = (50_000, 20, 100)


def settle() -> None:
    """Collect, move everything alive to the permanent generation
    (``gc.freeze``: later full passes do not walk the imported modules
    again) and collect less often (:data:`THRESHOLDS`). Called once the
    process has imported what it will use."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)


#: :func:`settle` as code for a notebook kernel, run before each notebook.
KERNEL_SETUP = (
    f"import gc\ngc.collect()\ngc.freeze()\ngc.set_threshold(*{THRESHOLDS!r})"
)
