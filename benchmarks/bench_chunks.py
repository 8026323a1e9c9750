"""The default chunk of a quiet run against chunks of 250 draws and the hand-written floor.

A run with ``chunk_size=None`` and nothing watching its chunk boundaries (no progress
bar, checkpoint or ``until``) takes up to 2000 draws per compiled call
(``docs/long-runs.md``); a watched one takes 250. Each row samples numpyro's NUTS on a
short run, as users call it (``batch_size="auto"``), through

- ``default``: ``cr.run(..., progress=False)``, the quiet default chunk;
- ``chunk=250``: the same call with ``chunk_size=250`` (the default of a watched run,
  and of every run before this change);
- ``floor[map]``: the hand-written ``jit(shard_map(lax.map(scan)))``, one call for the
  whole run (the floor of ``batch_size=1``, which ``"auto"`` keeps on these rows).

After each method's first (compiling) call, rounds call every method in a new random
order (after a ``gc.collect()``), each call with a new seed. A row reports the medians,
the median of the per-round ratio ``default / chunk=250`` (paired: the same round's
machine state), and ``default / floor[map]``. Each (interpreter, device count) runs in
its own process (``jax_num_cpu_devices`` is fixed at start). Rows print as JSON lines,
then a markdown table.

Usage::

    python benchmarks/bench_chunks.py --quick
    python benchmarks/bench_chunks.py \
        --pythons .nox/tests-3-11/bin/python,.nox/tests-3-12/bin/python
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

# (model, chains, warmup, draws): the batch-size grid's 8-chain rows, and numpyro's and
# Stan's default run length on 4 chains.
ROWS = (
    ("eight_schools", 8, 200, 200),
    ("gaussian_50d", 8, 200, 200),
    ("eight_schools", 4, 1000, 1000),
    ("gaussian_50d", 4, 1000, 1000),
)
METHODS = ("default", "chunk=250", "floor[map]")


def make_runner(method, problem, chains, warmup, draws, ndev):
    """``seed -> (seconds, chunk_size)`` for one method, with its own kernel and jits."""
    import jax
    from numpyro.infer import NUTS

    import chainrunner as cr

    model, args, kwargs = problem
    if method == "floor[map]":
        from bench_suite import make_method

        fn = make_method("floor[map]", model, args, kwargs, chains, warmup, draws, ndev)

        def floor(seed):
            t0 = time.perf_counter()
            fn(seed)
            return time.perf_counter() - t0, warmup + draws

        return floor
    kernel = cr.from_numpyro(NUTS(model), model_args=args, model_kwargs=kwargs)
    mesh = cr.chain_mesh(min(ndev, chains))
    chunk_size = None if method == "default" else 250

    def run(seed):
        t0 = time.perf_counter()
        trace = cr.run(
            kernel, jax.random.key(seed), None, draws, num_warmup=warmup, num_chains=chains,
            mesh=mesh, chunk_size=chunk_size, progress=False, warn=False,
        )  # fmt: skip
        return time.perf_counter() - t0, trace.attrs["chunk_size"]

    return run


def bench_row(name, chains, warmup, draws, ndev, rounds):
    import jax
    import numpy as np
    from bench_batch_size import make_problem

    problem = make_problem(name)
    runners = {m: make_runner(m, problem, chains, warmup, draws, ndev) for m in METHODS}
    chunk = {m: runners[m](0)[1] for m in METHODS}  # compiles
    times = {m: [] for m in METHODS}
    rng = np.random.default_rng(chains * 100 + ndev)
    for r in range(rounds):
        for m in [METHODS[i] for i in rng.permutation(len(METHODS))]:
            gc.collect()  # untimed: no call pays for another's garbage
            times[m].append(runners[m](r + 1)[0])
    med = {m: float(np.median(v)) for m, v in times.items()}
    paired = np.array(times["default"]) / np.array(times["chunk=250"])
    return {
        "jax": jax.__version__, "model": name, "chains": chains, "devices": ndev,
        "warmup": warmup, "draws": draws, "rounds": rounds, "chunk_size": chunk,
        "median_s": med, "default_vs_250_paired": float(np.median(paired)),
        "default_vs_floor": med["default"] / med["floor[map]"],
        "chunk250_vs_floor": med["chunk=250"] / med["floor[map]"],
    }  # fmt: skip


def worker(opts):
    import jax

    jax.config.update("jax_num_cpu_devices", opts.devices)
    for name, chains, warmup, draws in ROWS:
        if opts.quick and (name, chains) != ("eight_schools", 8):
            continue
        t0 = time.perf_counter()
        row = bench_row(name, chains, warmup, draws, opts.devices, opts.rounds)
        print("#ROW " + json.dumps(row), flush=True)
        print(f"# {name} {chains} chains {opts.devices} devices: {time.perf_counter() - t0:.0f} s",
              file=sys.stderr)  # fmt: skip


def table(rows):
    lines = [
        "| jax | model | chains | steps | dev | chunk (default) | default | chunk=250 "
        "| floor[map] | default / chunk=250 (paired) | default / floor | chunk=250 / floor |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ms = {m: f"{1e3 * v:.1f} ms" for m, v in r["median_s"].items()}
        lines.append(
            f"| {r['jax']} | {r['model']} | {r['chains']} | {r['warmup']} + {r['draws']} "
            f"| {r['devices']} | {r['chunk_size']['default']} | {ms['default']} "
            f"| {ms['chunk=250']} | {ms['floor[map]']} | {r['default_vs_250_paired']:.3f} "
            f"| {r['default_vs_floor']:.3f} | {r['chunk250_vs_floor']:.3f} |"
        )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="eight schools, 8 chains, 2 devices")
    parser.add_argument("--pythons", default=sys.executable, help="interpreters, comma-separated")
    parser.add_argument("--devices", default="2,8")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "chunks.json"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.worker:
        opts.devices = int(opts.devices)
        return worker(opts)
    if opts.quick:
        opts.devices, opts.rounds = "2", 3
        opts.out = os.path.join(HERE, "results", "chunks-quick.json")
    rows = []
    for python in opts.pythons.split(","):
        for ndev in opts.devices.split(","):
            cmd = [python, os.path.abspath(__file__), "--worker", "--devices", ndev,
                   "--rounds", str(opts.rounds), *(["--quick"] if opts.quick else [])]  # fmt: skip
            env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
            out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env, check=True)
            rows += [json.loads(x[5:]) for x in out.stdout.splitlines() if x.startswith("#ROW ")]
    command = ["python", "benchmarks/bench_chunks.py", *sys.argv[1:]]
    with open(opts.out, "w") as f:
        json.dump({"command": command, "results": rows}, f, indent=1)
    print(json.dumps(rows))
    print(table(rows))


if __name__ == "__main__":
    main()
