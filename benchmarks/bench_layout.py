"""The default layout warm and cold, against the hand-written layouts (issue 55).

Rows (blackjax NUTS; 2 CPU devices; ``--rows`` picks some):

- ``es64``: eight schools, 64 chains x 1000 draws, a fixed step size;
- ``es64w``: eight schools, 64 chains, window adaptation 1000 + 1000 draws
  (``cr.from_blackjax(blackjax.nuts, adaptation="window")``);
- ``es512``: eight schools, 512 chains x 200, fixed;
- ``logit64``: a logistic regression 5000 x 20, 64 chains x 100, fixed;
- ``gauss8``: a 50-d correlated Gaussian, 8 chains x 1000, fixed.

**Warm** (one process per interpreter): every method is called once (it compiles), then
``--reps`` rounds call each in a new order; the figure is the median of the whole call,
draws on the host:

- ``default``: ``cr.run`` as users call it (``batch_size="auto"``);
- ``b=1``, ``b=None``: ``cr.run`` with that ``batch_size``;
- ``vmap``: the hand-written ``jit(shard_map(vmap(scan)))`` (for ``es64w``: blackjax's
  ``window_adaptation(...).run`` then the scan, under the vmap);
- ``map``: the hand-written ``jit(shard_map(lax.map(scan)))``, chains one after another.

``warm/best`` is the default's time over the better of ``vmap`` and ``map``;
``sampling/best`` the default's ``attrs["sampling_time"]`` (its loop, without finding
its programs, the diagnostics and the trace) over the same.

**Cold**: the whole first call (``cr.run``, after the imports and the model) in a fresh
process with the program cache off (``CHAINRUNNER_CACHE=off``), for the default,
``batch_size=1`` and ``batch_size=None``, ``--cold-reps`` processes each, rotating;
medians. ``cold/best`` is the default's over the better of ``1`` and ``None``.

Usage::

    python benchmarks/bench_layout.py \
        --pythons .nox/tests-3-11/bin/python,.nox/tests-3-12/bin/python

Prints JSON lines, then a table; ``--out`` writes the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ROWS = {  # model, chains, warmup, draws
    "es64": ("eight_schools", 64, 0, 1000),
    "es64w": ("eight_schools", 64, 1000, 1000),
    "es512": ("eight_schools", 512, 0, 200),
    "logit64": ("logistic", 64, 0, 100),
    "gauss8": ("gaussian_50", 8, 0, 1000),
}
DEVICES = 2
WARM = ("default", "b=1", "b=None", "vmap", "map")
COLD = ("default", "b=1", "b=None")


def model(name: str):
    """``(logdensity, dim, step_size)``: the fixed-step models of ``bench_nuts_fsm.py`` and
    a logistic regression of 5000 rows x 20 correlated predictors."""
    if name != "logistic":
        sys.path.insert(0, HERE)
        from bench_nuts_fsm import model as fsm_model

        return fsm_model(name)
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    mix = np.eye(20) + 0.3 * rng.normal(size=(20, 20))
    x = (rng.normal(size=(5000, 20)) @ mix / 2).astype(np.float32)
    y = (rng.uniform(size=5000) < 1 / (1 + np.exp(-x @ rng.normal(0, 0.5, 20)))).astype(np.float32)
    x, y = jnp.asarray(x), jnp.asarray(y)

    def logdensity(beta):
        z = x @ beta
        return jnp.sum(y * z - jnp.logaddexp(0.0, z)) - 0.5 * jnp.sum(beta**2)

    return logdensity, 20, 0.01


def user_call(row: str, batch_size):
    """``() -> None``: ``cr.run`` of the row as users call it, with ``batch_size``."""
    import blackjax
    import jax
    import jax.numpy as jnp

    import chainrunner as cr

    name, chains, warmup, draws = ROWS[row]
    logdensity, dim, eps = model(name)
    if warmup:
        kernel = cr.from_blackjax(blackjax.nuts, logdensity_fn=logdensity, adaptation="window")
    else:
        kernel = blackjax.nuts(logdensity, eps, jnp.ones(dim))
    x0 = 0.1 * jax.random.normal(jax.random.key(0), (chains, dim))
    mesh = cr.chain_mesh(DEVICES)
    seed = iter(range(1, 10**6))

    def call():
        trace = cr.run(kernel, jax.random.key(next(seed)), x0, draws, num_warmup=warmup,
                       mesh=mesh, batch_size=batch_size, progress=False, warn=False)  # fmt: skip
        return trace

    return call


def hand_written(row: str, how: str):
    """``() -> draws``: the hand-written ``jit(shard_map(vmap(...)))`` or ``lax.map``."""
    import blackjax
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    name, chains, warmup, draws = ROWS[row]
    logdensity, dim, eps = model(name)
    mesh = jax.make_mesh((DEVICES,), ("chain",))

    def one(position, key):
        warm_key, key = jax.random.split(key)
        if warmup:
            adapt = blackjax.window_adaptation(blackjax.nuts, logdensity)
            (state, params), _ = adapt.run(warm_key, position, warmup)
            nuts = blackjax.nuts(logdensity, **params)
        else:
            nuts = blackjax.nuts(logdensity, eps, jnp.ones(dim))
            state = nuts.init(position)

        def body(s, k):
            s, info = nuts.step(k, s)
            return s, (s.position, info.num_integration_steps)

        return jax.lax.scan(body, state, jax.random.split(key, draws))[1]

    def per_device(positions, keys):
        if how == "vmap":
            return jax.vmap(one)(positions, keys)
        return jax.lax.map(lambda a: one(*a), (positions, keys))

    program = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P("chain"),
                                    out_specs=P("chain"), check_vma=False))  # fmt: skip
    put = NamedSharding(mesh, P("chain"))
    x0 = jax.device_put(0.1 * jax.random.normal(jax.random.key(0), (chains, dim)), put)
    seed = iter(range(1, 10**6))

    def call():
        keys = jax.device_put(jax.random.split(jax.random.key(next(seed)), chains), put)
        return jax.tree.map(np.asarray, program(x0, keys))

    return call


def warm_row(row: str, reps: int) -> dict:
    """The warm times of every method on ``row`` (medians of interleaved rounds)."""
    calls = {
        "default": user_call(row, "auto"),
        "b=1": user_call(row, 1),
        "b=None": user_call(row, None),
        "vmap": hand_written(row, "vmap"),
        "map": hand_written(row, "map"),
    }
    chosen = calls["default"]().attrs["batch_size_choice"]  # compiles
    for how in WARM[1:]:
        calls[how]()
    times = {how: [] for how in WARM}
    sampling = {how: [] for how in WARM[:3]}
    rng = np.random.default_rng(0)
    for _ in range(reps):
        for how in rng.permutation(WARM):
            t0 = time.perf_counter()
            out = calls[how]()
            times[how].append(time.perf_counter() - t0)
            if how in sampling:
                sampling[how].append(out.attrs["sampling_time"])
    med = {how: float(np.median(t)) for how, t in times.items()}
    sampled = {how: float(np.median(t)) for how, t in sampling.items()}
    best = min(med["vmap"], med["map"])
    import jax

    return {"row": row, "jax": jax.__version__, "warm_s": med, "sampling_s": sampled,
            "chosen": chosen, "warm_vs_best": med["default"] / best,
            "sampling_vs_best": sampled["default"] / best}  # fmt: skip


def cold_child(row: str, how: str) -> None:
    """One fresh process's first call: prints its seconds and the choice as JSON."""
    call = user_call(row, {"default": "auto", "b=1": 1, "b=None": None}[how])
    t0 = time.perf_counter()
    trace = call()
    seconds = time.perf_counter() - t0
    print(json.dumps({"s": seconds, "batch_size": str(trace.attrs["batch_size"])}))


