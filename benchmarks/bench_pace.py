"""The pace of NUTS through a run, per chunk, for two fixed batch sizes.

Why ``batch_size="auto"`` probes at the first sampling draw and not at the first
draw (``docs/batch-size.md``): in the first draws of a warmup, trajectory lengths
differ the most between chains, and a vmap waits for the longest. This script runs
the same numpyro NUTS run (``bench_batch_size``'s models) with each batch size, times
each chunk as it is collected, and prints the milliseconds per draw of each and
their ratio, chunk by chunk.

Usage::

    python benchmarks/bench_pace.py                      # matmul, 64 chains, 4000+4000
    python benchmarks/bench_pace.py --model eight_schools --chains 64 --batch-sizes 1,all
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))


def chunk_times(kernel, opts, batch_size):
    """Seconds of each chunk of one run (between the collections of its chunks)."""
    import jax
    import numpy as np

    import chainrunner as cr
    from chainrunner.pipeline import _host

    stamps, collect = [], _host.Collector.collect

    def timed(self, first, count, state, out):
        jax.block_until_ready(state)
        stamps.append(time.perf_counter())
        return collect(self, first, count, state, out)

    kw = {"num_chains": opts.chains, "mesh": cr.chain_mesh(opts.devices), "progress": False,
          "warn": False, "batch_size": batch_size, "chunk_size": opts.chunk}  # fmt: skip
    # compiles the chunk program the timed run uses (its chunk length: opts.chunk)
    cr.run(kernel, jax.random.key(1), None, opts.chunk, num_warmup=opts.chunk, **kw)
    _host.Collector.collect = timed
    try:
        t0 = time.perf_counter()
        cr.run(kernel, jax.random.key(0), None, opts.draws, num_warmup=opts.warmup, **kw)
    finally:
        _host.Collector.collect = collect
    return np.diff([t0, *stamps])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="matmul")
    parser.add_argument("--chains", type=int, default=64)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=4000)
    parser.add_argument("--draws", type=int, default=4000)
    parser.add_argument("--chunk", type=int, default=160)
    parser.add_argument("--batch-sizes", default="1,8", help="two, e.g. 1,8 or 1,all")
    opts = parser.parse_args()
    import jax

    jax.config.update("jax_num_cpu_devices", opts.devices)
    warnings.simplefilter("ignore")
    from bench_batch_size import make_problem
    from numpyro.infer import NUTS

    import chainrunner as cr

    model, args, kwargs = make_problem(opts.model)
    sizes = [None if b == "all" else int(b) for b in opts.batch_sizes.split(",")]
    times = {}
    for b in sizes:  # each its own kernel: nothing compiled is shared
        kernel = cr.from_numpyro(NUTS(model), model_args=args, model_kwargs=kwargs)
        times[b] = chunk_times(kernel, opts, b)
    a, b = sizes
    rows = [
        {"to_draw": min((i + 1) * opts.chunk, opts.warmup + opts.draws),
         "ms_per_draw": [1000 * times[a][i] / opts.chunk, 1000 * times[b][i] / opts.chunk],
         "ratio": times[a][i] / times[b][i]}
        for i in range(len(times[a]))
    ]  # fmt: skip
    totals = {str(k): float(v.sum()) for k, v in times.items()}
    print(json.dumps({"opts": vars(opts), "totals_s": totals, "rows": rows}))
    print(f"| draws up to | ms/draw b={a} | ms/draw b={b} | b={a} time / b={b} time |")
    print("|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['to_draw']} | {r['ms_per_draw'][0]:.2f} | {r['ms_per_draw'][1]:.2f} "
              f"| {r['ratio']:.2f} |")  # fmt: skip
    print(f"\ntotals: {totals}")


if __name__ == "__main__":
    main()
