"""Pooled Fisher adaptation: how much warmup many chains save when they adapt together.

For 64 to 4,096 chains of a PyMC model, each method runs with a warmup of ``W`` draws
for every ``W`` of a grid, then 300 draws. The figure is the gradients a user pays until
the draws meet the convergence targets (rank-normalised R-hat <= 1.01 and bulk and tail
ESS >= 400 over every free variable, checked on the first ``k`` draws for ``k`` in
``PREFIXES``): warmup gradients plus the gradients of those ``k`` draws, per chain, the
smallest over the grid. (R-hat <= 1.01 needs about 100-200 draws per chain however many
chains there are: the many-short-chains regime's nested R-hat is not measured here, as
nutpie has no superchains.) Methods:

- ``cr per chain``: ``cr.from_pymc(model)`` (``"fisher_low_rank"``, every chain its own);
- ``cr pooled``: ``cr.from_pymc(model, pooled=True)`` (one estimate from every chain);
- ``nutpie``: nutpie's low-rank adaptation (per chain), up to ``--nutpie-max`` chains.

    python benchmarks/bench_pooled.py [--models eight_schools,logistic]
        [--chains 64,256,1024] [--warmups 50,100,200,400,1000] [--json out]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
import warnings

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "2")
os.environ["TQDM_DISABLE"] = "1"

import numpy as np
from bench_fisher import make_model

DRAWS = 300
PREFIXES = (10, 25, 50, 75, 100, 150, 200, 250, 300)


def _stacked(posterior: dict) -> np.ndarray:
    """``{name: (chain, draw, ...)}`` as one ``(chain, draw, k)`` array."""
    parts = [np.asarray(v, np.float64).reshape(*np.shape(v)[:2], -1) for v in posterior.values()]
    return np.concatenate(parts, axis=2)


def draws_needed(x: np.ndarray) -> int | None:
    """The shortest prefix of ``x`` (``(chain, draw, k)``) meeting the targets, or None."""
    from chainrunner.stopping._convergence import rhat_and_ess

    for k in PREFIXES:
        r, bulk, tail = rhat_and_ess(x[:, :k])
        if np.all(r <= 1.01) and np.all(bulk >= 400) and np.all(tail >= 400):
            return k
    return None


def _groups(idata):
    get = idata.__getitem__ if hasattr(idata, "children") else lambda g: getattr(idata, g)
    return get("posterior"), get("sample_stats"), get("warmup_sample_stats")


def _measure(idata, names) -> dict:
    post, stats, warm = _groups(idata)
    x = _stacked({n: post[n].transpose("chain", "draw", ...).values for n in names})
    steps = stats["n_steps"].transpose("chain", "draw").values
    k = draws_needed(x)
    chains = x.shape[0]
    warmup = float(warm["n_steps"].values.sum()) / chains
    sampling = None if k is None else float(steps[:, :k].sum()) / chains
    return {"draws_needed": k, "warmup_grads_per_chain": warmup,
            "grads_per_chain": None if k is None else warmup + sampling}  # fmt: skip


def run_chainrunner(model, names, chains: int, warmup: int, pooled: bool, seed: int) -> dict:
    import jax

    import chainrunner as cr

    kernel = cr.from_pymc(model, pooled=True) if pooled else cr.from_pymc(model)
    t0 = time.perf_counter()
    idata = cr.sample(kernel, jax.random.key(seed), None, DRAWS, num_warmup=warmup,
                      num_chains=chains, keep_warmup=True, progress=False, warn=False)  # fmt: skip
    return {**_measure(idata, names), "seconds": time.perf_counter() - t0}


def run_nutpie(compiled, names, chains: int, warmup: int, seed: int) -> dict:
    import nutpie

    t0 = time.perf_counter()
    idata = nutpie.sample(compiled, draws=DRAWS, tune=warmup, chains=chains, seed=seed,
                          progress_bar=False, low_rank_modified_mass_matrix=True,
                          save_warmup=True)  # fmt: skip
    return {**_measure(idata, names), "seconds": time.perf_counter() - t0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="eight_schools,logistic")
    parser.add_argument("--chains", default="64,256,1024")
    parser.add_argument("--warmups", default="50,100,200,400,1000")
    parser.add_argument("--nutpie-max", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    logging.getLogger("pymc").setLevel(logging.ERROR)
    try:
        import nutpie
    except ImportError:
        nutpie = None
    rows = []
    for name in args.models.split(","):
        model = make_model(name)
        names = [v.name for v in model.free_RVs]
        compiled = None if nutpie is None else nutpie.compile_pymc_model(model)
        for chains in map(int, args.chains.split(",")):
            for warmup in map(int, args.warmups.split(",")):
                methods = [("cr per chain", False), ("cr pooled", True)]
                if compiled is not None and chains <= args.nutpie_max:
                    methods.append(("nutpie", None))
                for method, pooled in methods:
                    if pooled is None:
                        out = run_nutpie(compiled, names, chains, warmup, args.seed)
                    else:
                        out = run_chainrunner(model, names, chains, warmup, pooled, args.seed)
                    row = {"model": name, "chains": chains, "warmup": warmup, "method": method,
                           **out}  # fmt: skip
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    _table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def _table(rows: list[dict]) -> None:
    """Per model and chain count: each method's best warmup and its gradients per chain."""
    print("\n| model | chains | method | best warmup | draws needed | gradients per chain |")
    print("|---|---:|---|---:|---:|---:|")
    keys = dict.fromkeys((r["model"], r["chains"], r["method"]) for r in rows)
    for model, chains, method in keys:
        done = [r for r in rows if (r["model"], r["chains"], r["method"]) == (model, chains, method)
                and r["grads_per_chain"] is not None]  # fmt: skip
        if not done:
            print(f"| {model} | {chains} | {method} | none converged | | |")
            continue
        best = min(done, key=lambda r: r["grads_per_chain"])
        print(f"| {model} | {chains} | {method} | {best['warmup']} | {best['draws_needed']} | "
              f"{best['grads_per_chain']:.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
