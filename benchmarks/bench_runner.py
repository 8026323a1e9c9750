"""cr.run against the hand-written jit(shard_map(vmap(scan))) floor.

blackjax NUTS with a fixed step size on a 50-d correlated Gaussian, 8 chains on 2
simulated CPU devices, 1000 draws. Both are compiled first; then repetitions are
interleaved in one process and the ratio of median times is reported (compile
excluded). Both include moving the draws to host memory.

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


def hand_written(nuts, mesh, num_samples):
    """The floor: what a JAX engineer writes by hand for the same layout and keys.

    The loop is the blackjax multiple-chains recipe's (it keeps every state); the
    keys are folded per step as chainrunner does.
    """

    def one_chain(state, key):
        def body(s, t):
            s, _ = nuts.step(jax.random.fold_in(key, t), s)
            return s, s

        return jax.lax.scan(body, state, jnp.arange(num_samples))

    return jax.jit(
        jax.shard_map(
            jax.vmap(one_chain),
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
    floor = hand_written(nuts, mesh, draws)

    def run_floor():
        _, kept = floor(states, keys)
        return jax.device_get(kept)

    def run_chainrunner():
        return cr.run(nuts, jax.random.key(1), x0, draws, mesh=mesh, progress=False,
                      warn=False).draws  # fmt: skip

    def run_chainrunner_diagnosed():
        # The default: the run's diagnostics (ArviZ R-hat, ESS, ...) computed at the end.
        return cr.run(nuts, jax.random.key(1), x0, draws, mesh=mesh, progress=False).draws

    t0 = time.perf_counter()
    run_floor()
    floor_compile = time.perf_counter() - t0
    t0 = time.perf_counter()
    trace = cr.run(nuts, jax.random.key(1), x0, draws, mesh=mesh, progress=False)
    cr_first = time.perf_counter() - t0

    methods = {
        "hand_written": run_floor,
        "chainrunner": run_chainrunner,
        "chainrunner_with_diagnostics": run_chainrunner_diagnosed,
    }
    run_chainrunner_diagnosed()  # imports ArviZ before timing
    times = {name: [] for name in methods}
    for _ in range(reps):  # interleaved
        for name, fn in methods.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    med = {k: float(np.median(v)) for k, v in times.items()}
    result = {
        "benchmark": "run_vs_hand_written",
        "model": f"{dim}-d correlated Gaussian, blackjax NUTS step 0.25",
        "chains": chains,
        "devices": 2,
        "draws": draws,
        "reps": reps,
        "median_s": med,
        "ratio_chainrunner_over_hand_written": med["chainrunner"] / med["hand_written"],
        "ratio_with_diagnostics": med["chainrunner_with_diagnostics"] / med["hand_written"],
        "first_call_s": {"hand_written": floor_compile, "chainrunner": cr_first},
        "chainrunner_compile_s": trace.attrs["compile_time"],
        "jax": jax.__version__,
        "machine": f"{platform.machine()} {platform.processor() or ''} CPU, simulated devices",
    }
    print(json.dumps(result, indent=2))
    print()
    print("| method | median s (compile excluded) | ratio |")
    print("|---|---|---|")
    for k in methods:
        print(f"| {k} | {med[k]:.3f} | {med[k] / med['hand_written']:.3f} |")


if __name__ == "__main__":
    main()
