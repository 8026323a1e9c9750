"""PyMC models: chainrunner next to pm.sample (numpyro, blackjax) and nutpie, compile included.

The same PyMC models (eight schools non-centred with coords, a hierarchical linear model
with ``pm.Data``, a model with bounded and simplex variables), each sampled by

- ``chainrunner``: ``cr.sample(cr.from_pymc(model), key, None, draws, num_warmup=tune,
  num_chains=chains)`` (blackjax NUTS, its default Fisher low-rank adaptation);
- ``pymc_numpyro`` / ``pymc_blackjax``: ``pm.sample(nuts_sampler="numpyro"|"blackjax")``
  (``chain_method="parallel"`` when the chains fit the devices, else ``"vectorized"``);
- ``nutpie``: ``nutpie.sample(nutpie.compile_pymc_model(model))`` (its default numba
  backend), if nutpie is installed;

at 4 and 64 chains, ``tune`` warmup steps and ``draws`` draws per chain. Each measurement is
a fresh process that builds the model and samples once (``first``: compile included, what a
user waits for after the imports), then again with a new seed (``repeat``); ``ESS/s`` is the
smallest bulk ESS over all posterior variables of the repeat, per second of the repeat.
Every call returns ArviZ data; none computes convergence checks. ESS/s splits into ESS
per gradient (the sampler and its adaptation) and seconds per gradient (the log density
and the sampler's own cost per leapfrog step; warmup steps are assumed to cost what
sampling steps do). Processes are interleaved
(method order rotated each repetition), figures are medians over ``--reps``, and each ratio
is chainrunner over the best of the other methods (time: < 1 is faster; ESS/s: > 1 is better).

Usage: ``python benchmarks/bench_pymc.py [--reps N] [--devices D] [--draws N] [--quick]
[--json benchmarks/results/pymc.json]``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = ("eight_schools", "hierarchical_linear", "bounded_simplex")
METHODS = ("chainrunner", "pymc_numpyro", "pymc_blackjax", "nutpie")
CHAINS = (4, 64)


def make_model(name: str):
    """The PyMC model ``name`` (PyMC is imported here, in the measuring process)."""
    import numpy as np
    import pymc as pm

    if name == "eight_schools":
        with pm.Model(coords={"school": list("ABCDEFGH")}) as model:
            sigma = pm.Data("sigma", np.array([15.0, 10, 16, 11, 9, 11, 10, 18]), dims="school")
            mu = pm.Normal("mu", 0, 5)
            tau = pm.HalfCauchy("tau", 5)
            theta_trans = pm.Normal("theta_trans", 0, 1, dims="school")
            theta = pm.Deterministic("theta", mu + tau * theta_trans, dims="school")
            y = np.array([28.0, 8, -3, 7, -1, 1, 18, 12])
            pm.Normal("y", theta, sigma=sigma, observed=y, dims="school")
        return model
    if name == "hierarchical_linear":
        rng = np.random.default_rng(1)
        n, groups = 200, [f"g{i}" for i in range(10)]
        idx = rng.integers(0, len(groups), n)
        x = rng.normal(size=n)
        y = rng.normal(0.0, 1.0, len(groups))[idx] + 0.7 * x + rng.normal(0.0, 0.5, n)
        with pm.Model(coords={"group": groups, "obs_id": range(n)}) as model:
            x_data = pm.Data("x", x, dims="obs_id")
            group_idx = pm.Data("group_idx", idx, dims="obs_id")
            mu_a = pm.Normal("mu_a", 0.0, 5.0)
            sigma_a = pm.HalfNormal("sigma_a", 2.0)
            z = pm.Normal("z", 0.0, 1.0, dims="group")
            a = pm.Deterministic("a", mu_a + sigma_a * z, dims="group")
            b = pm.Normal("b", 0.0, 2.0)
            sigma = pm.HalfNormal("sigma", 2.0)
            pm.Normal("y", a[group_idx] + b * x_data, sigma, observed=y, dims="obs_id")
        return model
    with pm.Model(coords={"category": ["a", "b", "c"]}) as model:
        p = pm.Beta("p", 2.0, 2.0)
        s = pm.Uniform("s", 0.0, 10.0)
        w = pm.Dirichlet("w", np.ones(3), dims="category")
        pm.Binomial("k", n=20, p=p, observed=7)
        pm.Normal("y", 1.0, s, observed=np.array([0.2, 2.5, 1.1, -0.8, 3.0]))
        pm.Multinomial("counts", n=30, p=w, observed=np.array([5, 10, 15]), dims="category")
    return model


def min_ess_bulk(idata) -> float:
    """The smallest bulk ESS over every scalar component of the posterior."""
    import arviz as az
    import numpy as np

    post = idata["posterior"] if hasattr(idata, "children") else idata.posterior
    smallest = np.inf
    for name in post.data_vars:
        x = np.asarray(post[name].transpose("chain", "draw", ...).values, dtype=np.float64)
        x = x.reshape((*x.shape[:2], -1))
        for j in range(x.shape[-1]):
            smallest = min(smallest, float(np.asarray(az.ess(x[..., j], method="bulk")).ravel()[0]))
    return smallest


CHILD = r"""
import json, logging, os, sys, time, warnings
os.environ["TQDM_DISABLE"] = "1"
import jax
jax.config.update("jax_num_cpu_devices", int(sys.argv[4]))
sys.path.insert(0, sys.argv[5])
warnings.simplefilter("ignore")
logging.getLogger("pymc").setLevel(logging.ERROR)
from bench_pymc import make_model, min_ess_bulk
method, name, chains, devices = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
draws, tune = int(sys.argv[6]), int(sys.argv[7])
import pymc as pm
model = make_model(name)
if method == "chainrunner":
    import chainrunner as cr
