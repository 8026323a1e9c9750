"""``batch_size="auto"`` against every fixed choice and the hand-written floors, per row.

On a grid of models x chains x simulated CPU devices (x JAX versions, one interpreter
each), every row runs numpyro's NUTS with its adaptation through

- ``default``: ``cr.run`` as a user calls it (``batch_size="auto"``);
- ``b=1``, ``b=8``, ``b=all``: ``cr.run`` with that ``batch_size`` (``b=8`` only where a
  device holds more than 8 chains; ``b=all`` is ``batch_size=None``, with one chain per
  device a vmap of one);
- ``floor[vmap]``: the hand-written ``jit(shard_map(vmap(scan)))``;
- ``floor[map]``: the hand-written ``jit(shard_map(lax.map(scan)))``, chains one after
  another.

First each method runs once cold (its programs compiled in the call: every method
builds its own kernel and jitted functions, so nothing is shared). One cold call
varies by about 10 %, as much as the end-to-end target, so the default and the fixed
choices within 1.25x of the fastest cold one run cold again, with new kernels
(``--cold-reps`` calls in all, rotating): the median is their **end to end** time.
Then warm rounds (``--reps`` at least, more while a row's rounds fit
10 s, at most 20) call every method in a new random order each round (after a
``gc.collect()``), each call with a new seed; the median is its **warm** time (the
whole call, draws on the host). A row reports

- ``warm/best``: the default's warm time over the best fixed ``batch_size``'s;
- ``e2e/best``: the default's end to end time over the best fixed one's;
- ``warm/floor``: the default's warm time over the better of the two floors;
- the choice ``auto`` made, and why.

Each (interpreter, device count) runs in its own process (``jax_num_cpu_devices`` is
fixed at start). Rows print as JSON lines, then a markdown table.

Usage::

    python benchmarks/bench_batch_size.py --quick
    python benchmarks/bench_batch_size.py \
        --pythons .nox/tests-3-11/bin/python,.nox/tests-3-12/bin/python
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import os
import subprocess
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

MODELS = ("eight_schools", "gaussian_50d", "logistic_5000x20", "matmul")
# (warmup, draws) per chain count: sized so that the grid fits 2 CPU cores.
SIZES = {8: (200, 200), 64: (100, 100), 512: (30, 30), 4096: (5, 5)}
# --long: (warmup, draws) per model, runs long enough that a vmap's compile can pay
# (20-40 s with batch_size=1 at 64 chains on 2 devices of a 2-core machine)
LONG_SIZES = {
    "eight_schools": (10000, 10000), "gaussian_50d": (5000, 5000),
    "logistic_5000x20": (1000, 1000), "matmul": (2000, 2000),
}  # fmt: skip
# Issue 32's targets: end to end within 1.10 of the best fixed batch_size on every row;
# warm within 1.10 where the best warm choice's compile is under 10 % of its end to end.
TARGET_WARM, TARGET_E2E, TARGET_FLOOR = 1.10, 1.10, 1.05
LONG_COMPILE_SHARE = 0.10
COLD_NEAR = 1.25  # --cold-reps: fixed choices within this of the fastest cold are timed again
ROW_COUNTER = itertools.count()


def make_problem(name):
    """The suite's models, and ``matmul``: a step that is a matrix product."""
    import numpy as np

    if name != "matmul":
        from bench_suite import make_problem as suite_problem

        return suite_problem(name)
    import numpyro
    import numpyro.distributions as dist

    rng = np.random.default_rng(0)
    X = rng.normal(size=(256, 32)).astype(np.float32)
    W = rng.normal(size=(32, 8)).astype(np.float32) * 0.3
    Y = (X @ W + rng.normal(size=(256, 8))).astype(np.float32)

    def matmul(X, Y):  # multivariate regression: the likelihood is X @ W, (256x32)(32x8)
        W = numpyro.sample("W", dist.Normal(0.0, 1.0).expand([X.shape[1], Y.shape[1]]).to_event(2))
        numpyro.sample("Y", dist.Normal(X @ W, 1.0).to_event(2), obs=Y)

    return matmul, (X, Y), {}


