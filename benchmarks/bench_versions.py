"""Two checkouts of chainrunner, end to end: the same calls, in alternating fresh processes.

A refactor must keep the speed of what users run. This script runs each workload (a
default ``cr.run`` as users write it) in a fresh process per repetition, alternating
between the checkout under test and another one (``--other``, e.g. a ``git worktree`` of
the commit before), and reports per workload the median first call (compile + sampling,
what a script pays) and the median warm call, with the median of the paired ratios
(this checkout's time over the other's, repetition by repetition).

Usage::

    git worktree add /tmp/before <commit>
    python benchmarks/bench_versions.py --other /tmp/before [--reps 3]

Prints JSON lines and a markdown table; writes ``benchmarks/results/versions.json``.
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

WORKLOADS = {
    "numpyro_eight_schools": """
import numpyro, numpyro.distributions as dist
from numpyro.infer import NUTS
J = 8
y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
sigma = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])
def model(sigma, y=None):
    mu = numpyro.sample("mu", dist.Normal(0, 5))
    tau = numpyro.sample("tau", dist.HalfCauchy(5))
    with numpyro.plate("J", J):
        eta = numpyro.sample("eta", dist.Normal(0, 1))
        numpyro.sample("y", dist.Normal(mu + tau * eta, sigma), obs=y)
kernel = cr.from_numpyro(NUTS(model), model_args=(sigma,), model_kwargs={"y": y})
call = lambda seed: cr.run(kernel, jax.random.key(seed), None, 1000, num_warmup=1000,
                           num_chains=4, progress=False, warn=False)
""",
    "blackjax_window_gaussian50": """
import blackjax
d = 50
prec = jnp.asarray(np.linalg.inv(0.5 * np.eye(d) + 0.5), jnp.float32)
logdensity = lambda x: -0.5 * x @ prec @ x
kernel = cr.from_blackjax(blackjax.nuts, logdensity_fn=logdensity, adaptation="window")
x0 = jnp.zeros((16, d))
call = lambda seed: cr.run(kernel, jax.random.key(seed), x0, 500, num_warmup=500,
                           progress=False, warn=False)
""",
    "blackjax_chees_gaussian50": """
import blackjax
d = 50
prec = jnp.asarray(np.linalg.inv(0.5 * np.eye(d) + 0.5), jnp.float32)
logdensity = lambda x: -0.5 * x @ prec @ x
kernel = cr.from_blackjax(blackjax.dynamic_hmc, logdensity_fn=logdensity, adaptation="chees")
x0 = jax.random.normal(jax.random.key(1), (64, d))
call = lambda seed: cr.run(kernel, jax.random.key(seed), x0, 500, num_warmup=500,
                           progress=False, warn=False)
""",
}

WORKER = """
import sys, time, json
import jax
jax.config.update("jax_num_cpu_devices", 2)
import jax.numpy as jnp, numpy as np
import chainrunner as cr
{setup}
t0 = time.perf_counter(); call(0); first = time.perf_counter() - t0
warm = []
for seed in (1, 2, 3):
    t0 = time.perf_counter(); call(seed); warm.append(time.perf_counter() - t0)
print(json.dumps({{"first_s": first, "warm_s": sorted(warm)[1], "file": cr.__file__}}))
"""


def one(checkout: str, workload: str) -> dict:
    env = {**os.environ, "PYTHONPATH": checkout, "TQDM_DISABLE": "1"}
    code = WORKER.format(setup=WORKLOADS[workload])
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=checkout
    )
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["process_s"] = time.perf_counter() - t0
    if not out["file"].startswith(os.path.abspath(checkout)):
        raise RuntimeError(f"{checkout}: imported {out['file']} instead")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other", required=True, help="the other checkout (its root folder)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--out", default=os.path.join(HERE, "results", "versions.json"))
    args = parser.parse_args()
    rows = []
    for w in args.workloads.split(","):
        pairs = []
        for r in range(args.reps):  # alternate which goes first (ABBA)
            order = [ROOT, args.other] if r % 2 == 0 else [args.other, ROOT]
            got = {c: one(c, w) for c in order}
            pairs.append((got[ROOT], got[args.other]))
        row = {"workload": w, "reps": args.reps}
        for k in ("process_s", "first_s", "warm_s"):
            row[f"this_{k}"] = float(np.median([a[k] for a, _ in pairs]))
            row[f"other_{k}"] = float(np.median([b[k] for _, b in pairs]))
            row[f"ratio_{k}"] = float(np.median([a[k] / b[k] for a, b in pairs]))
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump({"other": os.path.abspath(args.other), "rows": rows}, f, indent=1)
    print("\n| workload | process s (this / other) | first call s | warm call s |")
    print("|---|---|---|---|")
    for r in rows:
        cells = [
            f"{r[f'this_{k}']:.2f} / {r[f'other_{k}']:.2f} ({r[f'ratio_{k}']:.2f}x)"
            for k in ("process_s", "first_s", "warm_s")
        ]
        print(f"| {r['workload']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
