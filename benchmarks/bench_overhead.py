"""Runner overhead, row by row: chainrunner's sampling time over the hand-written floor's.

The suite (``bench_suite.py``) runs ten methods with 2 warm repetitions per row, which
cannot resolve the 5 % overhead target on a noisy machine: a row whose warm call takes
0.2 s moves by 20 % between two calls. This script measures only the two pairs that the
target is about, on the suite's grid (models x chains x devices, same warmup and draws),
with as many repetitions as a time budget per row allows:

- ``cr.run(..., batch_size=None, warn=False)`` against ``floor``, the hand-written
  ``jit(shard_map(vmap(scan)))``;
- ``cr.run(..., batch_size=1, warn=False)`` against ``floor[map]``, the hand-written
  ``jit(shard_map(lax.map(scan)))``. On CPU ``batch_size="auto"`` keeps ``1`` where the
  compile dominates (these rows): the same program, so this pair is also the default's
  overhead there.

Both sides run numpyro's NUTS with its default adaptation and give the draws to the
host as numpy arrays (chainrunner: the constrained draws and sample statistics after
warmup; the floor: every unconstrained position, as the blackjax recipe's loop keeps).
Each repetition calls the four programs, in an order that alternates between
repetitions (ABBA), with a new seed; the ratio of a repetition is chainrunner's time over
its floor's in that repetition, and a row reports the median of these paired ratios
with a bootstrap 90 % interval of that median, and the ratio of the medians.

Repetitions per row: the warm time budget (``--budget`` seconds) over the time of one
repetition, between ``--min-reps`` and ``--max-reps``. Each device count runs in its
own process, and each row too (``jax_num_cpu_devices`` is fixed at start).

Usage::

    python benchmarks/bench_overhead.py                # the suite's grid (~30 min, 2 cores)
    python benchmarks/bench_overhead.py --quick        # eight schools, 8 chains, 2 devices
    python benchmarks/bench_overhead.py --write-docs   # also updates docs/benchmarks.md

Writes ``benchmarks/results/overhead.json`` (or ``--out``) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_suite import (  # noqa: E402
    MODELS,
    SIZES,
    command_line,
    machine,
    run_worker,
    write_docs,
)

PAIRS = (("chainrunner[vmap]", "floor"), ("chainrunner[batch=1]", "floor[map]"))
TARGET = 1.05
DOCS_START = "<!-- overhead:start -->"
DOCS_END = "<!-- overhead:end -->"


def bootstrap_median(values, rng, draws=4000, level=0.90):
    """The median of ``values`` and a bootstrap ``level`` interval of it."""
    import numpy as np

    values = np.asarray(values, float)
    meds = np.median(rng.choice(values, size=(draws, values.size), replace=True), axis=1)
    lo, hi = np.quantile(meds, [(1 - level) / 2, (1 + level) / 2])
    return float(np.median(values)), float(lo), float(hi)


def bench_row(model_name, chains, ndev, opts):
    """The two pairs on one (model, chains, devices); returns a result row per pair."""
    import numpy as np
    from bench_suite import make_method, make_problem

    model, args, kwargs = make_problem(model_name)
    warmup, draws = opts.sizes[chains]
    methods = [m for pair in PAIRS for m in pair]
    runners = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for m in methods:
            runners[m] = make_method(m, model, args, kwargs, chains, warmup, draws, ndev)
            runners[m](0)  # compiles

        def once(m, seed):
            t0 = time.perf_counter()
            runners[m](seed)
            return time.perf_counter() - t0

        times = {m: [once(m, 1)] for m in methods}  # one warm repetition sizes the rest
        per_rep = sum(t[0] for t in times.values())
        reps = int(min(max(opts.budget // per_rep, opts.min_reps), opts.max_reps))
        for rep in range(1, reps):
            order = methods if rep % 2 else methods[::-1]
            for m in order:
                times[m].append(once(m, rep + 1))
    rng = np.random.default_rng(0)
    rows = []
    for runner, floor in PAIRS:
        ratios = np.array(times[runner]) / np.array(times[floor])
        med, lo, hi = bootstrap_median(ratios, rng)
        rows.append(
            {
                "model": model_name, "chains": chains, "devices": ndev,
                "method": runner, "floor": floor, "warmup": warmup, "draws": draws,
                "reps": reps, "runner_s": round(float(np.median(times[runner])), 4),
                "floor_s": round(float(np.median(times[floor])), 4),
                "ratio": round(med, 3), "ratio_lo": round(lo, 3), "ratio_hi": round(hi, 3),
                "ratio_of_medians": round(
                    float(np.median(times[runner]) / np.median(times[floor])), 3
                ),
            }
        )  # fmt: skip
    return rows


def worker(opts):
    import jax

    jax.config.update("jax_num_cpu_devices", opts.devices)
    os.environ.setdefault("TQDM_DISABLE", "1")
    ndev = len(jax.devices())
    jax.block_until_ready(jax.random.split(jax.random.key(0), 4))
    for model_name in opts.models:
        for chains in opts.chains:
            for row in bench_row(model_name, chains, ndev, opts):
                print("#ROW " + json.dumps(row), flush=True)


def table(rows):
    key = lambda r: (r["devices"], MODELS.index(r["model"]), r["chains"])  # noqa: E731
    lines = [
        "| model | chains | devices | warm reps | `batch_size=None` / `floor` (90 % interval) "
        '| `batch_size=1` (`"auto"` where it keeps 1) / `floor[map]` (90 % interval) |',
        "|---|---|---|---|---|---|",
    ]
    by_row: dict = {}
    for r in rows:
        by_row.setdefault(key(r), {})[r["method"]] = r
    for k in sorted(by_row):
        pair = by_row[k]
        first = next(iter(pair.values()))
        cells = []
        for runner, _ in PAIRS:
            r = pair.get(runner)
            cells.append(
                "-" if r is None else f"{r['ratio']:.3f} ({r['ratio_lo']:.3f}-{r['ratio_hi']:.3f})"
            )
        lines.append(
            f"| {first['model']} | {first['chains']} | {first['devices']} | {first['reps']} | "
            + " | ".join(cells)
            + " |"
        )
    ratios = sorted(r["ratio"] for r in rows)
    over = [r for r in rows if r["ratio"] > TARGET]
    surely = [r for r in rows if r["ratio_lo"] > TARGET]
    lines += [
        "",
        f"Median paired ratio over the {len(rows)} pairs: {ratios[len(ratios) // 2]:.3f} "
        f"(range {ratios[0]:.3f}-{ratios[-1]:.3f}); {len(over)} above {TARGET}, "
        f"{len(surely)} with the whole interval above {TARGET}.",
    ]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small row, few reps")
    parser.add_argument("--devices", default="2,8", help="simulated CPU device counts")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--chains", default="8,64,512")
    parser.add_argument("--budget", type=float, default=60.0, help="warm seconds per row")
    parser.add_argument("--min-reps", type=int, default=3)
    parser.add_argument("--max-reps", type=int, default=30)
    parser.add_argument("--out", default=None, help="default benchmarks/results/overhead.json")
    parser.add_argument("--from-json", default=None, help="only print (and write) the table")
    parser.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--size-map", default=None, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.quick:
        opts.devices, opts.models, opts.chains = "2", "eight_schools", "8"
        opts.budget, opts.min_reps = 2.0, 3
    opts.models = [m for m in opts.models.split(",") if m]
    opts.chains = [int(c) for c in opts.chains.split(",")]
    for m in opts.models:
        if m not in MODELS:
            parser.error(f"--models: unknown model {m!r}; expected some of {MODELS}")
    if opts.size_map:
        opts.sizes = {int(c): tuple(v) for c, v in json.loads(opts.size_map).items()}
    else:
        opts.sizes = {c: SIZES.get(c, (100, 100)) for c in opts.chains}
        if opts.quick:
            opts.sizes = {c: (100, 100) for c in opts.chains}
    if opts.worker:
        opts.devices = int(opts.devices)
        return worker(opts)
    if opts.out is None:
        name = "overhead-quick" if opts.quick else "overhead"
        opts.out = os.path.join(HERE, "results", f"{name}.json")

    info = {**machine(), "date": time.strftime("%Y-%m-%d")}
    rows = []
    if opts.from_json:
        with open(opts.from_json) as f:
            saved = json.load(f)
        rows, info = saved["results"], saved["machine"]
    os.makedirs(os.path.dirname(os.path.abspath(opts.out)), exist_ok=True)
    grid = [(nd, m, c) for nd in opts.devices.split(",") for m in opts.models for c in opts.chains]
    for nd, model, chains in [] if opts.from_json else grid:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--devices", nd]
        cmd += ["--models", model, "--chains", str(chains), "--budget", str(opts.budget)]
        cmd += ["--min-reps", str(opts.min_reps), "--max-reps", str(opts.max_reps)]
        cmd += ["--size-map", json.dumps(opts.sizes)]
        env = dict(os.environ, TQDM_DISABLE="1")
        run_worker(cmd, env, f"{model}, {chains} chains, {nd} devices", rows, opts.out, info)
    text = table(rows)
    print()
    print(text)
    if opts.write_docs:
        write_docs(text, command_line(), info, DOCS_START, DOCS_END)


if __name__ == "__main__":
    main()
