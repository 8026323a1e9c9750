"""numpyro models: nutpie's adaptation through ``from_numpyro(..., adaptation=)`` vs numpyro's MCMC.

Four models written as numpyro's docs write them (eight schools non-centred with
``TransformReparam``, a radon-like hierarchical model with 85 groups, a 100-d Gaussian
with a dense covariance, a logistic regression with 12 correlated predictors),
4 chains x (1000 warmup + 1000 draws) on 4 simulated CPU devices, sampled by

- ``cr.from_numpyro(NUTS(model), ..., adaptation="fisher_low_rank")``: blackjax's NUTS on
  numpyro's log density with nutpie's low-rank Fisher adaptation (``"cr fisher_low_rank"``);
- ``cr.from_numpyro(NUTS(model), ...)``: numpyro's own NUTS and adaptation, chains on
  chainrunner's mesh (``"cr numpyro"``);
- numpyro's ``MCMC(NUTS(model), chain_method="parallel")``, with its diagonal
  (``"numpyro diag"``) and dense (``dense_mass=True``: ``"numpyro dense"``) mass matrix:
  the peer a numpyro user would pick.

The figures: the smallest bulk ESS over every latent scalar per 1000 gradients of the
draws, the same with the warmup gradients included, and per second of the whole call
(warmup included, compile excluded: every method is called once before it is timed).
The mean over ``--seeds`` seeds; methods interleaved within each seed.

    python benchmarks/bench_numpyro_fisher.py [--seeds 2] [--models ...] [--json out]
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "4")
os.environ["TQDM_DISABLE"] = "1"

import numpy as np

CHAINS, TUNE, DRAWS = 4, 1000, 1000
MODELS = ("eight_schools", "radon_like", "dense_gaussian", "logistic")
METHODS = ("cr fisher_low_rank", "cr numpyro", "numpyro diag", "numpyro dense")


def make_model(name: str):
    """``(model, model_args, model_kwargs, latent site names)`` for ``name``."""
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer.reparam import TransformReparam

    if name == "eight_schools":
        y = np.array([28.0, 8, -3, 7, -1, 1, 18, 12])
        sigma = np.array([15.0, 10, 16, 11, 9, 11, 10, 18])

        def eight_schools(J, sigma, y=None):
            mu = numpyro.sample("mu", dist.Normal(0, 5))
            tau = numpyro.sample("tau", dist.HalfCauchy(5))
            with numpyro.plate("J", J):
                with numpyro.handlers.reparam(config={"theta": TransformReparam()}):
                    theta = numpyro.sample(
                        "theta",
                        dist.TransformedDistribution(
                            dist.Normal(0.0, 1.0), dist.transforms.AffineTransform(mu, tau)
                        ),
                    )
                numpyro.sample("obs", dist.Normal(theta, sigma), obs=y)

        return eight_schools, (8, sigma), {"y": y}, ("mu", "tau", "theta_base")
    if name == "radon_like":
        rng = np.random.default_rng(3)
        groups = 85
        county = rng.integers(0, groups, 919)
        floor = rng.integers(0, 2, 919).astype(float)
        a = rng.normal(1.5, 0.3, groups)
        y = a[county] - 0.6 * floor + rng.normal(0, 0.7, 919)

        def radon(county, floor, y=None):
            mu_a = numpyro.sample("mu_a", dist.Normal(0, 10))
            sigma_a = numpyro.sample("sigma_a", dist.HalfNormal(5))
            with numpyro.plate("county", groups):
                a = numpyro.sample("a", dist.Normal(mu_a, sigma_a))
            b = numpyro.sample("b", dist.Normal(0, 10))
            sigma_y = numpyro.sample("sigma_y", dist.HalfNormal(5))
            with numpyro.plate("obs", county.shape[0]):
                numpyro.sample("y", dist.Normal(a[county] + b * floor, sigma_y), obs=y)

        return radon, (county, floor), {"y": y}, ("mu_a", "sigma_a", "a", "b", "sigma_y")
    if name == "dense_gaussian":
        rng = np.random.default_rng(0)
        d = 100
        q, _ = np.linalg.qr(rng.normal(size=(d, d)))
        cov = q @ np.diag(np.geomspace(0.01, 10.0, d)) @ q.T

        def gaussian(cov):
            numpyro.sample("x", dist.MultivariateNormal(np.zeros(d), covariance_matrix=cov))

        return gaussian, (cov,), {}, ("x",)
    if name == "logistic":
        rng = np.random.default_rng(0)
        n, k = 200, 12
        corr = 0.9 ** np.abs(np.subtract.outer(np.arange(k), np.arange(k)))
        X = rng.multivariate_normal(np.zeros(k), corr, size=n)
        beta = rng.normal(0, 1, k)
        yobs = rng.binomial(1, 1 / (1 + np.exp(-(X @ beta))))

        def logistic(X, y=None):
            b = numpyro.sample("b", dist.Normal(0, 2).expand([X.shape[1]]))
            numpyro.sample("y", dist.Bernoulli(logits=X @ b), obs=y)

        return logistic, (X,), {"y": yobs}, ("b",)
    raise ValueError(name)


def min_ess_bulk(posterior) -> float:
    """The smallest bulk ESS over every scalar of ``posterior`` (``{name: (chain, draw, ...)}``)."""
    import arviz as az

    smallest = np.inf
    for x in posterior.values():
        x = np.asarray(x, dtype=np.float64)
        x = x.reshape((*x.shape[:2], -1))
        for j in range(x.shape[-1]):
            smallest = min(smallest, float(np.asarray(az.ess(x[..., j], method="bulk")).ravel()[0]))
    return smallest


class Runner:
    """One model's samplers."""

    def __init__(self, name: str):
        self.model, self.args, self.kwargs, self.names = make_model(name)

    def chainrunner(self, seed: int, adaptation: str | None):
        import jax
        from numpyro.infer import NUTS

        import chainrunner as cr

        options = {} if adaptation is None else {"adaptation": adaptation}
        kernel = cr.from_numpyro(NUTS(self.model), model_args=self.args,
                                 model_kwargs=self.kwargs, **options)  # fmt: skip
        trace = cr.run(kernel, jax.random.key(seed), None, DRAWS, num_warmup=TUNE,
                       num_chains=CHAINS, keep_warmup=True, progress=False, warn=False)  # fmt: skip
        draws = {n: trace.draws[n] for n in self.names}
        grads = (float(trace.stats["n_steps"].sum()), float(trace.warmup_stats["n_steps"].sum()))
        return draws, grads

    def numpyro(self, seed: int, dense: bool):
        import jax
        from numpyro.infer import MCMC, NUTS

        mcmc = MCMC(NUTS(self.model, dense_mass=dense), num_warmup=TUNE, num_samples=DRAWS,
                    num_chains=CHAINS, chain_method="parallel", progress_bar=False)  # fmt: skip
        mcmc.warmup(jax.random.key(seed), *self.args, extra_fields=("num_steps",),
                    collect_warmup=True, **self.kwargs)  # fmt: skip
        warm = float(np.sum(mcmc.get_extra_fields()["num_steps"]))
        mcmc.run(mcmc.post_warmup_state.rng_key, *self.args, extra_fields=("num_steps",),
                 **self.kwargs)  # fmt: skip
        samples = mcmc.get_samples(group_by_chain=True)
        grads = float(np.sum(mcmc.get_extra_fields()["num_steps"]))
        return {n: np.asarray(samples[n]) for n in self.names}, (grads, warm)

    def run(self, method: str, seed: int):
        if method == "cr fisher_low_rank":
            return self.chainrunner(seed, "fisher_low_rank")
        if method == "cr numpyro":
            return self.chainrunner(seed, None)
        return self.numpyro(seed, dense=method == "numpyro dense")


