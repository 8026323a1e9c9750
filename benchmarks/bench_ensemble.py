"""Ensemble samplers: chainrunner over 1, 2 and 8 devices against numpyro and emcee.

The same algorithm three ways: numpyro's ``AIES`` (the stretch move, emcee's default)
run by ``cr.run`` on meshes of 1, 2 and 8 simulated CPU devices (the log densities of
the moving half spread over the devices), by numpyro's own
``MCMC(..., chain_method="vectorized")`` sampler on one device (its kernel's ``init``
and ``sample`` in one jitted scan, compiled once: ``MCMC.run`` compiles again at every
call), and by emcee's
``EnsembleSampler(..., vectorize=True)`` (numpy, where emcee installs). Also numpyro's
``ESS`` (slice moves), chainrunner against numpyro vectorized (emcee has none).

Two targets: a 10-d correlated Gaussian (a cheap log density, where moving the
walkers is most of the work) and a logistic regression with 200 rows and 10
predictors (a log density about 20 times dearer). 64, 512 and 4096 walkers; 100 warmup
steps and 200 kept (emcee: 300 steps, the first 100 dropped). Every program is
compiled first; then the methods run in turn, ``--reps`` times, in one process, and
each method's median wall time gives its draws per second (walkers x kept steps / s)
and min ESS per second (``min_ess``: from the autocorrelation of the ensemble mean,
which neither the walkers' dependence nor numpyro's relabelling of them distorts).
Ratios are against numpyro vectorized, the baseline.

Run: python benchmarks/bench_ensemble.py [--quick] [--reps N]
"""

import jax

jax.config.update("jax_num_cpu_devices", 8)

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import arviz as az  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from numpyro.infer import AIES, ESS  # noqa: E402

import chainrunner as cr  # noqa: E402

try:
    import emcee
except ImportError:  # emcee is optional: its rows are left out
    emcee = None

WARMUP, KEPT = 100, 200


def targets(quick):
    """``name -> (numpyro model, numpy log density of a (walkers, dim) batch, dim)``."""
    rng = np.random.default_rng(0)
    a = rng.normal(size=(10, 10))
    cov = a @ a.T / 10 + np.eye(10)
    prec = np.linalg.inv(cov)

    def gauss():
        numpyro.sample("x", dist.MultivariateNormal(jnp.zeros(10), jnp.asarray(cov)))

    def gauss_np(x):
        return -0.5 * np.einsum("wi,ij,wj->w", x, prec, x)

    rows = 50 if quick else 200
    X = rng.normal(size=(rows, 10))
    y = (X @ rng.normal(size=10) + rng.normal(size=rows) > 0).astype(np.float64)
    Xj, yj = jnp.asarray(X, jnp.float32), jnp.asarray(y, jnp.float32)

    def logistic():
        beta = numpyro.sample("x", dist.Normal(jnp.zeros(10), 1.0).to_event(1))
        numpyro.sample("y", dist.Bernoulli(logits=Xj @ beta), obs=yj)

    def logistic_np(b):
        z = b @ X.T
        return -0.5 * np.sum(b**2, axis=1) + np.sum(y * z - np.logaddexp(0, z), axis=1)

    return {"gauss10": (gauss, gauss_np, 10), "logistic200x10": (logistic, logistic_np, 10)}


def min_ess(x):
    """Smallest ESS over the parameters, from the ensemble mean, of draws ``(walker, draw, dim)``.

    Walkers are not independent, and numpyro's ``randomize_split`` relabels them every
    step, so ESS with walkers as chains would be neither honest nor comparable. The
    error of an ensemble average is set by the autocorrelation of the mean over walkers
    at each step (emcee's advice): ESS = posterior variance / MCSE^2, with the MCSE of
    that series. It does not depend on how walkers are labelled.
    """
    x = np.asarray(x, np.float64)
    means = x.mean(axis=0)  # (draw, dim)
    out = []
    for j in range(x.shape[-1]):
        series = means[:, j][None, :]
        ess_series = float(np.ravel(az.ess(series))[0])
        out.append(x[..., j].var() * ess_series / max(series.var(), 1e-300))
    return float(min(out))


def chainrunner_method(kernel, walkers, devices):
    mesh = cr.chain_mesh(devices)

    def go(seed):
        t = cr.run(kernel, jax.random.key(seed), None, KEPT, num_warmup=WARMUP,
                   num_chains=walkers, mesh=mesh, progress=False, warn=False)  # fmt: skip
        return t.draws["x"]

    return go


