"""Run in a subprocess with several host devices (the ``four_devices`` and
``four_devices_vsbc`` fixtures in conftest.py, used by test_sharding.py and
test_vsbc.py, test_predictive_calibration.py):
``sharding_worker.py <devices> objectives|vsbc``.

Prints one JSON document. ``objectives``: for each objective, the largest
difference between the loss/gradient computed on sharded and on unsharded
data, and whether the compiled step gathers a full data array onto one
device. ``vsbc``: under ``"vsbc_dispatch"``, VSBC's p-values and losses from
each chain method, and under its ``"predictive_calibration"`` the PIT values
and losses of predictive calibration, vectorized and sharded.
"""

import json
import os
import re
import sys

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
import optax
from collector import settle  # tests/collector.py: this script's directory
from jax import random
from jax.sharding import NamedSharding, PartitionSpec
from numpyro.infer import SVI
from numpyro.infer.autoguide import AutoNormal

import numpyro_pvi
from numpyro_pvi import Replications
from numpyro_pvi.sharding import data_mesh, shard_data

N, D = 64, 3
#: A data plate whose size is no multiple of the devices (padded).
UNEVEN = 1001
SVI_RUNS = ("pvi-log", "pvi-crps", "softcvi")


def regression(x, y, subsample_size=None):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([D]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Normal(x[idx] @ w, sigma), obs=y[idx])


def logistic(x, y, subsample_size=None):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([D]).to_event(1))
    with numpyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=x[idx] @ w), obs=y[idx])


def binomial(x, y, subsample_size=None):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([D]).to_event(1))
    with numpyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Binomial(5, logits=x[idx] @ w), obs=y[idx])


def binomial_many(x, y, subsample_size=None):
    """60 trials: the derangement's overlaps by the recurrence."""
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([D]).to_event(1))
    with numpyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Binomial(60, logits=x[idx] @ w), obs=y[idx])


def objectives():
    out = {
        "pvi-log": (numpyro_pvi.PredictiveELBO("log", num_particles=8), regression),
        "pvi-log-posterior": (
            numpyro_pvi.PredictiveELBO(
                "log", num_particles=8, regularizer="posterior", lam=0.5
            ),
            regression,
        ),
        "pacm": (numpyro_pvi.PACmELBO(num_particles=8), regression),
    }
    optional = {
        "pvi-crps": lambda: (
            numpyro_pvi.PredictiveELBO("crps", num_particles=8),
            regression,
        ),
        "pvi-quadratic": lambda: (
            numpyro_pvi.PredictiveELBO("quadratic", num_particles=8),
            logistic,
        ),
        "pvi-quadratic-derangement": lambda: (
            numpyro_pvi.PredictiveELBO(
                numpyro_pvi.scores.QuadraticScore(estimator="derangement"),
                num_particles=8,
            ),
            binomial,
        ),
        "pvi-quadratic-many-trials": lambda: (
            numpyro_pvi.PredictiveELBO("quadratic", num_particles=8),
            binomial_many,
        ),
        "pvi-crps-mixture": lambda: (
            numpyro_pvi.PredictiveELBO("crps", num_particles=8),
            regression,
        ),
        "softcvi": lambda: (numpyro_pvi.SoftCVIELBO(num_particles=8), regression),
        "snis": lambda: (numpyro_pvi.SNISForwardKL(num_particles=8), regression),
    }
    for name, make in optional.items():
        try:
            out[name] = make()
        except (AttributeError, ValueError):
            out[name] = None
    return out


def full_gathers(hlo: str, shape: tuple) -> list[str]:
    dims = ",".join(str(s) for s in shape)
    return [
        line.strip()
        for line in hlo.splitlines()
        if "all-gather" in line and f"[{dims}]" in line.split("all-gather")[0]
    ]


def _max_rel_diff(a_tree, b_tree) -> float:
    return max(
        float(jnp.max(jnp.abs(a - b)) / max(1.0, float(jnp.max(jnp.abs(a)))))
        for a, b in zip(jax.tree.leaves(a_tree), jax.tree.leaves(b_tree), strict=True)
    )


