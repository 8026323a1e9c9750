"""More chains than devices: 1,000 chains on 8 simulated CPU devices, with batch_size.

Each device holds 125 chains. ``batch_size=None`` advances them all in one vmap;
``batch_size=b`` loops over batches of ``b`` (``lax.map``), which bounds memory and
lets NUTS chains that finish their trajectories early stop waiting for the slowest
chain of a big batch. The draws of a chain depend only on the seed and on this
per-device width, never on the device count.

Run: python examples/more_chains_than_devices.py [--quick]
"""

import jax

jax.config.update("jax_num_cpu_devices", 8)  # before any JAX work

import argparse  # noqa: E402

import blackjax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import chainrunner as cr  # noqa: E402


def logdensity(x):
    # A banana-shaped 2-d target: NUTS trajectories differ a lot in length.
    return -0.5 * (x[0] ** 2 / 4.0 + (x[1] - 0.5 * x[0] ** 2 + 1.0) ** 2)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    num_chains, num_samples = (1000, 500) if not args.quick else (40, 40)

    nuts = blackjax.nuts(logdensity, 0.3, jnp.ones(2))
    start = jax.random.normal(jax.random.key(0), (num_chains, 2))
    mesh = cr.chain_mesh(8)
    # How chainrunner places the chains: blocks of the chain axis, one per device.
    jax.debug.visualize_array_sharding(jax.device_put(start, NamedSharding(mesh, P("chain"))))
    results = {}
    for batch_size in (None, 25, 5):
        trace = cr.run(
            nuts, jax.random.key(1), start, num_samples, mesh=mesh, batch_size=batch_size,
            progress=False,
        )  # fmt: skip
        results[batch_size] = trace
        a = trace.attrs
        print(
            f"{a['layout']:60}  compile {a['compile_time']:5.2f} s  "
            f"sampling {a['sampling_time']:6.2f} s  mean {trace.draws.mean((0, 1)).round(3)}"
        )
    diff = np.max(np.abs(results[None].draws - results[5].draws))
    print(f"largest difference between layouts: {diff:.2e} (float32 round-off)")


if __name__ == "__main__":
    main()
