"""Many chains: what a run spends outside compiling and the sampling loop (issue 35).

Eight schools (non-centred, blackjax NUTS with window adaptation), 10,000 chains x
(200 warmup + 200 draws) on 8 simulated CPU devices, 100 superchains, the defaults
otherwise (diagnostics with nested R-hat at the end). One process; the run is called
once to compile, then timed ``--reps`` times. Per timed run:

- ``wall``: the whole ``cr.run`` call;
- ``compile_time`` and ``sampling_time`` (the chunk loop, host copies included) from
  ``trace.attrs``;
- ``outside``: ``wall - compile_time - sampling_time``: placing the chains, initialising
  them, assembling the trace and the diagnostics (``warn=True``, the default);
- ``diagnostics``: ``cr.diagnose(trace)`` timed again on its own (chainrunner's
  vectorised R-hat/ESS), and ArviZ's ``rhat``/``ess`` (bulk and tail) of the same draws
  for comparison.

The target: ``outside`` at most 10 % of ``sampling_time``.

    python benchmarks/bench_many_chains.py [--chains 10000] [--reps 2] [--quick] [--json out]
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ["TQDM_DISABLE"] = "1"

import numpy as np

Y = np.array([28.0, 8, -3, 7, -1, 1, 18, 12])
SIGMA = np.array([15.0, 10, 16, 11, 9, 11, 10, 18])


def logdensity(p):
    import jax.numpy as jnp
    from jax.scipy.stats import cauchy, norm

    mu, log_tau, theta_t = p["mu"], p["log_tau"], p["theta_t"]
    tau = jnp.exp(log_tau)
    theta = mu + tau * theta_t
    return (
        norm.logpdf(mu, 0, 5)
        + cauchy.logpdf(tau, 0, 5)
        + log_tau
        + jnp.sum(norm.logpdf(theta_t))
        + jnp.sum(norm.logpdf(Y, theta, SIGMA))
    )


def one(chains: int, warmup: int, draws: int, superchains: int):
    import blackjax
    import jax
    import jax.numpy as jnp

    import chainrunner as cr

    nuts = cr.from_blackjax(blackjax.nuts, logdensity_fn=logdensity, adaptation="window")
    start = {
        "mu": jnp.zeros(chains),
        "log_tau": jnp.zeros(chains),
        "theta_t": jnp.zeros((chains, 8)),
    }
    t0 = time.perf_counter()
    with warnings.catch_warnings():  # the defaults: diagnostics at the end (warn=True)
        warnings.simplefilter("ignore")
        trace = cr.run(nuts, jax.random.key(0), start, draws, num_warmup=warmup,
                       superchains=superchains)  # fmt: skip
    wall = time.perf_counter() - t0
    return trace, wall


def arviz_time(trace) -> float:
    import arviz as az

    data = {k: np.asarray(v, float) for k, v in trace.draws.items()}
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        az.ess(data, method="bulk")
        az.ess(data, method="tail")
        az.rhat(data, method="rank")
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chains", type=int, default=10_000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--superchains", type=int, default=100)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="1,000 chains, one rep")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.quick:
        args.chains, args.reps = 1000, 1
    import chainrunner as cr

    one(args.chains, args.warmup, args.draws, args.superchains)  # compiles
    rows = []
    for rep in range(args.reps):
        trace, wall = one(args.chains, args.warmup, args.draws, args.superchains)
        a = trace.attrs
        t0 = time.perf_counter()
        cr.diagnose(trace)
        diag = time.perf_counter() - t0
        outside = wall - a["compile_time"] - a["sampling_time"]
        row = {
            "rep": rep, "chains": args.chains, "wall": wall, "compile_time": a["compile_time"],
            "sampling_time": a["sampling_time"], "outside": outside,
            "outside_vs_sampling": outside / a["sampling_time"], "diagnostics": diag,
            "arviz_rhat_ess": arviz_time(trace),
        }  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    keys = ("wall", "compile_time", "sampling_time", "outside", "outside_vs_sampling",
            "diagnostics", "arviz_rhat_ess")  # fmt: skip
    print("\n| " + " | ".join(keys) + " |\n|" + "---:|" * len(keys))
    print("| " + " | ".join(f"{np.median([r[k] for r in rows]):.3g}" for k in keys) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
