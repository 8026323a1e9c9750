"""Warmup benchmark: blackjax window / ChEES / MEADS vs numpyro's default NUTS, 2 CPU devices.

Models (posteriordb): eight schools noncentered (10 parameters); with the full run also
kidiq kidscore_interaction (5 parameters, badly scaled: needs the mass matrix). Every
method runs the same chains (8) on the same 2-device mesh through ``cr.run``. For each:
min bulk ESS (ArviZ, over all scalar parameters) per second, warmup included (wall time
of a warm ``run`` with warmup and sampling) and excluded (that minus the wall time of the
same run with one sampling step). Each configuration runs once to compile first.

With ``--scaling``: the cross-chain warmup alone (ChEES and MEADS, 256 chains on a 50-d
correlated Gaussian, 200 warmup steps), ``layout="replicated"`` (blackjax's run under plain
jit, every device all chains) vs ``layout="sharded"`` (the default: the chains spread over
the devices under shard_map) on 1, 2, 4 and 8 simulated CPU devices. Each configuration
runs once to compile; then ``--reps`` interleaved repetitions, and the median of the
warmup's wall time (``trace.attrs["warmup_time"]``, compile excluded) is reported, with
the ratio sharded / replicated per device count. Simulated devices share the machine's
cores: beyond the physical core count no speed-up is expected. ``--logistic``: the same
on 1 and 2 devices for a logistic regression with 2000 rows, whose gradient is the cost.

Usage: ``python benchmarks/bench_warmup.py [--quick] [--scaling [--reps N]]``. Prints JSON,
then a markdown table.
"""

import jax

jax.config.update("jax_num_cpu_devices", 8)  # the ESS section uses 2 of them

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


def correlated_gaussian(dim, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(dim, dim))
    cov = a @ a.T / dim + np.eye(dim)
    precision = jnp.asarray(np.linalg.inv(cov), jnp.float32)
    return lambda x: -0.5 * x @ precision @ x


def logistic_regression(dim, rows=2000, seed=0):
    """A dear gradient: logistic regression, ``rows`` x ``dim`` data, normal prior."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(rows, dim)) / np.sqrt(dim)
    y = (X @ rng.normal(size=dim) + rng.logistic(size=rows) > 0).astype(np.float32)
    X, y = jnp.asarray(X, jnp.float32), jnp.asarray(y)

    def logdensity(beta):
        z = X @ beta
        return -0.5 * beta @ beta + jnp.sum(y * z - jnp.logaddexp(0.0, z))

    return logdensity


def scaling(num_chains=256, dim=50, num_warmup=200, reps=3, devices=(1, 2, 4, 8),
            target="gaussian"):  # fmt: skip
    """Cross-chain warmup seconds, replicated vs sharded layout, per device count."""
    if target == "gaussian":
        logdensity = correlated_gaussian(dim)
    else:
        logdensity = logistic_regression(dim)
    start = jax.random.normal(jax.random.key(7), (num_chains, dim))
    factories = {"chees": blackjax.dynamic_hmc, "meads": blackjax.ghmc}
    configs = [(a, layout, d) for a in factories for layout in ("replicated", "sharded")
               for d in devices]  # fmt: skip

    def go(config):
        a, layout, d = config
        k = cr.from_blackjax(factories[a], logdensity_fn=logdensity, adaptation=a, layout=layout)
        trace = cr.run(k, jax.random.key(0), start, 1, num_warmup=num_warmup,
                       mesh=cr.chain_mesh(d), progress=False, warn=False)  # fmt: skip
        return trace.attrs["warmup_time"]

    first = {c: go(c) for c in configs}  # compile
    times = {c: [] for c in configs}
    for _ in range(reps):  # interleaved
        for c in configs:
            times[c].append(go(c))
    rows = []
    for a, layout, d in configs:
        med = float(np.median(times[(a, layout, d)]))
        rows.append({"benchmark": "cross_chain_warmup_scaling", "adaptation": a,
                     "layout": layout, "devices": d, "chains": num_chains, "dim": dim,
                     "num_warmup": num_warmup, "reps": reps, "median_s": med,
                     "target": target,
                     "first_call_s": first[(a, layout, d)], "jax": jax.__version__})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    return rows


def scaling_table(rows):
    """Markdown: warmup seconds per device count, replicated vs sharded, and the ratio."""
    by = {(r["adaptation"], r["layout"], r["devices"]): r["median_s"] for r in rows}
    lines = [
        "| adaptation | devices | replicated s | sharded s | sharded / replicated |"
        " sharded speed-up vs 1 device |",
        "|---|---|---|---|---|---|",
    ]
    for a, _, d in sorted({k for k in by if k[1] == "sharded"}):
        rep, sh = by[(a, "replicated", d)], by[(a, "sharded", d)]
        lines.append(
            f"| {a} | {d} | {rep:.3f} | {sh:.3f} | {sh / rep:.2f} | "
            f"{by[(a, 'sharded', 1)] / sh:.2f} |"
        )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="eight schools only, shorter runs")
    parser.add_argument("--scaling", action="store_true", help="cross-chain warmup scaling only")
    parser.add_argument("--reps", type=int, default=3, help="repetitions for --scaling")
    parser.add_argument("--logistic", action="store_true", help="--scaling, dear gradients")
    args = parser.parse_args()
    if args.scaling:
        kw = {"num_chains": 64, "num_warmup": 100} if args.quick else {}
        if args.logistic:
            kw = {**kw, "target": "logistic", "devices": (1, 2)}
        rows = scaling(reps=args.reps, **kw)
        print()
        print(scaling_table(rows))
        return
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
