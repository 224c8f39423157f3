"""The Titanic survival model with Bayesian imputation of missing ages: the
missing entries of ``age`` filled by a latent site (``.mask(False)``) and
the result observed, Python on the arguments (``np.isnan``, ``np.nonzero``),
no plate, two observed sites (a Normal and a Bernoulli) at each index.

``age_sigma`` has a ``HalfNormal`` prior here: the notebook's ``Normal(0,
1)`` gives negative scales, which NUTS rejects but SVI cannot fit (NumPyro's
``Trace_ELBO`` fails on it as written)."""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer.autoguide import AutoNormal

SOURCE = (
    "pyro-ppl/numpyro notebooks/source/bayesian_imputation.ipynb (model), "
    "commit 0b935d48"
)
TRAITS = (
    "observed site with imputed entries",
    "no plate",
    "Python on the arguments",
    "two likelihood families in one observation",
)


def model(
    age, pclass, title, sex, sibsp, parch, embarked, survived=None, bayesian_impute=True
):
    b_pclass = numpyro.sample("b_Pclass", dist.Normal(0, 1).expand([3]))
    b_title = numpyro.sample("b_Title", dist.Normal(0, 1).expand([5]))
    b_sex = numpyro.sample("b_Sex", dist.Normal(0, 1).expand([2]))
    b_sibsp = numpyro.sample("b_SibSp", dist.Normal(0, 1).expand([2]))
    b_parch = numpyro.sample("b_Parch", dist.Normal(0, 1).expand([3]))
    b_embarked = numpyro.sample("b_Embarked", dist.Normal(0, 1).expand([3]))

    # impute age by Title
    isnan = np.isnan(age)
    age_nanidx = np.nonzero(isnan)[0]
    if bayesian_impute:
        age_mu = numpyro.sample("age_mu", dist.Normal(0, 1).expand([5]))
        age_mu = age_mu[title]
        age_sigma = numpyro.sample("age_sigma", dist.HalfNormal(1).expand([5]))
        age_sigma = age_sigma[title]
        age_impute = numpyro.sample(
            "age_impute",
            dist.Normal(age_mu[age_nanidx], age_sigma[age_nanidx]).mask(False),
        )
        age = jnp.asarray(age).at[age_nanidx].set(age_impute)
        numpyro.sample("age", dist.Normal(age_mu, age_sigma), obs=age)
    else:
        # fill missing data by the mean of ages for each title
        age_impute = age_mean_by_title[title][age_nanidx]  # noqa: F821
        age = jnp.asarray(age).at[age_nanidx].set(age_impute)

    a = numpyro.sample("a", dist.Normal(0, 1))
    b_age = numpyro.sample("b_Age", dist.Normal(0, 1))
    logits = a + b_age * age
    logits = logits + b_title[title] + b_pclass[pclass] + b_sex[sex]
    logits = logits + b_sibsp[sibsp] + b_parch[parch] + b_embarked[embarked]
    numpyro.sample("survived", dist.Bernoulli(logits=logits), obs=survived)


def make_guide(model):
    return AutoNormal(model)


def _data(seed, n=80, missing=16):
    # the notebook's columns: standardised ages with missing values, integer
    # codes of the categorical columns, binary survival
    rng = np.random.default_rng(seed)
    title = rng.integers(0, 5, n)
    age = (0.4 * title - 0.8 + 0.6 * rng.standard_normal(n)).astype(np.float32)
    age[rng.choice(n, missing, replace=False)] = np.nan
    codes = [rng.integers(0, k, n) for k in (3, 2, 2, 3, 3)]
    pclass, sex, sibsp, parch, embarked = codes
    logits = 0.8 * np.nan_to_num(age) - 0.9 * sex + 0.5 * (pclass == 0)
    survived = (rng.random(n) < 1 / (1 + np.exp(-logits))).astype(np.float32)
    args = (age, pclass, title, sex, sibsp, parch, embarked)
    return args, {"survived": jnp.asarray(survived)}


def data(seed=0):
    return _data(seed)


def held_out(seed=1):
    return _data(seed)
