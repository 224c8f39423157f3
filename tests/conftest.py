"""Test configuration: CPU only, fixed seeds, float64 on request.

The numerics tests (marker ``numerics``) run a second time with
``JAX_ENABLE_X64=1``; ``make test`` does both.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("MPLBACKEND", "Agg")

import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import pytest  # noqa: E402

numpyro.set_platform("cpu")
if os.environ.get("JAX_ENABLE_X64", "0") not in ("", "0", "false", "False"):
    numpyro.enable_x64()

import jax  # noqa: E402

X64 = bool(jax.config.jax_enable_x64)


@pytest.fixture(autouse=True)
def _fixed_seed():
    np.random.seed(0)
    yield


