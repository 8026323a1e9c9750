"""cr.run against the hand-written loops it replaces, with a blackjax kernel.

blackjax NUTS with a fixed step size on a 50-d correlated Gaussian, 8 chains on 2
simulated CPU devices, 1000 draws. Two floors: ``jit(shard_map(vmap(scan)))`` for
``batch_size=None`` and ``jit(shard_map(lax.map(scan)))`` for ``batch_size=1`` (the
default on CPU). Everything is compiled first; then repetitions are interleaved in one
process and each chainrunner variant's median is divided by its floor's (compile
excluded). All include moving the draws to host memory; the default run also computes
its end-of-run diagnostics (ArviZ R-hat and ESS).

Run: python benchmarks/bench_runner.py [--quick] [--reps N]
"""

import jax

jax.config.update("jax_num_cpu_devices", 2)

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402

import blackjax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import chainrunner as cr  # noqa: E402


def correlated_gaussian(dim, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(dim, dim))
    cov = a @ a.T / dim + np.eye(dim)
    precision = jnp.asarray(np.linalg.inv(cov), jnp.float32)
    return lambda x: -0.5 * x @ precision @ x


def hand_written(nuts, mesh, num_samples, vmapped=True):
    """The floor: what a JAX engineer writes by hand for the same layout and keys.

    The loop is the blackjax multiple-chains recipe's (it keeps every state); the
    keys are folded per step as chainrunner does. ``vmapped``: one ``vmap`` over a
    device's chains (the floor of ``batch_size=None``), else ``lax.map`` over them
    (the floor of ``batch_size=1``, the default on CPU).
    """

    def one_chain(state, key):
        def body(s, t):
            s, _ = nuts.step(jax.random.fold_in(key, t), s)
            return s, s

        return jax.lax.scan(body, state, jnp.arange(num_samples))

    local = jax.vmap(one_chain) if vmapped else (lambda *a: jax.lax.map(lambda x: one_chain(*x), a))
    return jax.jit(
        jax.shard_map(
            local,
            mesh=mesh,
            in_specs=(P("chain"), P("chain")),
            out_specs=P("chain"),
            check_vma=False,
        )
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    dim, chains, draws, reps = (50, 8, 1000, args.reps) if not args.quick else (10, 8, 100, 2)

    mesh = cr.chain_mesh(2)
    nuts = blackjax.nuts(correlated_gaussian(dim), 0.25, jnp.ones(dim))
    x0 = jax.random.normal(jax.random.key(0), (chains, dim))
    sharding = NamedSharding(mesh, P("chain"))
    states = jax.device_put(jax.vmap(nuts.init)(x0), sharding)
    keys = jax.device_put(jax.random.split(jax.random.key(1), chains), sharding)
    floors = {
        "hand_written[vmap]": hand_written(nuts, mesh, draws, vmapped=True),
        "hand_written[map]": hand_written(nuts, mesh, draws, vmapped=False),
    }

    def floor_runner(program):
        def run_floor():
            _, kept = program(states, keys)
            return jax.device_get(kept)

        return run_floor

    def chainrunner_runner(batch_size, warn=False):
        def run_chainrunner():
            return cr.run(nuts, jax.random.key(1), x0, draws, mesh=mesh, batch_size=batch_size,
                          progress=False, warn=warn).draws  # fmt: skip

        return run_chainrunner

    methods = {
        "hand_written[vmap]": floor_runner(floors["hand_written[vmap]"]),
        "chainrunner[vmap]": chainrunner_runner(None),
        "hand_written[map]": floor_runner(floors["hand_written[map]"]),
        "chainrunner[batch=1]": chainrunner_runner(1),
        "chainrunner (default, with diagnostics)": chainrunner_runner("auto", warn=True),
    }
    floor_of = {
        "chainrunner[vmap]": "hand_written[vmap]",
        "chainrunner[batch=1]": "hand_written[map]",
        "chainrunner (default, with diagnostics)": "hand_written[map]",
    }
    first = {}
    for name, fn in methods.items():  # compile (and import ArviZ) before timing
        t0 = time.perf_counter()
        fn()
        first[name] = time.perf_counter() - t0
    times = {name: [] for name in methods}
    for _ in range(reps):  # interleaved
        for name, fn in methods.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    med = {k: float(np.median(v)) for k, v in times.items()}
    ratio = {k: med[k] / med[floor_of.get(k, k)] for k in methods}
    result = {
        "benchmark": "run_vs_hand_written",
        "model": f"{dim}-d correlated Gaussian, blackjax NUTS step 0.25",
        "chains": chains,
        "devices": 2,
        "draws": draws,
        "reps": reps,
        "median_s": med,
        "ratio_to_its_floor": ratio,
        "first_call_s": first,
        "jax": jax.__version__,
        "machine": f"{platform.machine()} {platform.processor() or ''} CPU, simulated devices",
    }
    print(json.dumps(result, indent=2))
    print()
    print("| method | first call s | median s (compile excluded) | vs its hand-written floor |")
    print("|---|---|---|---|")
    for k in methods:
        print(f"| {k} | {first[k]:.2f} | {med[k]:.3f} | {ratio[k]:.3f} |")


if __name__ == "__main__":
    main()