def _guide(name: str, model):
    """AutoNormal, or the mixture guide for the cases named ``*-mixture``
    (their closed-form CRPS in blocks of observations: :func:`main`)."""
    from numpyro_pvi.guides import AutoGaussianMixture

    if name.endswith("-mixture"):
        return AutoGaussianMixture(model, num_components=2)
    return AutoNormal(model)


def check(loss, model, guide, x, y, run_svi: bool) -> dict:
    svi = SVI(model, guide, optax.adam(0.05), loss)
    params = svi.get_params(svi.init(random.PRNGKey(1), x, y))
    xs, ys = shard_data(x, y)

    def f(p, xx, yy, sub=None):
        return loss.loss(random.PRNGKey(3), p, model, guide, xx, yy, sub)

    vg = jax.jit(jax.value_and_grad(f), static_argnums=3)
    compiled = vg.lower(params, xs, ys, None).compile()
    hlo = compiled.as_text()
    entry = {
        "max_rel_diff_subNone": _max_rel_diff(
            vg(params, x, y, None), compiled(params, xs, ys)
        ),
        "max_rel_diff_sub16": _max_rel_diff(
            vg(params, x, y, 16), vg(params, xs, ys, 16)
        ),
        "full_gathers": full_gathers(hlo, (N, D)) + full_gathers(hlo, (N,)),
        "has_collectives": bool(re.search(r"all-reduce|reduce-scatter", hlo)),
        "sharded_inputs": len(xs.sharding.device_set),
    }
    if run_svi:  # SVI.run on sharded data gives the same parameters
        r1 = svi.run(random.PRNGKey(4), 5, x, y, progress_bar=False)
        r2 = svi.run(random.PRNGKey(4), 5, xs, ys, progress_bar=False)
        entry["svi_max_rel_diff"] = _max_rel_diff(r1.params, r2.params)
    return entry


def padded_check(loss, model, guide, x, y) -> dict:
    """``shard_data(..., pad=True)`` of data whose size is no multiple of the
    devices, masked by the ``keep`` it returns: the largest relative
    difference of loss and gradient from the unpadded, unsharded objective
    (and of a subsampled plate's from the padded, unsharded one), and of
    the held-out log scores of the observations; the padding's scores."""
    from numpyro_pvi.selection import mask_observations

    svi = SVI(model, guide, optax.adam(0.05), loss)
    params = svi.get_params(svi.init(random.PRNGKey(1), x, y))
    xs, ys, keep = shard_data(x, y, pad=True)
    masked = mask_observations(model, keep=keep, data_plate="data")

    def f(p, m, xx, yy, sub=None):
        return loss.loss(random.PRNGKey(3), p, m, guide, xx, yy, sub)

    vg = jax.jit(jax.value_and_grad(f), static_argnums=(1, 4))
    padded = jax.device_get((xs, ys, keep))
    entry = {
        "padded_size": int(xs.shape[0]),
        "sharded_inputs": len(xs.sharding.device_set),
        "max_rel_diff": _max_rel_diff(
            vg(params, model, x, y, None), vg(params, masked, xs, ys, None)
        ),
        "max_rel_diff_sub16": _max_rel_diff(
            vg(
                params,
                mask_observations(model, keep=padded[2], data_plate="data"),
                padded[0],
                padded[1],
                16,
            ),
            vg(params, masked, xs, ys, 16),
        ),
    }
    if isinstance(loss, numpyro_pvi.PredictiveELBO) and loss.score.name == "log":
        key = random.PRNGKey(4)
        a = numpyro_pvi.predictive_score(key, params, model, guide, x, y, num_draws=50)
        b = numpyro_pvi.predictive_score(
            key, params, masked, guide, xs, ys, num_draws=50
        )
        n = x.shape[0]
        entry["score_max_rel_diff"] = _max_rel_diff(a.score, b.score[:n])
        entry["padding_scores"] = [float(v) for v in b.score[n:]]
    return entry


