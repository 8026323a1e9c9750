"""Time to a posterior: a PyMC user's whole process, phase by phase, against nutpie and
``pm.sample(nuts_sampler="numpyro")``.

Each measurement is one fresh process that imports, builds one of ``bench_fisher.py``'s four
PyMC models, samples 4 chains x (1000 tune + 1000 draws) and returns ArviZ data:

- ``chainrunner``: ``cr.sample(cr.from_pymc(model), key, None, 1000, num_warmup=1000,
  num_chains=4)``, the defaults (diagnostics on; the timings read from the posterior's
  attrs);
- ``nutpie``: ``nutpie.sample(nutpie.compile_pymc_model(model), ...)``, its defaults;
- ``pymc_numpyro``: ``pm.sample(nuts_sampler="numpyro")``.

``first``: every cache empty (chainrunner's program cache, PyTensor's compile folder,
numba's cache: fresh folders); ``second``: the same script again, its caches as the first
left them. The process runs on ``--devices`` CPU devices (2: the machine's cores). Printed
per process: its wall time (spawn to exit, measured by the parent) and its phases
(imports, model, front end, compile, sampling with warmup, the rest: diagnostics and
ArviZ); the figure is the smallest of bulk and tail ESS over the free variables per second
of the whole process, and, per gradient of the draws (``sample_stats.n_steps``), against
nutpie's. Round ``r`` (``--reps``) gives every tool seed ``r``, so the
medians average the ESS of several seeds. Ratios: chainrunner over the better of nutpie
and PyMC's numpyro path, per model, from processes interleaved in one run.

    python benchmarks/bench_time_to_posterior.py [--reps 1] [--models ...] [--json out]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = ("eight_schools", "radon_like", "dense_gaussian", "logistic")
METHODS = ("chainrunner", "nutpie", "pymc_numpyro")
CHAINS, TUNE, DRAWS = 4, 1000, 1000


def _min_ess(idata, names) -> float:
    import arviz as az
    import numpy as np

    post = idata["posterior"] if hasattr(idata, "children") else idata.posterior
    smallest = np.inf
    for n in names:
        x = np.asarray(post[n].transpose("chain", "draw", ...).values, np.float64)
        x = x.reshape((*x.shape[:2], -1))
        for j in range(x.shape[-1]):
            bulk = az.ess(x[..., j], method="bulk")
            tail = az.ess(x[..., j], method="tail", prob=(0.05, 0.95))  # arviz 1 asks for it
            for e in (bulk, tail):
                smallest = min(smallest, float(np.asarray(e).ravel()[0]))
    return smallest


def child(model_name: str, method: str, t_start: float, seed: int = 0) -> dict:
    """One process's work, phase by phase (``t_start``: the parent's clock at spawn;
    ``seed``: every tool's seed, the round's number)."""
    t0 = time.time()
    import pymc as pm

    if method == "chainrunner":
        import jax

        import chainrunner as cr
    elif method == "nutpie":
        import nutpie
    sys.path.insert(0, HERE)
    from bench_fisher import make_model

    phases = {"imports": time.time() - t_start}
    t = time.time()
    model = make_model(model_name)
    names = [v.name for v in model.free_RVs]
    phases["model"] = time.time() - t
    t = time.time()
    if method == "chainrunner":
        kernel = cr.from_pymc(model)
        phases["front_end"] = time.time() - t
        t = time.time()
        idata = cr.sample(kernel, jax.random.key(seed), None, DRAWS, num_warmup=TUNE,
                          num_chains=CHAINS, progress=False)  # fmt: skip
        total = time.time() - t
        attrs = (idata["posterior"] if hasattr(idata, "children") else idata.posterior).attrs
        phases["compile"] = attrs["compile_time"]
        phases["sampling"] = attrs["sampling_time"]
        phases["rest"] = total - phases["compile"] - phases["sampling"]
    elif method == "nutpie":
        compiled = nutpie.compile_pymc_model(model)
        phases["front_end"] = time.time() - t
        t = time.time()
        idata = nutpie.sample(compiled, draws=DRAWS, tune=TUNE, chains=CHAINS, seed=seed,
                              progress_bar=False)  # fmt: skip
        phases["sampling"] = time.time() - t
    else:
        idata = pm.sample(draws=DRAWS, tune=TUNE, chains=CHAINS, model=model, random_seed=seed,
                          nuts_sampler="numpyro", progressbar=False)  # fmt: skip
        phases["sampling"] = time.time() - t
    t = time.time()
    ess = _min_ess(idata, names)
    return {"phases": phases, "ess": ess, "grads": _gradients(idata),
            "ess_time": time.time() - t, "since_start": t - t0}  # fmt: skip


def _gradients(idata) -> float | None:
    """The draws' gradient evaluations: the sum of ``sample_stats.n_steps`` (leapfrog steps,
    each one gradient), or ``None`` where the tool does not record it."""
    stats = idata["sample_stats"] if hasattr(idata, "children") else idata.sample_stats
    return float(stats["n_steps"].values.sum()) if "n_steps" in stats else None


def _environment(cache: str, devices: int) -> dict:
    env = dict(os.environ)
    env.update({
        "CHAINRUNNER_CACHE_DIR": os.path.join(cache, "chainrunner"),
        "PYTENSOR_FLAGS": f"compiledir={os.path.join(cache, 'pytensor')}",
        "NUMBA_CACHE_DIR": os.path.join(cache, "numba"),
        "JAX_NUM_CPU_DEVICES": str(devices),
        "TQDM_DISABLE": "1",
        "PYTHONWARNINGS": "ignore",
    })  # fmt: skip
    return env


def measure(model: str, method: str, cache: str, devices: int, seed: int) -> dict:
    """One whole process: wall time from spawn to exit, and what it reported."""
    code = (
        "import sys, json, time; sys.path.insert(0, %r); import bench_time_to_posterior as b; "
        "print('RESULT' + json.dumps(b.child(%r, %r, %r, %r)))"
    )
    t0 = time.time()
    out = subprocess.run(
        [sys.executable, "-c", code % (HERE, model, method, t0, seed)],
        env=_environment(cache, devices), capture_output=True, text=True, check=False,
    )  # fmt: skip
    wall = time.time() - t0
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{model} {method} failed:\n{out.stderr[-3000:]}")
    row = json.loads(lines[-1][len("RESULT") :])
    # The process's own seconds: spawn to exit, less the benchmark's own ESS computation.
    row["wall"] = wall - row.pop("ess_time")
    row["ess_per_s"] = row["ess"] / row["wall"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--json")
    args = parser.parse_args()
    methods = args.methods.split(",")
    rows = []
    for rep in range(args.reps):
        for model in args.models.split(","):
            order = methods[rep % len(methods) :] + methods[: rep % len(methods)]
            for method in order:
                cache = tempfile.mkdtemp(prefix="ttp-")
                try:
                    for run in ("first", "second"):
                        row = measure(model, method, cache, args.devices, rep)
                        row.update(model=model, method=method, run=run, rep=rep)
                        rows.append(row)
                        print(json.dumps(row), flush=True)
                finally:
                    shutil.rmtree(cache, ignore_errors=True)
    _table(rows, methods)
    if args.json:
        import jax

        meta = {"python": sys.version.split()[0], "jax": jax.__version__,
                "devices": args.devices, "reps": args.reps}  # fmt: skip
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


def _median(rows: list, **where) -> dict | None:
    found = [r for r in rows if all(r[k] == v for k, v in where.items())]
    if not found:
        return None
    phases = {k: statistics.median(r["phases"].get(k, 0.0) for r in found)
              for k in found[0]["phases"]}  # fmt: skip
    return {"wall": statistics.median(r["wall"] for r in found), "phases": phases,
            "ess_per_s": statistics.median(r["ess_per_s"] for r in found)}  # fmt: skip


def _table(rows: list, methods: list) -> None:
    models = list(dict.fromkeys(r["model"] for r in rows))
    print("\n| model | run | method | process s | ESS/s | phases (s) |")
    print("|---|---|---|---:|---:|---|")
    for model in models:
        for run in ("first", "second"):
            for m in methods:
                r = _median(rows, model=model, run=run, method=m)
                if r is not None:
                    ph = ", ".join(f"{k} {v:.2f}" for k, v in r["phases"].items())
                    print(
                        f"| {model} | {run} | {m} | {r['wall']:.2f} | {r['ess_per_s']:.0f} | {ph} |"
                    )
    print("\nchainrunner's ESS per process-second over the better of nutpie and pymc_numpyro;")
    print("its ESS per gradient of the draws over nutpie's (the first processes' seeds):")
    print("| model | first | second | per gradient |\n|---|---:|---:|---:|")
    per_gradient = gradient_ratios(rows)
    for model, cells in ratios(rows).items():
        if cells:
            grad = per_gradient.get(model)
            print(f"| {model} | " + " | ".join(f"{c:.2f}" for c in cells.values())
                  + f" | {'-' if grad is None else f'{grad:.2f}'} |")  # fmt: skip


def gradient_ratios(rows: list) -> dict:
    """``{model: r}``: chainrunner's median ESS per gradient of the draws over nutpie's
    (first processes: every round's seed once), where both recorded their gradients."""
    out = {}
    for model in dict.fromkeys(r["model"] for r in rows):
        per = {}
        for method in ("chainrunner", "nutpie"):
            found = [
                r["ess"] / r["grads"]
                for r in rows
                if (r["model"], r["method"], r["run"]) == (model, method, "first")
                and r.get("grads")
            ]
            if found:
                per[method] = statistics.median(found)
        if len(per) == 2:
            out[model] = per["chainrunner"] / per["nutpie"]
    return out


def ratios(rows: list) -> dict:
    """``{model: {"first": r, "second": r}}``: chainrunner's median ESS per process-second
    over the better of the other methods' medians (the docs' table reads this)."""
    methods = list(dict.fromkeys(r["method"] for r in rows))
    out = {}
    for model in dict.fromkeys(r["model"] for r in rows):
        out[model] = {}
        for run in ("first", "second"):
            ours = _median(rows, model=model, run=run, method="chainrunner")
            peers = [_median(rows, model=model, run=run, method=m) for m in methods]
            peers = [p for m, p in zip(methods, peers, strict=True) if p and m != "chainrunner"]
            if ours is None or not peers:  # (a run of one method: no ratio)
                continue
            best = max(p["ess_per_s"] for p in peers)
            out[model][run] = ours["ess_per_s"] / best
    return out


if __name__ == "__main__":
    main()
