"""One process of the multi-host tests (run by tests/test_multihost.py, not by pytest).

    python tests/multihost_worker.py SCENARIO OUT NUM_PROCESSES PROCESS_ID DEVICES PORT

SCENARIO ``sample``: blackjax NUTS (padded chains, chunks, a checkpoint and its
resume, a continuation), a numpyro model through ``cr.sample`` and a ``chain_map``;
process 0 saves everything to ``OUT/draws.npz``. SCENARIO ``die``: process 1 exits
after a first run, process 0 starts another one and must be stopped by JAX's
coordination service (heartbeat timeout), not hang.
"""

import os
import sys

import jax

scenario, out = sys.argv[1], sys.argv[2]
num_processes, process_id, devices, port = (int(a) for a in sys.argv[3:7])
jax.config.update("jax_num_cpu_devices", devices)
if num_processes > 1:
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        coordinator_bind_address=f"127.0.0.1:{port}",
        num_processes=num_processes,
        process_id=process_id,
        initialization_timeout=60,
        heartbeat_timeout_seconds=5,
        shutdown_timeout_seconds=10,  # a process that raised waits this long for the others
    )

import blackjax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

import chainrunner as cr  # noqa: E402

assert len(jax.devices()) == num_processes * devices
main = jax.process_index() == 0
scale = jnp.array([1.0, 2.0, 0.5])
nuts = blackjax.nuts(lambda x: -0.5 * jnp.sum((x / scale) ** 2), 0.5, jnp.ones(3))
start = jnp.linspace(-1.0, 1.0, 15).reshape(5, 3)  # 5 chains on 4 devices: 3 padded

if scenario == "die":
    cr.run(nuts, jax.random.key(0), start, 20, progress=False, warn=False)
    print(f"process {process_id}: first run done", flush=True)
    if process_id == 1:
        os._exit(3)  # dies without a word to the others
    cr.run(nuts, jax.random.key(1), start, 400, chunk_size=20, progress=False, warn=False)
    print("process 0: second run finished without process 1?!", flush=True)
    sys.exit(0)

# -- blackjax NUTS: 3 chunks (the last one partial), a checkpoint, padded chains
ckpt = os.path.join(out, "ckpt")
trace = cr.run(nuts, jax.random.key(7), start, 60, chunk_size=25, checkpoint=ckpt, warn=False)
again = cr.run(nuts, jax.random.key(7), start, 60, chunk_size=25, checkpoint=ckpt, warn=False)
assert again.attrs["resumed_from_draw"] == 60, again.attrs
np.testing.assert_array_equal(again.draws, trace.draws)
more = cr.run(nuts, jax.random.key(7), trace, 20, warn=False)  # continue: pads a global state


# -- numpyro through cr.sample (warmup adapts inside the kernel), ArviZ output
def model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfNormal(2.0))
    theta = numpyro.sample("theta", dist.Normal(mu, tau).expand([4]))
    numpyro.sample("y", dist.Normal(theta, 1.0), obs=y)


y = jnp.array([1.0, -0.5, 2.0, 0.3])
kernel = cr.from_numpyro(numpyro.infer.NUTS(model), model_args=(y,))
idata = cr.sample(
    kernel, jax.random.key(3), None, 40, num_warmup=40, num_chains=4, progress=False, warn=False
)

# -- chain_map: outputs are global arrays; read them whole with process_allgather
mapped = cr.chain_map(lambda x: jnp.sin(x) * 3.0)(jnp.arange(6.0))
mapped = np.asarray(multihost_utils.process_allgather(mapped, tiled=True))

if main:
    saved = {f"nuts_{k}": v for k, v in trace.stats.items()}
    saved["nuts_draws"] = trace.draws
    saved["more_draws"] = more.draws
    saved["final_position"] = np.asarray(
        multihost_utils.process_allgather(more.final_state.position, tiled=True)
        if num_processes > 1
        else more.final_state.position
    )
    for group in ("posterior", "sample_stats"):
        for name, var in idata[group].data_vars.items():
            saved[f"np_{group}_{name}"] = np.asarray(var.values)
    saved["mapped"] = mapped
    np.savez(os.path.join(out, "draws.npz"), **saved)
    print("saved", flush=True)
