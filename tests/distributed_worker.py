"""One of two JAX processes on this machine (``test_distributed.py``):
``distributed_worker.py <process id> <coordinator port>``.

The user guide's multi-host recipe, as it is written there: each process
calls ``jax.distributed.initialize`` (CPU collectives by gloo), builds the
mesh over the devices of both processes, assembles the global arrays from
its own rows with ``jax.make_array_from_process_local_data`` and computes
the objectives' loss and gradient on them. Process 0 prints one JSON
document: per objective, the largest relative difference from the same
objective computed in this process alone on all the rows.
"""

import json
import os
import sys

LOCAL_DEVICES = 2
N, D = 60, 3

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + f" --xla_force_host_platform_device_count={LOCAL_DEVICES}"
)
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")


def regression(x, y):
    import numpyro
    import numpyro.distributions as dist

    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([D]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Normal(x @ w, sigma), obs=y)


def main() -> None:
    process_id, port = int(sys.argv[1]), sys.argv[2]
    jax.distributed.initialize(
        coordinator_address=f"localhost:{port}", num_processes=2, process_id=process_id
    )
    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax import random
    from jax.sharding import NamedSharding, PartitionSpec
    from numpyro.infer import SVI
    from numpyro.infer.autoguide import AutoNormal

    import numpyro_pvi
    from numpyro_pvi.sharding import data_mesh

    # every process can make all the rows here; each keeps only its own
    kx, ky = random.split(random.PRNGKey(0))
    x_all = np.asarray(random.normal(kx, (N, D)))
    y_all = x_all @ np.arange(1.0, D + 1, dtype=np.float32)
    y_all = y_all + np.asarray(random.normal(ky, (N,)))

    # -- the recipe: the mesh over every process's devices, global arrays
    # from each process's rows (its devices' block of the data axis) --------
    mesh = data_mesh()  # jax.devices(): both processes'
    rows = N // jax.process_count()
    mine = slice(jax.process_index() * rows, (jax.process_index() + 1) * rows)
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    x = jax.make_array_from_process_local_data(sharding, x_all[mine], (N, D))
    y = jax.make_array_from_process_local_data(sharding, y_all[mine], (N,))

    from jax.experimental.multihost_utils import process_allgather

    out = {
        "process_count": jax.process_count(),
        "device_count": jax.device_count(),
        "assembled": bool(
            np.array_equal(process_allgather(x, tiled=True), x_all)
            and np.array_equal(process_allgather(y, tiled=True), y_all)
        ),
        "sharded_over": len(x.sharding.device_set),
    }
    objectives = {  # loss and gradient: the largest relative difference
        "pvi-log": numpyro_pvi.PredictiveELBO("log", num_particles=8),
        "pvi-crps": numpyro_pvi.PredictiveELBO("crps", num_particles=8),
        "pacm": numpyro_pvi.PACmELBO(num_particles=8),
        "softcvi": numpyro_pvi.SoftCVIELBO(num_particles=8),
    }
    for name, loss in objectives.items():
        guide = AutoNormal(regression)
        svi = SVI(regression, guide, optax.adam(0.05), loss)
        params = svi.get_params(svi.init(random.PRNGKey(1), x_all, y_all))

        def value_and_grad(p, xx, yy, loss=loss, guide=guide):
            return jax.value_and_grad(
                lambda q: loss.loss(random.PRNGKey(3), q, regression, guide, xx, yy)
            )(p)

        alone = jax.jit(value_and_grad)(params, jnp.asarray(x_all), jnp.asarray(y_all))
        together = jax.jit(value_and_grad)(params, x, y)
        # both are replicated over the devices: each process reads its copy
        together = jax.tree.map(lambda a: np.asarray(a.addressable_data(0)), together)
        out[name] = max(
            float(np.max(np.abs(np.asarray(a) - b)) / max(1.0, np.max(np.abs(b))))
            for a, b in zip(
                jax.tree.leaves(alone), jax.tree.leaves(together), strict=True
            )
        )
    if jax.process_index() == 0:
        print(json.dumps(out))
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
