"""chainrunner vs numpyro.infer.MCMC on two models, 2 CPU devices.

Models: eight schools (noncentered) and a synthetic 5000 x 20 logistic regression.
Chains: 8 and 64, on a 2-device mesh. For each (model, chains, method): wall time of a
warm run (compiled programs reused: each method runs once before timing, then the timed
repetitions are interleaved), and min bulk ESS / s over all scalar parameters (ArviZ).
numpyro's ``chain_method='sequential'`` compiles per call, so it is timed end to end; for
``'parallel'`` numpyro needs ``num_chains <= devices`` and otherwise falls back to
sequential (with a warning), so it is run only where it can be parallel.

Usage: ``python benchmarks/bench_numpyro.py [--quick] [--reps N]``. Prints JSON, then a
markdown table.
"""

import jax

jax.config.update("jax_num_cpu_devices", 2)

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

os.environ.setdefault("TQDM_DISABLE", "1")

import arviz as az  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from numpyro.infer import MCMC, NUTS  # noqa: E402

import chainrunner as cr  # noqa: E402


def eight_schools(sigma, y=None):
    J = sigma.shape[0]
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("J", J):
        theta_trans = numpyro.sample("theta_trans", dist.Normal(0.0, 1.0))
        theta = numpyro.deterministic("theta", mu + tau * theta_trans)
        numpyro.sample("obs", dist.Normal(theta, sigma), obs=y)


def logistic(X, y):
    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]))
    alpha = numpyro.sample("alpha", dist.Normal(0.0, 1.0))
    numpyro.sample("y", dist.Bernoulli(logits=alpha + X @ beta), obs=y)


def problems():
    y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0], np.float32)
    sigma = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0], np.float32)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(5000, 20)).astype(np.float32)
    beta = rng.normal(size=20).astype(np.float32) * 0.5
    yl = (rng.uniform(size=5000) < 1 / (1 + np.exp(-(X @ beta + 0.3)))).astype(np.float32)
    return {
        "eight_schools": (eight_schools, (sigma,), {"y": y}),
        "logistic_5000x20": (logistic, (X, yl), {}),
    }


def min_bulk_ess(draws: dict) -> float:
    ess = []
    for x in draws.values():
        x = np.asarray(x, np.float64)
        flat = x.reshape((*x.shape[:2], -1))
        ess += [float(az.ess(flat[..., j], method="bulk")) for j in range(flat.shape[-1])]
    return min(ess)


def make_runner(method, model, args, kwargs, chains, warmup, samples, mesh):
    if method == "chainrunner":
        kernel = cr.from_numpyro(NUTS(model), model_args=args, model_kwargs=kwargs)

        def run(seed):
            trace = cr.run(
                kernel, jax.random.key(seed), None, samples, num_warmup=warmup,
                num_chains=chains, mesh=mesh, progress=False,
            )  # fmt: skip
            return trace.draws

        return run
    chain_method = method.split("_")[1]
    mcmc = MCMC(
        NUTS(model), num_warmup=warmup, num_samples=samples, num_chains=chains,
        chain_method=chain_method, progress_bar=False, jit_model_args=True,
    )  # fmt: skip

    def run(seed):
        mcmc.run(jax.random.key(seed), *args, **kwargs)
        draws = mcmc.get_samples(group_by_chain=True)
        jax.block_until_ready(draws)
        return draws

    return run


def emit(results, name, chains, times, ess, first, warmup, samples):
    for m in times:
        wall = float(np.median(times[m]))
        e = float(np.median(ess[m]))
        row = {
            "model": name, "chains": chains, "devices": 2, "method": m,
            "warmup": warmup, "samples": samples, "wall_s": round(wall, 3),
            "first_call_s": round(first[m], 3), "min_bulk_ess": round(e, 1),
            "min_bulk_ess_per_s": round(e / wall, 1),
        }  # fmt: skip
        results.append(row)
        print("#", json.dumps(row), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one repetition")
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions")
    parser.add_argument("--chains", default=None, help="comma-separated chain counts")
    parser.add_argument(
        "--sequential-max-chains",
        type=int,
        default=8,
        help="run numpyro's sequential method only up to this many chains (it compiles per "
        "chain; at 64 chains it exhausted this machine's memory maps)",
    )
    opts = parser.parse_args()
    warmup, samples = (200, 200) if opts.quick else (1000, 1000)
    reps = opts.reps or (1 if opts.quick else 3)
    chain_counts = (8,) if opts.quick else (8, 64)
    if opts.chains:
        chain_counts = tuple(int(c) for c in opts.chains.split(","))
    mesh = cr.chain_mesh(2)
    ndev = len(jax.devices())
    results = []
    for name, (model, args, kwargs) in problems().items():
        for chains in chain_counts:
            methods = ["chainrunner", "numpyro_vectorized"]
            if chains <= ndev:
                methods.append("numpyro_parallel")
            runners = {
                m: make_runner(m, model, args, kwargs, chains, warmup, samples, mesh)
                for m in methods
            }
            first = {}
            for m, run in runners.items():  # warm: compile once
                t0 = time.perf_counter()
                run(0)
                first[m] = time.perf_counter() - t0
            times = {m: [] for m in runners}
            ess = {m: [] for m in runners}
            for rep in range(reps):  # interleaved timed repetitions
                for m, run in runners.items():
                    t0 = time.perf_counter()
                    draws = run(rep + 1)
                    times[m].append(time.perf_counter() - t0)
                    ess[m].append(min_bulk_ess(draws))
            # numpyro sequential: end to end (it compiles per call).
            if chains > opts.sequential_max_chains:
                emit(results, name, chains, times, ess, first, warmup, samples)
                continue
            seq = make_runner(
                "numpyro_sequential", model, args, kwargs, chains, warmup, samples, mesh
            )
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                draws = seq(1)
            times["numpyro_sequential (end to end)"] = [time.perf_counter() - t0]
            ess["numpyro_sequential (end to end)"] = [min_bulk_ess(draws)]
            first["numpyro_sequential (end to end)"] = times["numpyro_sequential (end to end)"][0]
            emit(results, name, chains, times, ess, first, warmup, samples)
    print(json.dumps({"jax": jax.__version__, "numpyro": numpyro.__version__,
                      "results": results}, indent=1))  # fmt: skip
    print()
    print("| model | chains | method | wall s (warm) | first call s | min bulk ESS | ESS/s |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['model']} | {r['chains']} | {r['method']} | {r['wall_s']} | "
            f"{r['first_call_s']} | {r['min_bulk_ess']} | {r['min_bulk_ess_per_s']} |"
        )


if __name__ == "__main__":
    main()