def gathering_control(x) -> list[str]:
    """A function that does gather the data: the detector must see it."""
    xs = shard_data(x)
    replicated = NamedSharding(xs.sharding.mesh, PartitionSpec())
    fn = jax.jit(lambda a: jax.lax.with_sharding_constraint(a, replicated) * 2.0)
    return full_gathers(fn.lower(xs).compile().as_text(), (N, D))


def particles_check(x, y, y_counts) -> dict:
    """Objectives with their particles split across the devices
    (``shard_particles``), alone on a 4-device mesh and with the data on a
    2 x 2 mesh: the largest relative difference of loss and gradient from
    the unsharded objective, and whether the step has collectives."""
    from numpyro.infer import Trace_ELBO

    from numpyro_pvi.sharding import shard_particles

    cases = {
        "trace_elbo": (lambda v: Trace_ELBO(num_particles=8, vectorize_particles=v)),
        "pvi-crps": lambda v: numpyro_pvi.PredictiveELBO(
            "crps", num_particles=8, vectorize_particles=v
        ),
        "pacm": lambda v: numpyro_pvi.PACmELBO(num_particles=8, vectorize_particles=v),
        "stratified-mixture": lambda v: numpyro_pvi.StratifiedELBO(
            num_particles=2, vectorize_particles=v
        ),
        "pvi-crps-mixture": lambda v: numpyro_pvi.PredictiveELBO(
            "crps", num_particles=8, vectorize_particles=v
        ),
        "pvi-quadratic-derangement": lambda v: numpyro_pvi.PredictiveELBO(
            numpyro_pvi.scores.QuadraticScore(estimator="derangement"),
            num_particles=8,
            vectorize_particles=v,
        ),
    }
    auto = jax.sharding.AxisType.Auto
    meshes = {
        "particles": (data_mesh(axis_name="particles"), False),
        "particles_x_data": (
            jax.make_mesh((2, 2), ("particles", "data"), axis_types=(auto, auto)),
            True,
        ),
    }
    out = {}
    for name, make in cases.items():
        model, data_y = (binomial, y_counts) if "quadratic" in name else (regression, y)
        guide = _guide(name, model)
        plain = make(True)
        svi = SVI(model, guide, optax.adam(0.05), plain)
        params = svi.get_params(svi.init(random.PRNGKey(1), x, data_y))

        def value_and_grad(loss, guide=guide, model=model):
            return jax.jit(
                jax.value_and_grad(
                    lambda p, xx, yy: loss.loss(
                        random.PRNGKey(3), p, model, guide, xx, yy
                    )
                )
            )

        reference = value_and_grad(plain)(params, x, data_y)
        out[name] = {}
        for mesh_name, (mesh, with_data) in meshes.items():
            loss = make(shard_particles(mesh, "particles"))
            xs, ys = (
                shard_data(x, data_y, mesh=mesh, axis_name="data")
                if with_data
                else (x, data_y)
            )
            compiled = value_and_grad(loss).lower(params, xs, ys).compile()
            out[name][mesh_name] = {
                "max_rel_diff": _max_rel_diff(reference, compiled(params, xs, ys)),
                "has_collectives": bool(
                    re.search(r"all-reduce|reduce-scatter", compiled.as_text())
                ),
            }
    uneven = numpyro_pvi.PredictiveELBO(
        "crps",
        num_particles=6,
        vectorize_particles=shard_particles(meshes["particles"][0]),
    )
    guide = AutoNormal(regression)
    svi = SVI(regression, guide, optax.adam(0.05), Trace_ELBO())
    params = svi.get_params(svi.init(random.PRNGKey(1), x, y))
    try:
        uneven.loss(random.PRNGKey(3), params, regression, guide, x, y)
        out["uneven_error"] = None
    except ValueError as error:
        out["uneven_error"] = str(error)
    try:
        shard_particles(jax.make_mesh((4,), ("particles",)))
        out["explicit_error"] = None
    except ValueError as error:
        out["explicit_error"] = str(error)
    return out