def numpyro_method(kernel, walkers):
    """numpyro's vectorized sampler at its fastest: its kernel's ``init`` and ``sample``
    in one jitted ``lax.scan``, compiled once (``MCMC.run`` compiles again at every
    call)."""

    def loop(key):
        state = kernel.init(jax.random.split(key, walkers), WARMUP, None, (), {})

        def body(s, _):
            s = kernel.sample(s, (), {})
            return s, s.z["x"]

        return jax.lax.scan(body, state, None, length=WARMUP + KEPT)[1][WARMUP:]

    run = jax.jit(loop)

    def go(seed):
        return np.swapaxes(np.asarray(run(jax.random.key(seed))), 0, 1)

    return go


def emcee_method(log_prob, walkers, dim):
    def go(seed):
        rng = np.random.default_rng(seed)
        sampler = emcee.EnsembleSampler(walkers, dim, log_prob, vectorize=True)
        sampler.run_mcmc(rng.uniform(-2, 2, size=(walkers, dim)), WARMUP + KEPT)
        return np.swapaxes(sampler.get_chain(discard=WARMUP), 0, 1)

    return go


def methods(name, model, log_prob, dim, walkers, quick):
    out = {}
    for label, make in (("aies", AIES), ("ess", ESS)):
        out[(label, "numpyro vectorized")] = numpyro_method(make(model), walkers)
        kernel = make(model)
        for d in (1, 2) if quick else (1, 2, 8):
            out[(label, f"chainrunner {d} dev")] = chainrunner_method(kernel, walkers, d)
    if emcee is not None:
        out[("aies", "emcee (numpy)")] = emcee_method(log_prob, walkers, dim)
    return out


def measure(fns, reps):
    """Compile/warm every method, then ``reps`` interleaved timed runs; median seconds."""
    times = {key: [] for key in fns}
    draws = {}
    for key, fn in fns.items():
        draws[key] = fn(0)
    for rep in range(reps):
        for key, fn in fns.items():
            t0 = time.perf_counter()
            draws[key] = fn(rep + 1)
            times[key].append(time.perf_counter() - t0)
    return {key: (statistics.median(v), draws[key]) for key, v in times.items()}


def rows_for(name, target, walkers, reps, quick):
    model, log_prob, dim = target
    fns = methods(name, model, log_prob, dim, walkers, quick)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        timed = measure(fns, reps)
    rows = []
    for (algo, method), (seconds, x) in timed.items():
        base_seconds, base_x = timed[(algo, "numpyro vectorized")]
        rate, ess_rate = walkers * KEPT / seconds, min_ess(x) / seconds
        base_rate, base_ess = walkers * KEPT / base_seconds, min_ess(base_x) / base_seconds
        rows.append({
            "target": name, "walkers": walkers, "algorithm": algo, "method": method,
            "seconds": seconds, "draws_per_s": rate, "min_ess_per_s": ess_rate,
            "draws_ratio": rate / base_rate, "ess_ratio": ess_rate / base_ess,
        })  # fmt: skip
    return rows


def table(rows):
    lines = [
        "| target | walkers | algorithm | method | draws/s | min ESS/s | draws/s ÷ numpyro "
        "| min ESS/s ÷ numpyro |",
        "|---|---:|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['target']} | {r['walkers']} | {r['algorithm']} | {r['method']} | "
            f"{r['draws_per_s']:.3g} | {r['min_ess_per_s']:.3g} | {r['draws_ratio']:.2f} | "
            f"{r['ess_ratio']:.2f} |"
        )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    reps = 1 if args.quick else args.reps
    walker_counts = (64,) if args.quick else (64, 512, 4096)
    rows = []
    for name, target in targets(args.quick).items():
        for walkers in walker_counts:
            new = rows_for(name, target, walkers, reps, args.quick)
            print("\n".join(table(new).splitlines()[2:]), flush=True)  # as they come
            rows += new
    info = {
        "machine": platform.processor() or platform.machine(),
        "jax": jax.__version__,
        "numpyro": numpyro.__version__,
        "emcee": getattr(emcee, "__version__", None),
        "reps": reps,
    }
    print(json.dumps({"info": info, "rows": rows}, indent=1))
    print(table(rows))


if __name__ == "__main__":
    main()
