"""Long runs: peak memory chunked vs one unchunked scan, and the cost of checkpoints.

1. Memory: 8 chains x 100,000 draws x 100 dims (float32: 320 MB of draws) of a cheap
   AR(1) kernel on 2 simulated CPU devices, each configuration in a fresh process:
   peak RSS (``ru_maxrss``) with ``chunk_size`` 1,000 against one unchunked scan
   (``chunk_size=100_000``). Target: chunked peak RSS <= 1.3 x draws + a constant
   (the constant: the same process with a 1-draw run).
2. Checkpoints: blackjax NUTS on a 50-d Gaussian, 8 chains, chunks of about 1 s;
   with and without ``checkpoint=``, interleaved repetitions; target < 5 % overhead.
3. Verifying a checkpoint on resume: a checkpoint of about 256 MB of draws (an AR(1)
   kernel, 8 chains x 1000 dims), then the seconds per GB of checking every file against
   the manifest (size and CRC-32), and of computing that record when writing (one more
   read of each file, from the page cache); target < 2 s per GB on one core.

Run: python benchmarks/bench_long_runs.py [--quick]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

MEMORY_SCRIPT = textwrap.dedent(
    """
    import json, resource, sys, time
    import jax
    jax.config.update("jax_num_cpu_devices", 2)
    import jax.numpy as jnp
    import chainrunner as cr

    draws, chunk, dim = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])

    def step(rng_key, x):
        return 0.9 * x + 0.43 * jax.random.normal(rng_key, x.shape), {}

    kernel = cr.Kernel(init=lambda position, rng_key: position, step=step)
    t0 = time.perf_counter()
    trace = cr.run(kernel, jax.random.key(0), jnp.zeros((8, dim)), draws, chunk_size=chunk,
                   mesh=cr.chain_mesh(2), progress=False, warn=False)
    wall = time.perf_counter() - t0
    stats = jax.devices()[0].memory_stats() or {}
    print(json.dumps({
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "draws_mb": trace.draws.nbytes / 2**20,
        "device_peak_mb": stats.get("peak_bytes_in_use", float("nan")) / 2**20,
        "wall_s": wall,
    }))
    """
)


def memory(draws, chunk, dim):
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_SCRIPT, str(draws), str(chunk), str(dim)],
        capture_output=True, text=True, check=True,
        env={**os.environ, "TQDM_DISABLE": "1"},
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def checkpoint_overhead(quick):
    import time

    import jax

    jax.config.update("jax_num_cpu_devices", 2)
    import blackjax
    import jax.numpy as jnp
    import numpy as np

    import chainrunner as cr

    dim, chunk, chunks, reps = (50, 8000, 3, 3) if not quick else (10, 100, 2, 1)
    nuts = blackjax.nuts(lambda x: -0.5 * jnp.sum(x**2), 0.25, jnp.ones(dim))
    x0 = jnp.zeros((8, dim))
    kw = {"chunk_size": chunk, "mesh": cr.chain_mesh(2), "progress": False, "warn": False}
    times = {"plain": [], "checkpoint": []}
    with tempfile.TemporaryDirectory() as tmp:
        # Compile, and import what checkpoints use, before timing.
        cr.run(nuts, jax.random.key(0), x0, chunk * chunks, checkpoint=f"{tmp}/warm", **kw)
        for rep in range(reps):
            for name in times:
                ckpt = os.path.join(tmp, f"c{rep}") if name == "checkpoint" else None
                t0 = time.perf_counter()
                trace = cr.run(nuts, jax.random.key(rep), x0, chunk * chunks, checkpoint=ckpt,
                               **kw)  # fmt: skip
                times[name].append(time.perf_counter() - t0)
    med = {k: float(np.median(v)) for k, v in times.items()}
    return {
        "chunk_s": med["plain"] / chunks,
        "median_s": med,
        "overhead": med["checkpoint"] / med["plain"] - 1.0,
        "draws_per_chunk_mb": trace.draws.nbytes / chunks / 2**20,
    }


def verify_cost(quick):
    import time

    import jax

    jax.config.update("jax_num_cpu_devices", 2)
    import jax.numpy as jnp

    import chainrunner as cr
    from chainrunner.output import _checkpoint

    dim, draws, chunk = (1000, 8000, 1000) if not quick else (100, 400, 100)

    def step(rng_key, x):
        return 0.9 * x + 0.43 * jax.random.normal(rng_key, x.shape), {}

    kernel = cr.Kernel(init=lambda position, rng_key: position, step=step)
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "ckpt")
        t0 = time.perf_counter()
        cr.run(kernel, jax.random.key(0), jnp.zeros((8, dim)), draws, chunk_size=chunk,
               mesh=cr.chain_mesh(2), progress=False, warn=False, checkpoint=folder)  # fmt: skip
        run_s = time.perf_counter() - t0
        files = [os.path.join(folder, f) for f in os.listdir(folder) if f != "manifest.json"]
        gb = sum(os.path.getsize(f) for f in files) / 2**30
        with open(os.path.join(folder, "manifest.json")) as f:
            config = json.load(f)["config"]
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            ckpt = _checkpoint.Checkpoint(folder, config)
            ckpt.open(create=False)
            times.append(time.perf_counter() - t0)
        assert ckpt.draws_done == draws and not ckpt.repaired
        t0 = time.perf_counter()
        for f in files:
            _checkpoint.checksum(f)
        record_s = time.perf_counter() - t0
    verify_s = sorted(times)[1]
    return {
        "checkpoint_gb": gb,
        "run_with_checkpoint_s": run_s,
        "verify_s_per_gb": verify_s / gb,
        "record_s_per_gb": record_s / gb,
        "record_share_of_run": record_s / run_s,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    draws, dim = (100_000, 100) if not args.quick else (2_000, 20)
    base = memory(1, 1, dim)
    chunked = memory(draws, 1000 if not args.quick else 100, dim)
    whole = memory(draws, draws, dim)
    result = {
        "memory": {
            "draws_mb": chunked["draws_mb"],
            "baseline_rss_mb": base["peak_rss_mb"],
            "chunked": chunked,
            "unchunked": whole,
            "chunked_over_draws": (chunked["peak_rss_mb"] - base["peak_rss_mb"])
            / chunked["draws_mb"],
            "unchunked_over_draws": (whole["peak_rss_mb"] - base["peak_rss_mb"])
            / whole["draws_mb"],
        },
        "checkpoint": checkpoint_overhead(args.quick),
        "verify": verify_cost(args.quick),
    }
    print(json.dumps(result, indent=1))
    m, c = result["memory"], result["checkpoint"]
    print()
    print("| run | peak RSS MB | (peak - baseline) / draws | wall s |")
    print("|---|---|---|---|")
    print(f"| baseline (1 draw) | {m['baseline_rss_mb']:.0f} | | |")
    for k in ("chunked", "unchunked"):
        print(
            f"| {k} | {m[k]['peak_rss_mb']:.0f} | {m[k + '_over_draws']:.2f} | "
            f"{m[k]['wall_s']:.1f} |"
        )
    print()
    print(f"checkpoint overhead at {c['chunk_s']:.2f} s chunks: {100 * c['overhead']:.1f} %")
    v = result["verify"]
    print(
        f"verifying a {v['checkpoint_gb']:.2f} GB checkpoint: {v['verify_s_per_gb']:.2f} s/GB; "
        f"writing its integrity record: {v['record_s_per_gb']:.2f} s/GB "
        f"({100 * v['record_share_of_run']:.1f} % of that run)"
    )


if __name__ == "__main__":
    main()
