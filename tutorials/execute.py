"""Execute the tutorial notebooks with nbclient.

Full run (writes the outputs into the notebooks, as committed)::

    python tutorials/execute.py tutorials/01_swap_the_loss.ipynb

Smoke run (cut steps and replications, outputs not written back unless
``--write`` is given)::

    python tutorials/execute.py --smoke tutorials/*.ipynb

The notebooks read ``NUMPYRO_PVI_SMOKE=1`` from the environment.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import subprocess
import sys
import time
from collections.abc import Iterator, MutableMapping
from pathlib import Path

import nbformat
from jupyter_client.manager import AsyncKernelManager
from jupyter_client.utils import run_sync
from nbclient import NotebookClient

SMOKE_ENV = "NUMPYRO_PVI_SMOKE"
FAST_COMPILE_XLA_FLAG = "--xla_cpu_use_fusion_emitters=false"


@functools.cache
def _xla_accepts(flag: str) -> bool:
    """Whether this jaxlib knows ``flag`` (XLA aborts on an unknown flag)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {flag}"
    probe = [sys.executable, "-c", "import jax; jax.devices()"]
    return subprocess.run(probe, env=env, capture_output=True).returncode == 0


def add_fast_compile_flag(env: MutableMapping[str, str]) -> None:
    """Add ``--xla_cpu_use_fusion_emitters=false`` to ``env["XLA_FLAGS"]``
    where this jaxlib has it and the flags do not set it already: XLA's CPU
    loop emitters compile about twice as fast as its fusion emitters."""
    flags = env.get("XLA_FLAGS", "")
    if "xla_cpu_use_fusion_emitters" not in flags and _xla_accepts(
        FAST_COMPILE_XLA_FLAG
    ):
        env["XLA_FLAGS"] = f"{flags} {FAST_COMPILE_XLA_FLAG}".strip()


@contextlib.contextmanager
def shared_kernel() -> Iterator[AsyncKernelManager]:
    """A ``python3`` kernel that runs several notebooks of one directory in
    turn (``execute_notebook(..., kernel=km)``), shut down on exit.

    The first notebook run in it starts it, with that run's environment and
    directory; each run begins with ``%reset -f``, so a notebook sees none of
    the previous one's names, while the modules it imports and the programs
    JAX compiled for it stay loaded.
    """
    km = AsyncKernelManager(kernel_name="python3")
    try:
        yield km
    finally:
        if km.has_kernel:
            run_sync(km.shutdown_kernel)(now=True)


def execute_notebook(
    path: str | os.PathLike,
    *,
    smoke: bool,
    timeout: int = 900,
    kernel: AsyncKernelManager | None = None,
    setup: str = "",
) -> tuple[nbformat.NotebookNode, float]:
    """Execute a notebook in its own directory with a fresh ``python3`` kernel,
    or in ``kernel`` (:func:`shared_kernel`) after ``%reset -f``.

    The kernel inherits this process's environment with ``JAX_PLATFORMS=cpu``
    and ``NUMPYRO_PVI_SMOKE`` set to ``"1"`` (smoke) or ``"0"`` (full run).
    Smoke runs take few steps, so compile time dominates them: they also set
    ``JAX_DISABLE_MOST_OPTIMIZATIONS=1`` and :func:`add_fast_compile_flag`.

    ``setup``, if given, runs in a cell of its own before the notebook's
    first (after ``%reset -f``) and is not part of the returned notebook.

    A cell error raises :class:`nbclient.exceptions.CellExecutionError`.

    :return: the executed notebook and the wall-clock time in seconds.
    """
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    env = dict(os.environ)
    env[SMOKE_ENV] = "1" if smoke else "0"
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("JAX_ENABLE_X64", None)
    env.pop("MPLBACKEND", None)
    if smoke:
        env["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1"
        add_fast_compile_flag(env)
    else:
        env.pop("JAX_DISABLE_MOST_OPTIMIZATIONS", None)
    preamble = ["%reset -f"] if kernel is not None else []
    preamble += [setup] if setup else []
    for source in reversed(preamble):
        nb.cells.insert(0, nbformat.v4.new_code_cell(source))
    client = NotebookClient(
        nb,
        km=kernel,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    start = time.perf_counter()
    try:
        client.execute(env=env)
    finally:
        del nb.cells[: len(preamble)]
        if kernel is not None and client.kc is not None:
            client.kc.stop_channels()
    return nb, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+")
    parser.add_argument("--smoke", action="store_true", help="cut steps")
    parser.add_argument(
        "--write", action="store_true", help="write outputs of a smoke run too"
    )
    args = parser.parse_args(argv)
    for name in args.notebooks:
        nb, seconds = execute_notebook(name, smoke=args.smoke)
        mode = "smoke" if args.smoke else "full"
        print(f"{name}: {mode} run {seconds:.1f} s", flush=True)
        if not args.smoke or args.write:
            nbformat.write(nb, name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
