"""Warmup benchmark: blackjax window / ChEES / MEADS vs numpyro's default NUTS, 2 CPU devices.

Models (posteriordb): eight schools noncentered (10 parameters); with the full run also
kidiq kidscore_interaction (5 parameters, badly scaled: needs the mass matrix). Every
method runs the same chains (8) on the same 2-device mesh through ``cr.run``. For each:
min bulk ESS (ArviZ, over all scalar parameters) per second, warmup included (wall time
of a warm ``run`` with warmup and sampling) and excluded (that minus the wall time of the
same run with one sampling step). Each configuration runs once to compile first.

Usage: ``python benchmarks/bench_warmup.py [--quick]``. Prints JSON, then a markdown table.
"""

import jax

jax.config.update("jax_num_cpu_devices", 2)

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

os.environ.setdefault("TQDM_DISABLE", "1")

import arviz as az  # noqa: E402
import blackjax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402

import chainrunner as cr  # noqa: E402

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "posteriordb", "data")


def load(name):
    with open(os.path.join(DATA, f"{name}.json")) as f:
        return json.load(f)


def eight_schools():
    d = load("eight_schools")
    y, sigma = np.asarray(d["y"], np.float32), np.asarray(d["sigma"], np.float32)

    def logdensity(x):  # x = (mu, log_tau, theta_trans[8])
        mu, log_tau, tt = x[0], x[1], x[2:]
        tau = jnp.exp(log_tau)
        lp = -0.5 * jnp.sum(tt**2) - 0.5 * (mu / 5.0) ** 2 - jnp.log1p((tau / 5.0) ** 2)
        return lp + log_tau - 0.5 * jnp.sum(((y - mu - tau * tt) / sigma) ** 2)

    def model():
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
        with numpyro.plate("J", 8):
            tt = numpyro.sample("theta_trans", dist.Normal(0.0, 1.0))
            numpyro.sample("y", dist.Normal(mu + tau * tt, sigma), obs=y)

    return logdensity, model, 10


def kidiq():
    d = load("kidiq")
    ks = np.asarray(d["kid_score"], np.float32)
    hs = np.asarray(d["mom_hs"], np.float32)
    iq = np.asarray(d["mom_iq"], np.float32)

    def logdensity(x):  # x = (beta[4], log_sigma)
        b, log_sigma = x[:4], x[4]
        sigma = jnp.exp(log_sigma)
        mean = b[0] + b[1] * hs + b[2] * iq + b[3] * hs * iq
        lp = -jnp.log1p((sigma / 2.5) ** 2) + log_sigma
        return lp - ks.size * log_sigma - 0.5 * jnp.sum(((ks - mean) / sigma) ** 2)

    def model():
        b = numpyro.sample("beta", dist.ImproperUniform(dist.constraints.real, (), (4,)))
        sigma = numpyro.sample("sigma", dist.HalfCauchy(2.5))
        mean = b[0] + b[1] * hs + b[2] * iq + b[3] * hs * iq
        numpyro.sample("kid_score", dist.Normal(mean, sigma), obs=ks)

    return logdensity, model, 5


def min_bulk_ess(draws):
    leaves = draws.values() if isinstance(draws, dict) else [draws]
    ess = []
    for x in leaves:
        x = np.asarray(x, np.float64)
        flat = x.reshape((*x.shape[:2], -1))
        ess += [
            float(np.ravel(az.ess(flat[..., j], method="bulk"))[0]) for j in range(flat.shape[-1])
        ]
    return min(ess)


def bench(name, kernel, start, num_chains, num_warmup, num_samples, mesh):
    def go(seed, n):
        t0 = time.perf_counter()
        trace = cr.run(
            kernel,
            jax.random.key(seed),
            start,
            n,
            num_warmup=num_warmup,
            num_chains=num_chains,
            mesh=mesh,
            progress=False,
            warn=False,
        )
        return trace, time.perf_counter() - t0

    go(0, num_samples)  # compile
    go(0, 1)
    _, t_warm = go(2, 1)
    trace, t_total = go(1, num_samples)
    ess = min_bulk_ess(trace.draws)
    t_sample = max(t_total - t_warm, 1e-9)
    return {
        "method": name,
        "min_bulk_ess": ess,
        "wall_total_s": t_total,
        "wall_warmup_s": t_warm,
        "ess_per_s_incl_warmup": ess / t_total,
        "ess_per_s_excl_warmup": ess / t_sample,
        "divergences": int(trace.stats["diverging"].sum()) if "diverging" in trace.stats else None,
        "step_size": trace.attrs.get("adapted_step_size"),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="eight schools only, shorter runs")
    args = parser.parse_args()
    num_chains = 8
    num_warmup, num_samples = (500, 1000) if args.quick else (1000, 2000)
    mesh = cr.chain_mesh(2)
    models = {"eight_schools_noncentered": eight_schools}
    if not args.quick:
        models["kidiq_interaction"] = kidiq
    results = []
    for model_name, build in models.items():
        logdensity, model, dim = build()
        start = 0.5 * jax.random.normal(jax.random.key(7), (num_chains, dim))
        kernels = {
            "blackjax NUTS + window": (
                cr.from_blackjax(blackjax.nuts, logdensity_fn=logdensity, adaptation="window"),
                start,
            ),
            "blackjax ChEES (dynamic HMC)": (
                cr.from_blackjax(
                    blackjax.dynamic_hmc, logdensity_fn=logdensity, adaptation="chees"
                ),
                start,
            ),
            "blackjax MEADS (GHMC)": (
                cr.from_blackjax(blackjax.ghmc, logdensity_fn=logdensity, adaptation="meads"),
                start,
            ),
            "numpyro NUTS (default)": (cr.from_numpyro(numpyro.infer.NUTS(model)), None),
        }
        for name, (kernel, init) in kernels.items():
            r = bench(name, kernel, init, num_chains, num_warmup, num_samples, mesh)
            r.update(
                model=model_name,
                chains=num_chains,
                devices=2,
                num_warmup=num_warmup,
                num_samples=num_samples,
            )
            results.append(r)
            print(json.dumps(r), flush=True)
    print()
    print(
        "| model | method | min bulk ESS | ESS/s incl. warmup | ESS/s excl. warmup | divergences |"
    )
    print("|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['model']} | {r['method']} | {r['min_bulk_ess']:.0f} | "
            f"{r['ess_per_s_incl_warmup']:.0f} | {r['ess_per_s_excl_warmup']:.0f} | "
            f"{r['divergences']} |"
        )


if __name__ == "__main__":
    main()