def methods_for(chains, ndev, floors=True):
    per = -(-chains // ndev)
    out = ["default", "b=1"]
    if per > 8:
        out.append("b=8")
    out.append("b=all")  # with one chain per device: a vmap of one (b=1 is not vmapped)
    return [*out, "floor[vmap]", "floor[map]"] if floors else out


def make_runner(method, model, args, kwargs, chains, warmup, draws, ndev):
    """``seed -> (seconds, info)`` for one method."""
    import jax
    from numpyro.infer import NUTS

    import chainrunner as cr

    if method.startswith("floor"):
        from bench_suite import make_method

        name = "floor" if method == "floor[vmap]" else "floor[map]"
        fn = make_method(name, model, args, kwargs, chains, warmup, draws, ndev)

        def run(seed):
            t0 = time.perf_counter()
            fn(seed)
            return time.perf_counter() - t0, {}

        return run
    b = {"default": "auto", "b=1": 1, "b=8": 8, "b=all": None}[method]
    kernel = cr.from_numpyro(NUTS(model), model_args=args, model_kwargs=kwargs)
    mesh = cr.chain_mesh(ndev)

    def run(seed):
        t0 = time.perf_counter()
        trace = cr.run(
            kernel, jax.random.key(seed), None, draws, num_warmup=warmup, num_chains=chains,
            mesh=mesh, batch_size=b, progress=False, warn=False,
        )  # fmt: skip
        wall = time.perf_counter() - t0
        a = trace.attrs
        return wall, {"batch_size": a["batch_size"], "choice": a["batch_size_choice"],
                      "compile_s": a["compile_time"]}  # fmt: skip

    return run


def bench_row(
    model_name,
    chains,
    ndev,
    reps,
    scale=1,
    floors=True,
    only=None,
    budget=10.0,
    max_reps=20,
    cold_reps=1,
    long=False,
):
    import numpy as np

    model, args, kwargs = make_problem(model_name)
    sizes = LONG_SIZES[model_name] if long else SIZES[chains]
    warmup, draws = (round(scale * n) for n in sizes)
    methods = [m for m in methods_for(chains, ndev, floors) if only is None or m in only]

    def fresh(m):  # its own kernel and jits: its first call compiles
        return make_runner(m, model, args, kwargs, chains, warmup, draws, ndev)

    runners = {m: fresh(m) for m in methods}
    info = {}
    # An untimed run of the row's model and chains first: JAX compiles each eager
    # operation once per shape, and no method should pay that for the others.
    make_runner("b=1", model, args, kwargs, chains, 1, 1, ndev)(0)
    # Each method has its own kernel and jits: its first call compiles. The order
    # rotates from row to row, so that no method is always first.
    turn = next(ROW_COUNTER) % len(methods)
    first = {}
    for m in methods[turn:] + methods[:turn]:
        first[m], info[m] = runners[m](0)
    cold, cold_all = cold_times(first, cold_reps, lambda m, seed: fresh(m)(seed)[0])
    warm = {m: [] for m in methods}
    # A new order each round: a fixed rotation puts each method after the same other
    # one every round, and what a call leaves running biases the next (a few ms here).
    rng = np.random.default_rng(len(methods) * chains + ndev)
    r = 0
    while r < reps:
        for m in [methods[i] for i in rng.permutation(len(methods))]:
            gc.collect()  # untimed, as timeit: no call pays for another's garbage
            warm[m].append(runners[m](r + 1)[0])
        if r == 0:  # as many rounds as the budget allows, at least --reps
            spent = sum(v[0] for v in warm.values())
            reps = max(reps, min(max_reps, int(budget / spent)))
        r += 1
    med = {m: float(np.median(v)) for m, v in warm.items()}
    fixed = [m for m in methods if m.startswith("b=")]
    best_warm = min(fixed, key=med.get)
    best_e2e = min(fixed, key=cold.get)
    floor = min(med.get("floor[vmap]", math.nan), med.get("floor[map]", math.nan))
    return {
        "model": model_name, "chains": chains, "devices": ndev, "scale": scale, "warmup": warmup,
        "draws": draws, "reps": len(warm["default"]), "cold_reps": cold_reps, "warm_s": med,
        "e2e_s": cold, "e2e_calls_s": cold_all,
        "choice": info["default"].get("choice"), "chosen": info["default"].get("batch_size"),
        "long": long,
        "best_warm": best_warm, "best_e2e": best_e2e,
        "warm_vs_best": med["default"] / med[best_warm],
        "e2e_vs_best": cold["default"] / cold[best_e2e],
        "warm_vs_floor": med["default"] / floor,
        "b1_warm_vs_floor": med["b=1"] / floor,
    }  # fmt: skip


def cold_times(first, reps, call, near=COLD_NEAR):
    """End to end seconds per method: ``first`` (one cold call each), and where ``reps``
    is over 1, the median of ``reps`` cold calls for ``default`` and the fixed choices
    within ``near`` of the fastest fixed one (those that can be the row's best end to end;
    one cold call varies by about 10 %), in rotating order, and every call's seconds.
    ``call(method, seed)`` times a cold call of a new runner."""
    import numpy as np

    fixed = [m for m in first if m.startswith("b=")]
    best = min(first[m] for m in fixed) if fixed else math.inf
    again = [m for m in first if m == "default" or (m in fixed and first[m] <= near * best)]
    times = {m: [t] for m, t in first.items()}
    for r in range(1, reps):
        for m in again[r % len(again) :] + again[: r % len(again)]:
            times[m].append(call(m, 100 + r))
    return {m: float(np.median(v)) for m, v in times.items()}, times


def worker(opts):
    import jax

    jax.config.update("jax_num_cpu_devices", opts.devices)
    os.environ.setdefault("TQDM_DISABLE", "1")
    warnings.simplefilter("ignore")
    jax.block_until_ready(jax.random.split(jax.random.key(0), 4))
    for model_name in opts.models.split(","):
        for chains in map(int, opts.chains.split(",")):
            t0 = time.perf_counter()
            only = opts.methods.split(",") if opts.methods else None
            row = bench_row(
                model_name,
                chains,
                opts.devices,
                opts.reps,
                opts.scale,
                opts.floors,
                only,
                cold_reps=opts.cold_reps,
                long=opts.long,
            )
            row["jax"] = jax.__version__
            print("#ROW " + json.dumps(row), flush=True)
            print(f"# {model_name} {chains} chains {opts.devices} devices jax {jax.__version__}:"
                  f" {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)  # fmt: skip


def warm_applies(r):
    """Whether the warm target applies: the best warm choice's compile (its end to end
    less its warm time) is under ``LONG_COMPILE_SHARE`` of its end to end time."""
    m = r["best_warm"]
    return (r["e2e_s"][m] - r["warm_s"][m]) < LONG_COMPILE_SHARE * r["e2e_s"][m]


def _api(method):
    """A method as the API writes its ``batch_size`` (``b=all`` is ``None``)."""
    return "None" if method == "b=all" else method


def table(rows):
    lines = [
        "| jax | model | chains | dev | auto chose | warm/best | e2e/best | warm/floor "
        "| b=1 warm/floor | best warm | best e2e | warm target applies |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---|---|---|",
    ]
    for r in rows:
        flag = lambda x, t: "-" if math.isnan(x) else f"{x:.2f}" + ("" if x <= t else " ✗")  # noqa: E731
        warm_target = TARGET_WARM if warm_applies(r) else math.inf
        steps = f" ({r['warmup']}+{r['draws']})" if r.get("long") else ""
        lines.append(
            f"| {r['jax']} | {r['model']}{steps} | {r['chains']} | {r['devices']} | {r['chosen']} "
            f"| {flag(r['warm_vs_best'], warm_target)} | {flag(r['e2e_vs_best'], TARGET_E2E)} "
            f"| {flag(r['warm_vs_floor'], TARGET_FLOOR)} | {flag(r['b1_warm_vs_floor'], math.inf)} "
            f"| {_api(r['best_warm'])} | {_api(r['best_e2e'])} "
            f"| {'yes' if warm_applies(r) else 'no'} |"
        )
    return "\n".join(lines)


def summary(rows):
    """How many rows meet each target."""
    n = len(rows)
    ok = lambda key, t, rs=rows: sum(r[key] <= t for r in rs)  # noqa: E731
    applies = [r for r in rows if warm_applies(r)]
    return (
        f"All {n} rows: default within {TARGET_E2E} of the best fixed `batch_size` end to end "
        f"on {ok('e2e_vs_best', TARGET_E2E)}. On the {len(applies)} rows where the best warm "
        f"choice's compile is under {LONG_COMPILE_SHARE:.0%} of its end to end time, within "
        f"{TARGET_WARM} of the best warm on {ok('warm_vs_best', TARGET_WARM, applies)}. "
        f"Within {TARGET_FLOOR} of the better floor on {ok('warm_vs_floor', TARGET_FLOOR)}."
    )


def write_docs(rows, command):
    """Puts the table between the grid markers of docs/batch-size.md."""
    path = os.path.join(ROOT, "docs", "batch-size.md")
    start, end = "<!-- batch-size-grid:start -->", "<!-- batch-size-grid:end -->"
    with open(path) as f:
        page = f.read()
    head, rest = page.split(start, 1)
    tail = rest.split(end, 1)[1]
    block = f"{start}\n```bash\n{command}\n```\n\n{table(rows)}\n\n{summary(rows)}\n{end}"
    with open(path, "w") as f:
        f.write(head + block + tail)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="eight schools, 64 chains, 2 devices")
    parser.add_argument("--pythons", default=sys.executable, help="interpreters, comma-separated")
    parser.add_argument("--devices", default="2,8")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--chains", default=",".join(map(str, SIZES)))
    parser.add_argument("--reps", type=int, default=3, help="warm rounds, at least")
    parser.add_argument(
        "--cold-reps", type=int, default=3, help="cold calls: default, near-best fixed ones"
    )
    parser.add_argument("--scale", type=float, default=1.0, help="x the warmup and draws")
    parser.add_argument("--methods", default=None, help="only these (default,b=1,...)")
    parser.add_argument("--long", action="store_true",
                        help="the long rows (LONG_SIZES per model) instead of SIZES")  # fmt: skip
    parser.add_argument("--no-floors", dest="floors", action="store_false",
                        help="fixed batch sizes only (long runs)")  # fmt: skip
    parser.add_argument("--out", default=os.path.join(HERE, "results", "batch_size.json"))
    parser.add_argument("--from-json", default=None, help="only print the table")
    parser.add_argument("--write-docs", action="store_true", help="update docs/batch-size.md")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.worker:
        opts.devices = int(opts.devices)
        return worker(opts)
    if opts.from_json:
        with open(opts.from_json) as f:
            saved = json.load(f)
        rows, command = saved["results"], " ".join(saved["command"])
        print(table(rows) + "\n\n" + summary(rows))
        if opts.write_docs:
            write_docs(rows, command)
        return
    if opts.quick:
        opts.devices, opts.models, opts.chains, opts.reps = "2", "eight_schools", "64", 1
        opts.cold_reps = 1
        opts.out = os.path.join(HERE, "results", "batch_size-quick.json")
    rows = []
    for python in opts.pythons.split(","):
        for ndev in opts.devices.split(","):
            cmd = [python, os.path.abspath(__file__), "--worker", "--devices", ndev, "--models",
                   opts.models, "--chains", opts.chains, "--reps", str(opts.reps),
                   "--scale", str(opts.scale), "--cold-reps", str(opts.cold_reps)]  # fmt: skip
            cmd += [] if opts.floors else ["--no-floors"]
            cmd += ["--long"] if opts.long else []
            cmd += ["--methods", opts.methods] if opts.methods else []
            env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
            for line in proc.stdout:
                if line.startswith("#ROW "):
                    rows.append(json.loads(line[5:]))
                    with open(opts.out, "w") as f:
                        json.dump(
                            {
                                "command": [
                                    "python",
                                    "benchmarks/bench_batch_size.py",
                                    *sys.argv[1:],
                                ],
                                "results": rows,
                            },
                            f,
                            indent=1,
                        )
            if proc.wait():
                print(f"# worker {python} {ndev} devices failed", file=sys.stderr)
    print(json.dumps(rows))
    print(table(rows) + "\n\n" + summary(rows))
    if opts.write_docs:
        write_docs(rows, " ".join(["python", "benchmarks/bench_batch_size.py", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