def vsbc_model(n, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    log_s = numpyro.sample("log_s", dist.Normal(0.0, 0.5))
    with numpyro.plate("data", n):
        numpyro.sample("y", dist.Normal(mu, jnp.exp(log_s)), obs=y)


def vsbc_dispatch() -> dict:
    """The same VSBC run dispatched sequentially, vectorized, sharded, chunked."""
    from numpyro.infer import Trace_ELBO

    from numpyro_pvi.diagnostics import vsbc

    out = {"devices": jax.local_device_count()}
    for name, method, chunk in [
        ("vectorized", "vectorized", None),
        ("sequential", "sequential", None),
        ("sharded", "sharded", None),
        ("sharded_chunked", "sharded", 6),
    ]:
        idata = vsbc(
            random.PRNGKey(7),
            vsbc_model,
            AutoNormal(vsbc_model),
            optax.adam(0.05),
            Trace_ELBO(),
            10,
            replications=Replications(
                num_simulations=10,
                num_svi_steps=60,
                num_draws=200,
                chain_method=method,
                chunk_size=chunk,
                progress_bar=False,
            ),
            observed_sites=["y"],
        )
        out[name] = {v: idata.vsbc[v].values.ravel().tolist() for v in ("mu", "log_s")}
        out[name]["loss"] = idata.vsbc_fit_stats["loss"].values.ravel().tolist()
    out["predictive_calibration"] = calibration_dispatch()
    return out


def calibration_dispatch() -> dict:
    """The same predictive calibration run vectorized and sharded."""
    from numpyro.infer import Trace_ELBO

    from numpyro_pvi.diagnostics import get_group, predictive_calibration

    out = {}
    for method in ("vectorized", "sharded"):
        result = predictive_calibration(
            random.PRNGKey(8),
            vsbc_model,
            AutoNormal(vsbc_model),
            optax.adam(0.05),
            Trace_ELBO(),
            10,
            replications=Replications(
                num_simulations=10,
                num_svi_steps=60,
                num_draws=200,
                chain_method=method,
                progress_bar=False,
            ),
            observed_sites=["y"],
        )
        pit = get_group(result, "calibration_pit")["pit"].values.ravel().tolist()
        loss = get_group(result, "calibration_fit_stats")["loss"].values.ravel()
        out[method] = {"pit": pit, "loss": loss.tolist()}
    return out


def by_model(model, y_cont):
    """The observations of ``model`` from continuous ones."""
    return {
        logistic: (y_cont > 0).astype(jnp.float32),
        binomial: jnp.clip(jnp.round(jnp.abs(y_cont)), 0, 5),
        binomial_many: jnp.clip(jnp.round(6.0 * jnp.abs(y_cont)), 0, 60),
    }.get(model, y_cont)


def main():
    assert len(jax.devices()) == int(sys.argv[1]), jax.devices()
    if sys.argv[2] == "vsbc":
        print(json.dumps({"vsbc_dispatch": vsbc_dispatch()}))
        return
    kx, ky = random.split(random.PRNGKey(0))
    x = random.normal(kx, (N, D))
    y_cont = x @ jnp.arange(1.0, D + 1) + random.normal(ky, (N,))
    y_counts = jnp.clip(jnp.round(jnp.abs(y_cont)), 0, 5)
    kx, ky = random.split(random.PRNGKey(5))
    x_uneven = random.normal(kx, (UNEVEN, D))
    y_uneven = x_uneven @ jnp.arange(1.0, D + 1) + random.normal(ky, (UNEVEN,))
    results = {}
    for name, entry in objectives().items():
        if entry is None:
            results[name] = None
            continue
        loss, model = entry
        y = by_model(model, y_cont)
        guide = _guide(name, model)
        results[name] = check(loss, model, guide, x, y, run_svi=name in SVI_RUNS)
        # 1001 observations on 4 devices: padded by shard_data and masked
        x_odd, y_odd = x_uneven, by_model(model, y_uneven)
        results[name]["padded"] = padded_check(loss, model, guide, x_odd, y_odd)
    results["control_full_gathers"] = gathering_control(x)
    results["particles"] = particles_check(x, y_cont, y_counts)
    print(json.dumps(results))


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    settle()
    main()
