"""blackjax's per-chain adaptations as steps (issue 58) against blackjax's own call.

``adaptation="mclmc"`` and ``"adjusted_mclmc"`` run blackjax's tuners as a step function
(``_warmup_mclmc``, ``_warmup_adjusted_mclmc``) so that ``run`` can drive them in chunks;
``"window_low_rank"``, ``"staged"`` and ``"pathfinder"`` (with NUTS) run blackjax's own
``run`` cut around its scan (``programs/_split``; pathfinder only with ``--only``).
This script measures what the step form costs against blackjax's own call
(``mclmc_find_L_and_step_size``, ..., ``AdaptationAlgorithm.run``): both
``jit(vmap(...))`` over 64 chains of a 20-d correlated Gaussian, on one device, the
tuning of ``num_warmup=1000`` (blackjax's ``num_steps`` as chainrunner passes it):

- **compile**: lowering and compiling each program, seconds;
- **run**: one call of the compiled program, the median of ``--reps`` (default 5; the results: 15),
  the two forms interleaved in one process.

The step form runs as ``run``'s chunk program does, a loop of a run-time number of steps
(here all of them in one call; ``benchmarks/bench_warmup_chunks.py`` measures chunks
against one).

Usage: ``python benchmarks/bench_tuner_steps.py [--quick] [--reps N] [--write]``.
Prints JSON, then a markdown table; ``--write`` saves
``benchmarks/results/tuner_steps-jax<major.minor>.json``.
"""

import argparse
import json
import os
import time


def programs(adaptation: str, num_warmup: int) -> dict:
    """``{"blackjax": (fn, ()), "steps": (fn, (count,))}``: each ``fn(keys, positions,
    *extra) -> parameters``."""
    import blackjax
    import jax
    import jax.numpy as jnp
    import numpy as np
    from blackjax.mcmc import adjusted_mclmc_dynamic as amd
    from blackjax.mcmc import mclmc

    from chainrunner.adapters._blackjax import _warmup_adjusted_mclmc, _warmup_mclmc
    from chainrunner.adapters._blackjax._warmup_tuned import tuning_steps

    d = 20
    a = np.random.default_rng(0).normal(size=(d, d)) / np.sqrt(d) + np.eye(d)
    a = jnp.asarray(a, jnp.float32)

    def logdensity(x):
        return -0.5 * jnp.sum((a @ x) ** 2)

    if adaptation in ONE_CALL:
        return one_call(adaptation, logdensity, num_warmup)
    if adaptation == "mclmc":
        kernel, init = mclmc.build_kernel(integrator=mclmc.isokinetic_mclachlan), mclmc.init
        num_steps = tuning_steps(num_warmup, (0.1, 0.1, 0.1))
        steps = _warmup_mclmc.mclmc_steps(kernel, logdensity, init, {})

        def own(state, key):
            return blackjax.mclmc_find_L_and_step_size(
                kernel, num_steps, state, key, logdensity_fn=logdensity
            )[1]
    else:
        kernel = amd.build_kernel(integration_steps_fn=amd.make_random_trajectory_length_fn(True))
        init = amd.init
        num_steps = tuning_steps(num_warmup, (0.1, 0.1, 0.0))
        steps = _warmup_adjusted_mclmc.adjusted_steps(kernel, logdensity, init, {"target": 0.9})

        def own(state, key):
            return blackjax.adjusted_mclmc_find_L_and_step_size(
                kernel, logdensity, num_steps, state, key, target=0.9
            )[1]

    def blackjax_call(key, position):
        init_key, tune_key = jax.random.split(key)
        return own(init(position, logdensity, init_key), tune_key)

    def step_form(key, position, count):  # as run's chunk program: a run-time count
        chain = steps(key, position, num_steps)

        def step(i, carry):
            return chain.step(carry, (i, jax.lax.dynamic_index_in_dim(chain.keys, i, 0, False)))[0]

        return chain.finish(jax.lax.fori_loop(0, count, step, chain.carry), count)[1]

    total = jax.eval_shape(lambda: steps(jax.random.key(0), jnp.zeros(d), num_steps).keys)
    return {
        "blackjax": (jax.jit(jax.vmap(blackjax_call)), ()),
        "steps": (jax.jit(jax.vmap(step_form, in_axes=(0, 0, None))), (total.shape[0],)),
    }