elif method == "nutpie":
    import nutpie

def sample(seed):
    if method == "chainrunner":
        return cr.sample(cr.from_pymc(model), jax.random.key(seed), None, draws,
                         num_warmup=tune, num_chains=chains, progress=False, warn=False)
    if method == "nutpie":
        global compiled
        if seed == 0:
            compiled = nutpie.compile_pymc_model(model)
        return nutpie.sample(compiled, draws=draws, tune=tune, chains=chains, seed=seed,
                             progress_bar=False, cores=os.cpu_count())
    how = "parallel" if chains <= devices else "vectorized"
    with jax.enable_x64(True):  # pm.sample's JAX path counts on PyTensor's import's x64
        return pm.sample(draws=draws, tune=tune, chains=chains, model=model,
                         random_seed=seed, nuts_sampler=method.split("_")[1],
                         progressbar=False, compute_convergence_checks=False,
                         nuts_sampler_kwargs={"chain_method": how})

times = []
for seed in (0, 1):
    t0 = time.perf_counter()
    idata = sample(seed)
    times.append(time.perf_counter() - t0)
stats = idata["sample_stats"] if hasattr(idata, "children") else idata.sample_stats
# Gradient evaluations of the kept draws (leapfrog steps; numpyro and blackjax call it
# n_steps, nutpie too), scaled to warmup + draws: the repeat's time per gradient.
grads, ess = float(stats["n_steps"].values.sum()), min_ess_bulk(idata)
print(json.dumps({"first": times[0], "repeat": times[1], "ess": ess,
                  "divergences": int(stats["diverging"].values.sum()),
                  "ess_per_grad": ess / grads,
                  "us_per_grad": 1e6 * times[1] / (grads * (draws + tune) / draws)}))
