"""Pulmonary fibrosis: a partially pooled linear model per patient, with
``len(np.unique(patient_code))`` computed from a model argument and local
latents in a plate other than the data plate."""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer.autoguide import AutoNormal

SOURCE = (
    "pyro-ppl/numpyro notebooks/source/"
    "bayesian_hierarchical_linear_regression.ipynb (model), commit 0b935d48"
)
TRAITS = ("Python on the arguments (np.unique)", "local latents", "two plates")


def model(patient_code, Weeks, FVC_obs=None):
    μ_α = numpyro.sample("μ_α", dist.Normal(0.0, 500.0))
    σ_α = numpyro.sample("σ_α", dist.HalfNormal(100.0))
    μ_β = numpyro.sample("μ_β", dist.Normal(0.0, 3.0))
    σ_β = numpyro.sample("σ_β", dist.HalfNormal(3.0))

    n_patients = len(np.unique(patient_code))

    with numpyro.plate("plate_i", n_patients):
        α = numpyro.sample("α", dist.Normal(μ_α, σ_α))
        β = numpyro.sample("β", dist.Normal(μ_β, σ_β))

    σ = numpyro.sample("σ", dist.HalfNormal(100.0))
    FVC_est = α[patient_code] + β[patient_code] * Weeks

    with numpyro.plate("data", len(patient_code)):
        numpyro.sample("obs", dist.Normal(FVC_est, σ), obs=FVC_obs)


def make_guide(model):
    return AutoNormal(model)


def _data(seed, visits):
    # patient_code as the notebook's LabelEncoder gives it (int), weeks, FVC
    rng = np.random.default_rng(seed)
    n_patients = 12
    patient_code = np.repeat(np.arange(n_patients), visits)
    weeks = np.tile(np.linspace(-5, 60, visits), n_patients).astype(np.float32)
    alpha = rng.normal(2700.0, 600.0, n_patients)
    beta = rng.normal(-5.0, 3.0, n_patients)
    fvc = alpha[patient_code] + beta[patient_code] * weeks
    fvc = (fvc + rng.normal(0.0, 150.0, fvc.size)).astype(np.float32)
    return (jnp.asarray(patient_code), jnp.asarray(weeks), jnp.asarray(fvc)), {}


def data(seed=0):
    return _data(seed, 8)


def held_out(seed=0):
    # the same patients at new weeks (their latents are in the fit)
    (code, weeks, fvc), _ = _data(seed + 7, 8)
    return (code, weeks + 2.0, fvc), {}
