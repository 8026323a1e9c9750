"""The cost of running a cross-chain warmup in chunks (issue 58), 2 CPU devices.

ChEES, MEADS and pooled Fisher run their warmup in chunks so that the bar moves, Ctrl-C
keeps the warmup done and a checkpoint resumes it. Under a bar (``progress=None`` or
``True``) a warmup of 1000 steps runs as 4 chunks of 250; with ``progress=False`` as one
chunk of 1000: the same draws, bit for bit. This script times both on a 20-d correlated
Gaussian, 64 chains x (1000 warmup + 1000 draws), ``progress=None`` (4 chunks) against
``progress=False`` (1 chunk):

- **first**: the whole first ``cr.run`` in a fresh process, the program cache off;
- **warm**: the warmup's own seconds (``attrs["warmup_time"]``) of a later call in the
  same process, the median of 3.

Each measurement runs in its own process, the two settings interleaved, ``--reps`` times
(default 3); the figures are medians and the ratio chunked / one chunk.

Usage: ``python benchmarks/bench_warmup_chunks.py [--quick] [--reps N] [--write]``.
Prints JSON, then a markdown table; ``--write`` saves
``benchmarks/results/warmup_chunks-jax<major.minor>.json``.
"""

import argparse
import json
import os
import subprocess
import sys
import time

ADAPTATIONS = ("chees", "meads", "pooled")
SETTINGS = {"4 chunks": None, "1 chunk": False}


def one(adaptation: str, progress: str, steps: int) -> dict:
    """One process: the first call, then the warmup time of 3 more."""
    import blackjax
    import jax
    import jax.numpy as jnp
    import numpy as np

    import chainrunner as cr

    d = 20
    a = np.random.default_rng(0).normal(size=(d, d)) / np.sqrt(d) + np.eye(d)
    a = jnp.asarray(a, jnp.float32)

    def logdensity(x):
        return -0.5 * jnp.sum((a @ x) ** 2)

    if adaptation == "pooled":
        kernel = cr.from_blackjax(
            blackjax.nuts, logdensity_fn=logdensity, adaptation="fisher", pooled=True
        )
    else:
        factory = {"chees": blackjax.dynamic_hmc, "meads": blackjax.ghmc}[adaptation]
        kernel = cr.from_blackjax(factory, logdensity_fn=logdensity, adaptation=adaptation)
    x0 = jax.random.normal(jax.random.key(0), (64, d))
    options = {"num_warmup": steps, "mesh": cr.chain_mesh(2), "warn": False,
               "progress": SETTINGS[progress]}  # fmt: skip
    t0 = time.perf_counter()
    cr.run(kernel, jax.random.key(0), x0, steps, **options)
    first = time.perf_counter() - t0
    warm = [
        cr.run(kernel, jax.random.key(i), x0, steps, **options).attrs["warmup_time"]
        for i in range(1, 4)
    ]
    return {"first_s": first, "warm_warmup_s": float(np.median(warm))}


def measure(reps: int, steps: int) -> list[dict]:
    env = {**os.environ, "CHAINRUNNER_CACHE": "off", "JAX_NUM_CPU_DEVICES": "2",
           "TQDM_DISABLE": "1"}  # fmt: skip
    runs: dict = {}
    for _ in range(reps):
        for adaptation in ADAPTATIONS:
            for progress in SETTINGS:
                cmd = [sys.executable, __file__, "--one", adaptation, progress, str(steps)]
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
                runs.setdefault((adaptation, progress), []).append(json.loads(out.stdout))
    return [_row(adaptation, runs, steps) for adaptation in ADAPTATIONS]


def _row(adaptation: str, runs: dict, steps: int) -> dict:
    import jax
    import numpy as np

    med = {
        (p, k): float(np.median([r[k] for r in runs[(adaptation, p)]]))
        for p in SETTINGS
        for k in ("first_s", "warm_warmup_s")
    }
    return {
        "jax": jax.__version__, "adaptation": adaptation, "steps": steps,
        "reps": len(runs[(adaptation, "1 chunk")]),
        **{f"{k}[{p}]": v for (p, k), v in med.items()},
        "first_ratio": med[("4 chunks", "first_s")] / med[("1 chunk", "first_s")],
        "warm_ratio": med[("4 chunks", "warm_warmup_s")] / med[("1 chunk", "warm_warmup_s")],
        "runs": {p: runs[(adaptation, p)] for p in SETTINGS},
    }  # fmt: skip


def table(rows: list[dict]) -> str:
    head = (
        "| jax | adaptation | first call, 4 chunks / 1 chunk (s) | ratio "
        "| warm warmup, 4 chunks / 1 chunk (s) | ratio |\n|---|---|---|---:|---|---:|"
    )
    lines = [
        f"| {r['jax']} | {r['adaptation']} "
        f"| {r['first_s[4 chunks]']:.2f} / {r['first_s[1 chunk]']:.2f} | {r['first_ratio']:.2f} "
        f"| {r['warm_warmup_s[4 chunks]']:.2f} / {r['warm_warmup_s[1 chunk]']:.2f} "
        f"| {r['warm_ratio']:.2f} |"
        for r in rows
    ]
    return "\n".join([head, *lines])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 rep of 200 steps")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        adaptation, progress, steps = args.one
        print(json.dumps(one(adaptation, progress, int(steps))))
        return
    rows = measure(1 if args.quick else args.reps, 200 if args.quick else 1000)
    print(json.dumps(rows, indent=1))
    print(table(rows))
    if args.write and not args.quick:
        import jax

        version = ".".join(jax.__version__.split(".")[:2])
        path = os.path.join(
            os.path.dirname(__file__), "results", f"warmup_chunks-jax{version}.json"
        )
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