"""


def child(method: str, model: str, chains: int, opts: argparse.Namespace) -> dict:
    args = [method, model, str(chains), str(opts.devices), HERE, str(opts.draws), str(opts.tune)]
    out = subprocess.run(
        [sys.executable, "-c", CHILD, *args], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:  # reported in the table, left out of the ratios
        lines = [line for line in out.stderr.splitlines() if "Error" in line.split(":")[0]]
        print(f"{method} {model} {chains} chains failed:\n{out.stderr[-2000:]}", file=sys.stderr)
        return {"failed": lines[-1] if lines else f"exit status {out.returncode}"}
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["ess_per_s"] = result["ess"] / result["repeat"]
    return result


def medians(runs: list[dict]) -> dict:
    ok = [r for r in runs if "failed" not in r]
    if not ok:
        return {"failed": runs[0]["failed"]}
    return {k: statistics.median(r[k] for r in ok) for k in ok[0]}


def table(med: dict, methods: list[str], cases: list[tuple[str, int]]) -> str:
    """The markdown table: each method's figures, chainrunner's ratios to the best other."""
    lines = [
        "| model | chains | method | first call s | repeat s | min bulk ESS/s | divergences "
        "| ESS per 1000 gradients | µs per gradient |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for model, chains in cases:
        rows = {m: med[(model, chains, m)] for m in methods}
        peers = [m for m in methods if m != "chainrunner" and "failed" not in rows[m]]
        for m in methods:
            r = rows[m]
            if "failed" in r:
                lines.append(f"| {model} | {chains} | {m} | failed: {r['failed'][:90]} | | | | | |")
                continue
            lines.append(
                f"| {model} | {chains} | {m} | {r['first']:.2f} | {r['repeat']:.2f} | "
                f"{r['ess_per_s']:.0f} | {r['divergences']:.0f} | "
                f"{1000 * r['ess_per_grad']:.1f} | {r['us_per_grad']:.2f} |"
            )
        if peers and "failed" not in rows["chainrunner"]:
            ours = rows["chainrunner"]
            first = min(rows[m]["first"] for m in peers)
            repeat = min(rows[m]["repeat"] for m in peers)
            ess = max(rows[m]["ess_per_s"] for m in peers)
            lines.append(
                f"| {model} | {chains} | **chainrunner / best other** | "
                f"**{ours['first'] / first:.2f}** | **{ours['repeat'] / repeat:.2f}** | "
                f"**{ours['ess_per_s'] / ess:.2f}** | | | |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=1, help="processes per measurement")
    parser.add_argument("--devices", type=int, default=4, help="simulated CPU devices")
    parser.add_argument("--draws", type=int, default=1000, help="draws per chain")
    parser.add_argument("--tune", type=int, default=1000, help="warmup steps per chain")
    parser.add_argument("--quick", action="store_true", help="eight schools, 4 chains, 100+100")
    parser.add_argument("--json", help="also write the results (every process) to this file")
    opts = parser.parse_args()
    models, chain_counts = MODELS, CHAINS
    if opts.quick:
        opts.reps, opts.draws, opts.tune = 1, 100, 100
        models, chain_counts = ("eight_schools",), (4,)
    methods = [m for m in METHODS if m != "nutpie" or importlib.util.find_spec("nutpie")]
    cases = [(model, chains) for model in models for chains in chain_counts]
    got: dict[tuple, list[dict]] = {}
    for rep in range(opts.reps):
        order = methods[rep % len(methods) :] + methods[: rep % len(methods)]
        for model, chains in cases:
            for m in order:
                got.setdefault((model, chains, m), []).append(child(m, model, chains, opts))
    med = {key: medians(runs) for key, runs in got.items()}
    results = {
        "python": platform.python_version(), "jax": importlib.metadata.version("jax"),
        "devices": opts.devices, "reps": opts.reps, "draws": opts.draws, "tune": opts.tune,
        "cpu_count": os.cpu_count(), "methods": methods,
        "median": {"/".join(map(str, k)): v for k, v in med.items()},
        "runs": {"/".join(map(str, k)): v for k, v in got.items()},
    }  # fmt: skip
    print(json.dumps({k: v for k, v in results.items() if k != "runs"}, indent=1))
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(results, f, indent=1)
    print()
    print(table(med, methods, cases))


if __name__ == "__main__":
    main()
