"""Runs that stop when they are done (``until=``): time to a converged answer, check cost,
and nested R-hat against R-hat by number of chains.

1. **Time to a converged answer.** numpyro NUTS on the suite's eight schools and 50-d
   Gaussian, 4 chains on 2 simulated CPU devices: ``cr.run(..., num_warmup=1000,
   until=cr.Converged())`` (cap 1000 draws, the defaults: R-hat <= 1.01, bulk and tail
   ESS >= 400) against numpyro's own default ``MCMC(NUTS, num_warmup=1000,
   num_samples=1000)`` (``chain_method="vectorized"``, its fastest here), warm calls
   (compiled), interleaved, medians over ``--reps``; the ratio is chainrunner's over
   numpyro's. Also whether numpyro's 1000 draws met the same targets.
2. **The cost of checking** (target < 5 %): the sampling seconds of the ``until=`` run over
   those of the same run fixed at the draw count it stopped at, minus 1 (median over the
   repetitions, run one after the other); and the seconds spent in the checks over the
   run's sampling seconds (the checks overlap the sampling where a chunk is in flight, so
   this is an upper bound).
3. **Nested R-hat against R-hat** (many short chains): an AR(1) chain with autocorrelation
   0.95 per draw, 16 superchains started far apart, 64 to 4096 chains on 8 devices: the
   draws per chain until nested R-hat, and until classic R-hat, fall below 1.01.

Usage: ``python benchmarks/bench_until.py [--quick] [--reps N]``. Prints JSON, then tables.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def _checking_clock():
    """Patches ``_until.evaluate`` to add up its seconds; returns the running total."""
    from chainrunner.stopping import _until

    spent = [0.0]
    real = _until.evaluate

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t0

    _until.evaluate = timed
    return spent


def converged_answer(models, reps):
    import jax
    import numpy as np
    from bench_suite import make_problem
    from numpyro.infer import MCMC, NUTS

    import chainrunner as cr
    from chainrunner.stopping import _until

    spent = _checking_clock()
    rows = []
    for name in models:
        model, args, kwargs = make_problem(name)
        kernel = cr.from_numpyro(NUTS(model), model_args=args, model_kwargs=kwargs)
        mesh = cr.chain_mesh(2)
        mcmc = MCMC(NUTS(model), num_warmup=1000, num_samples=1000, num_chains=4,
                    chain_method="vectorized", progress_bar=False)  # fmt: skip
        times = {"chainrunner": [], "numpyro": []}
        checks, draws, numpyro_met, costs = [], [], [], []
        for rep in range(reps + 1):  # the first repetition compiles: not counted
            spent[0] = 0.0
            t0 = time.perf_counter()
            trace = cr.run(kernel, jax.random.key(rep), None, 1000, num_warmup=1000,
                           num_chains=4, mesh=mesh, until=cr.Converged(), progress=False,
                           warn=False)  # fmt: skip
            t_cr = time.perf_counter() - t0
            t0 = time.perf_counter()
            mcmc.run(jax.random.PRNGKey(rep), *args, **kwargs)
            samples = jax.block_until_ready(mcmc.get_samples(group_by_chain=True))
            t_np = time.perf_counter() - t0
            # The same run without until=, fixed at the draw count it stopped at: the
            # cost of checking is the difference in sampling time.
            fixed = cr.run(kernel, jax.random.key(rep), None, trace.num_draws, num_warmup=1000,
                           num_chains=4, mesh=mesh, progress=False, warn=False)  # fmt: skip
            if rep == 0:
                continue
            costs.append(trace.attrs["sampling_time"] / fixed.attrs["sampling_time"] - 1)
            times["chainrunner"].append(t_cr)
            times["numpyro"].append(t_np)
            checks.append(spent[0] / trace.attrs["sampling_time"])
            draws.append(trace.num_draws)
            status = _until.evaluate({k: np.asarray(v) for k, v in samples.items()},
                                     cr.Converged(), None)[0]  # fmt: skip
            numpyro_met.append(status.met)
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append(row := {
            "model": name,
            "chainrunner_s": med["chainrunner"],
            "numpyro_1000_1000_s": med["numpyro"],
            "ratio": med["chainrunner"] / med["numpyro"],
            "draws_at_stop": draws,
            "check_share": max(checks),
            "check_cost": statistics.median(costs),
            "numpyro_met_targets": numpyro_met,
        })  # fmt: skip
        print(json.dumps(row), flush=True)
    return rows


def nested_vs_classic(chain_counts, quick):
    import jax
    import jax.numpy as jnp
    import numpy as np

    import chainrunner as cr
    from chainrunner.stopping import _convergence

    def step(rng_key, x):
        return 0.95 * x + jnp.sqrt(1 - 0.95**2) * jax.random.normal(rng_key, x.shape), {}

    kernel = cr.Kernel(init=lambda position, rng_key: position, step=step)
    rows = []
    cap = 400 if quick else 2000
    for n in chain_counts:
        far = np.random.default_rng(0).normal(size=(16, 1, 2)) * 3
        start = jnp.asarray(np.repeat(far, n // 16, axis=1).reshape(n, 2), jnp.float32)
        trace = cr.run(kernel, jax.random.key(0), start, cap, mesh=cr.chain_mesh(8),
                       progress=False, warn=False)  # fmt: skip
        x = np.asarray(trace.draws, np.float64)
        ids = np.arange(n) // (n // 16)
        first = {"nested": None, "classic": None}
        # every 10 draws up to 200, then every 50 (a check of 4096 chains is not free)
        for length in [*range(10, min(cap, 200) + 1, 10), *range(250, cap + 1, 50)]:
            if (
                first["nested"] is None
                and _convergence.nested_rhat(x[:, :length], ids).max() < 1.01
            ):
                first["nested"] = length
            if first["classic"] is None and _convergence.rhat(x[:, :length]).max() < 1.01:
                first["classic"] = length
            if None not in first.values():
                break
        rows.append({"chains": n, "draws_nested_below_1.01": first["nested"],
                     "draws_rhat_below_1.01": first["classic"], "cap": cap})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    warnings.simplefilter("ignore")
    models = ["eight_schools"] if args.quick else ["eight_schools", "gaussian_50d"]
    reps = 1 if args.quick else args.reps
    chains = [64, 256] if args.quick else [64, 256, 1024, 4096]
    result = {
        "converged": converged_answer(models, reps),
        "nested": nested_vs_classic(chains, args.quick),
    }
    print(json.dumps(result, indent=1))
    print("\n| model | chainrunner until= s | numpyro 1000+1000 s | ratio | draws at stop | "
          "check cost | check share | numpyro met targets |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for r in result["converged"]:
        print(f"| {r['model']} | {r['chainrunner_s']:.2f} | {r['numpyro_1000_1000_s']:.2f} | "
              f"{r['ratio']:.2f} | {r['draws_at_stop']} | {100 * r['check_cost']:.1f} % | "
              f"{100 * r['check_share']:.1f} % | "
              f"{r['numpyro_met_targets']} |")  # fmt: skip
    print("\n| chains | draws until nested R-hat < 1.01 | draws until R-hat < 1.01 |")
    print("|---|---|---|")
    for r in result["nested"]:
        classic = r["draws_rhat_below_1.01"] or f"> {r['cap']}"
        print(f"| {r['chains']} | {r['draws_nested_below_1.01']} | {classic} |")


if __name__ == "__main__":
    main()