def cold_row(python: str, row: str, reps: int) -> dict:
    env = {**os.environ, "CHAINRUNNER_CACHE": "off", "JAX_PLATFORMS": "cpu"}
    times = {how: [] for how in COLD}
    for r in range(reps):
        for how in COLD[r % 3 :] + COLD[: r % 3]:
            out = subprocess.run(
                [python, __file__, "--cold-child", row, how],
                env=env, capture_output=True, text=True, check=True, cwd=ROOT,
            )  # fmt: skip
            times[how].append(json.loads(out.stdout.strip().splitlines()[-1])["s"])
    med = {how: float(np.median(t)) for how, t in times.items()}
    return {"cold_s": med, "cold_vs_best": med["default"] / min(med["b=1"], med["b=None"])}


def stack(python: str, rows: list[str], reps: int, cold_reps: int) -> list[dict]:
    out = subprocess.run(
        [python, __file__, "--warm-child", ",".join(rows), "--reps", str(reps)],
        env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True,
        check=True, cwd=ROOT,
    )  # fmt: skip
    results = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    for result in results:
        if cold_reps:
            result.update(cold_row(python, result["row"], cold_reps))
        print(json.dumps(result), flush=True)
    return results


def table(results: list[dict]) -> str:
    head = "| jax | row | default | warm/best | sampling/best | cold/best | warm s: default / 1 "
    head += "/ None / vmap / map | cold s: default / 1 / None |"
    lines = [head, "|---|---|---|---:|---:|---:|---|---|"]
    for r in results:
        w, c = r["warm_s"], r.get("cold_s", {})
        cold = " / ".join(f"{c[h]:.2f}" for h in COLD) if c else "-"
        ratio = f"{r['cold_vs_best']:.2f}" if c else "-"
        lines.append(
            f"| {r['jax']} | {r['row']} | {r['chosen'].split(' (')[0]} | "
            f"{r['warm_vs_best']:.2f} | {r['sampling_vs_best']:.2f} | {ratio} | "
            f"{' / '.join(f'{w[h]:.2f}' for h in WARM)} | {cold} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pythons", default=sys.executable)
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--cold-reps", type=int, default=2)
    parser.add_argument("--out")
    parser.add_argument("--warm-child")
    parser.add_argument("--cold-child", nargs=2)
    args = parser.parse_args()
    if args.cold_child or args.warm_child:
        import jax

        jax.config.update("jax_num_cpu_devices", DEVICES)
        if args.cold_child:
            return cold_child(*args.cold_child)
        for row in args.warm_child.split(","):
            print(json.dumps(warm_row(row, args.reps)), flush=True)
        return None
    results = []
    for python in args.pythons.split(","):
        results += stack(python, args.rows.split(","), args.reps, args.cold_reps)
    print(table(results))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": results}, f, indent=1)
    return None


if __name__ == "__main__":
    main()