ONE_CALL = ("window_low_rank", "staged", "pathfinder")


def one_call(adaptation: str, logdensity, num_warmup: int) -> dict:
    """``programs`` of blackjax's adaptation ``adaptation`` with NUTS: its ``run``, and
    the same cut around its scan (``_split``) as ``run``'s chunk program runs it."""
    import blackjax
    import jax
    import jax.numpy as jnp

    from chainrunner.programs._split import split_scan

    algorithm = getattr(blackjax, {"window_low_rank": "window_adaptation_low_rank",
                                   "staged": "staged_adaptation",
                                   "pathfinder": "pathfinder_adaptation"}[adaptation])  # fmt: skip
    own = algorithm(blackjax.nuts, logdensity)

    def blackjax_call(key, position):
        return own.run(key, position, num_warmup)[0].parameters["step_size"]

    cut = split_scan(blackjax_call, num_warmup, jax.random.key(0), jnp.zeros(20))

    def step_form(key, position, count):
        carry = jax.lax.fori_loop(0, count, lambda i, c: cut.step(c, i), cut.start(key, position))
        return cut.finish(carry, count)

    return {
        "blackjax": (jax.jit(jax.vmap(blackjax_call)), ()),
        "steps": (jax.jit(jax.vmap(step_form, in_axes=(0, 0, None))), (num_warmup,)),
    }


def measure(adaptation: str, reps: int, num_warmup: int) -> dict:
    import jax
    import numpy as np

    keys = jax.random.split(jax.random.key(0), 64)
    x0 = jax.random.normal(jax.random.key(1), (64, 20))
    compiled, compile_s, extra = {}, {}, {}
    jax.jit(lambda x: x + 1).lower(x0).compile()  # XLA's own first-use costs, paid by neither
    for name, (fn, args) in reversed(programs(adaptation, num_warmup).items()):  # steps first
        extra[name] = tuple(jax.numpy.int32(a) for a in args)
        t0 = time.perf_counter()
        compiled[name] = fn.lower(keys, x0, *extra[name]).compile()
        compile_s[name] = time.perf_counter() - t0
    run_s: dict = {name: [] for name in compiled}
    for _ in range(reps):  # interleaved
        for name, fn in compiled.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn(keys, x0, *extra[name]))
            run_s[name].append(time.perf_counter() - t0)
    med = {name: float(np.median(v)) for name, v in run_s.items()}
    return {
        "jax": jax.__version__, "adaptation": adaptation, "num_warmup": num_warmup,
        "chains": 64, "reps": reps, "compile_s": compile_s, "run_s": med,
        "compile_ratio": compile_s["steps"] / compile_s["blackjax"],
        "run_ratio": med["steps"] / med["blackjax"], "runs": run_s,
    }  # fmt: skip


def table(rows: list[dict]) -> str:
    head = (
        "| jax | adaptation | compile, steps / blackjax (s) | ratio "
        "| run, steps / blackjax (s) | ratio |\n|---|---|---|---:|---|---:|"
    )
    lines = [
        f"| {r['jax']} | {r['adaptation']} "
        f"| {r['compile_s']['steps']:.2f} / {r['compile_s']['blackjax']:.2f} "
        f"| {r['compile_ratio']:.2f} "
        f"| {r['run_s']['steps']:.2f} / {r['run_s']['blackjax']:.2f} | {r['run_ratio']:.2f} |"
        for r in rows
    ]
    return "\n".join([head, *lines])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 rep of 200 steps")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--only", nargs="*", help="these adaptations (default: all)")
    args = parser.parse_args()
    reps, num_warmup = (1, 200) if args.quick else (args.reps, 1000)
    # (pathfinder by name only: blackjax's own pathfinder warmup of this model leaves NUTS
    # at its longest trajectories, minutes a call on a CPU)
    names = args.only or ("mclmc", "adjusted_mclmc", "window_low_rank", "staged")
    rows = [measure(a, reps, num_warmup) for a in names]
    print(json.dumps(rows, indent=1))
    print(table(rows))
    if args.write and not args.quick:
        import jax

        version = ".".join(jax.__version__.split(".")[:2])
        path = os.path.join(os.path.dirname(__file__), "results", f"tuner_steps-jax{version}.json")
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