def table(results: dict, methods: list[str]) -> str:
    """The three figures, a markdown table each (mean over seeds)."""
    models = list(dict.fromkeys(k[0] for k in results))
    lines = []
    figures = (("ess_per_1000_grad", "{:.1f}"), ("ess_per_1000_grad_with_warmup", "{:.1f}"),
               ("ess_per_s", "{:.0f}"))  # fmt: skip
    for figure, fmt in figures:
        lines += ["", f"{figure}:", f"| method | {' | '.join(models)} |",
                  "|---|" + "---:|" * len(models)]  # fmt: skip
        for m in methods:
            cells = [fmt.format(np.mean([r[figure] for r in results[(mo, m)]])) for mo in models]
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--quick", action="store_true", help="eight schools, one seed")
    parser.add_argument("--json")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    methods = [m for m in args.methods.split(",") if m]
    models = ["eight_schools"] if args.quick else args.models.split(",")
    seeds = 1 if args.quick else args.seeds
    results = {}
    for model in models:
        runner = Runner(model)
        for m in methods:  # once untimed: compiles
            runner.run(m, 100)
        for seed in range(seeds):
            order = methods[seed % len(methods) :] + methods[: seed % len(methods)]
            for m in order:
                t0 = time.perf_counter()
                post, grads = runner.run(m, seed)
                seconds = time.perf_counter() - t0
                ess = min_ess_bulk(post)
                row = {"model": model, "method": m, "seed": seed, "ess": ess,
                       "sampling_grads": grads[0], "warmup_grads": grads[1], "seconds": seconds,
                       "ess_per_1000_grad": 1000 * ess / grads[0],
                       "ess_per_1000_grad_with_warmup": 1000 * ess / sum(grads),
                       "ess_per_s": ess / seconds}  # fmt: skip
                results.setdefault((model, m), []).append(row)
                print(json.dumps(row), flush=True)
    print(table(results, methods))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r for rows in results.values() for r in rows], f, indent=1)


if __name__ == "__main__":
    main()
