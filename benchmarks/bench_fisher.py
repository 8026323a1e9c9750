"""PyMC models: chainrunner's adaptations next to nutpie's, ESS per gradient and per second.

Four PyMC models as PyMC's docs write them (eight schools non-centred, a radon-like
hierarchical model with 85 groups, a 100-d Gaussian with a dense covariance, a logistic
regression with 12 correlated predictors), 4 chains x (1000 warmup + 1000 draws), sampled
by

- ``cr.sample(cr.from_pymc(model, adaptation=a), ...)`` for ``a`` in ``window`` (Stan's)
  and ``fisher`` (nutpie's diagonal, in chainrunner's loop), the default
  (``fisher_low_rank``), and the default pooled over the chains (``pooled=True``);
- ``nutpie.sample(nutpie.compile_pymc_model(model))`` with its diagonal and its low-rank
  (``low_rank_modified_mass_matrix=True``) mass matrix, if nutpie is installed;
- ``blackjax``'s own vmapped ``window_adaptation`` + NUTS on the same log density, and
  ``pm.sample(nuts_sampler="numpyro")``.

The figures: the smallest bulk ESS over every free variable per 1000 gradients of the
draws (the issue's measure), the same with the warmup gradients included (what a user pays
for the draws), and per second of the whole call (warmup included, compile excluded: every
method is called once before it is timed).
The mean over ``--seeds`` seeds; methods interleaved within each seed.

    python benchmarks/bench_fisher.py [--seeds 2] [--models eight_schools,...] [--json out]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
import warnings

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "4")
os.environ["TQDM_DISABLE"] = "1"

import numpy as np

CHAINS, TUNE, DRAWS = 4, 1000, 1000


def make_model(name: str):
    """The PyMC model ``name``."""
    import pymc as pm

    if name == "eight_schools":
        y = np.array([28.0, 8, -3, 7, -1, 1, 18, 12])
        sigma = np.array([15.0, 10, 16, 11, 9, 11, 10, 18])
        with pm.Model() as model:
            mu = pm.Normal("mu", 0, 5)
            tau = pm.HalfCauchy("tau", 5)
            theta_t = pm.Normal("theta_t", 0, 1, shape=8)
            pm.Normal("y", mu + tau * theta_t, sigma, observed=y)
        return model
    if name == "radon_like":
        rng = np.random.default_rng(3)
        groups = 85
        county = rng.integers(0, groups, 919)
        floor = rng.integers(0, 2, 919).astype(float)
        a = rng.normal(1.5, 0.3, groups)
        y = a[county] - 0.6 * floor + rng.normal(0, 0.7, 919)
        with pm.Model() as model:
            mu_a = pm.Normal("mu_a", 0, 10)
            sigma_a = pm.HalfNormal("sigma_a", 5)
            a = pm.Normal("a", mu_a, sigma_a, shape=groups)
            b = pm.Normal("b", 0, 10)
            sigma_y = pm.HalfNormal("sigma_y", 5)
            pm.Normal("y", a[county] + b * floor, sigma_y, observed=y)
        return model
    if name == "dense_gaussian":
        rng = np.random.default_rng(0)
        d = 100
        q, _ = np.linalg.qr(rng.normal(size=(d, d)))
        cov = q @ np.diag(np.geomspace(0.01, 10.0, d)) @ q.T
        with pm.Model() as model:
            pm.MvNormal("x", mu=np.zeros(d), cov=cov)
        return model
    if name == "logistic":
        rng = np.random.default_rng(0)
        n, k = 200, 12
        corr = 0.9 ** np.abs(np.subtract.outer(np.arange(k), np.arange(k)))
        X = rng.multivariate_normal(np.zeros(k), corr, size=n)
        beta = rng.normal(0, 1, k)
        yobs = rng.binomial(1, 1 / (1 + np.exp(-(X @ beta))))
        with pm.Model() as model:
            b = pm.Normal("b", 0, 2, shape=k)
            pm.Bernoulli("y", logit_p=pm.math.dot(X, b), observed=yobs)
        return model
    raise ValueError(name)


MODELS = ("eight_schools", "radon_like", "dense_gaussian", "logistic")
METHODS = ("cr default", "cr window", "cr fisher", "cr pooled", "nutpie diag",
           "nutpie low rank", "blackjax window", "numpyro")  # fmt: skip


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


def _from_idata(idata, names, warmup_group):
    post = idata["posterior"] if hasattr(idata, "children") else idata.posterior
    stats = idata["sample_stats"] if hasattr(idata, "children") else idata.sample_stats
    grads = float(stats["n_steps"].values.sum())
    warmup = 0.0 if warmup_group is None else float(idata[warmup_group]["n_steps"].values.sum())
    return {n: post[n].transpose("chain", "draw", ...).values for n in names}, (grads, warmup)


class Runner:
    """One model's samplers, each called once before it is timed."""

    def __init__(self, name: str):
        import pymc as pm

        self.model = make_model(name)
        self.names = [v.name for v in self.model.free_RVs]
        self.pm = pm
        self.compiled = None
        self._go = None

    def chainrunner(self, seed: int, adaptation):
        import jax

        import chainrunner as cr

        kwargs = {} if adaptation is None else {"adaptation": adaptation}
        if adaptation == "pooled":
            kwargs = {"pooled": True}
        idata = cr.sample(cr.from_pymc(self.model, **kwargs), jax.random.key(seed), None, DRAWS,
                          num_warmup=TUNE, num_chains=CHAINS, keep_warmup=True, progress=False,
                          warn=False)  # fmt: skip
        return _from_idata(idata, self.names, "warmup_sample_stats")

    def nutpie(self, seed: int, low_rank: bool):
        import nutpie

        if self.compiled is None:
            self.compiled = nutpie.compile_pymc_model(self.model)
        idata = nutpie.sample(self.compiled, draws=DRAWS, tune=TUNE, chains=CHAINS, seed=seed,
                              progress_bar=False, low_rank_modified_mass_matrix=low_rank,
                              save_warmup=True)  # fmt: skip
        return _from_idata(idata, self.names, "warmup_sample_stats")

    def numpyro(self, seed: int):
        import jax

        # pm.sample's JAX path counts on the x64 that PyTensor's import set (put back by
        # chainrunner in this process): on for it, as in a process of its own.
        with jax.enable_x64(True):
            idata = self.pm.sample(draws=DRAWS, tune=TUNE, chains=CHAINS, model=self.model,
                                   random_seed=seed, nuts_sampler="numpyro",
                                   progressbar=False, compute_convergence_checks=False,
                                   discard_tuned_samples=False,
                                   nuts_sampler_kwargs={"chain_method": "parallel"})  # fmt: skip
        warm = "warmup_sample_stats" if "warmup_sample_stats" in idata.groups() else None
        return _from_idata(idata, self.names, warm)

    def blackjax_window(self, seed: int):
        """blackjax's docs recipe: vmapped window_adaptation, then vmapped NUTS."""
        import blackjax
        import jax
        from pymc.sampling.jax import get_jaxified_graph

        rvs = self.model.value_vars
        logp = get_jaxified_graph(inputs=rvs, outputs=[self.model.logp()])

        def logdensity(p):
            return logp(*p)[0]

        ip = self.model.initial_point()
        x0 = [np.asarray(ip[v.name], dtype=np.float64) for v in rvs]
        key = jax.random.key(seed)
        keys = jax.random.split(key, CHAINS + 1)
        starts = [jax.numpy.stack([x + jax.random.uniform(jax.random.fold_in(k, i), x.shape,
                                                              minval=-1, maxval=1)
                                   for k in keys[1:]]) for i, x in enumerate(x0)]  # fmt: skip
        warm = blackjax.window_adaptation(blackjax.nuts, logdensity)
        if getattr(self, "_go", None) is not None:  # compiled once per model
            xs, n = self._go(keys[0], starts)
            return self._constrained(xs), (float(np.sum(n[0])), float(np.sum(n[1])))

        @jax.jit
        def go(k, starts):
            def one(k, x):
                (state, params), info = warm.run(k, x, num_steps=TUNE)
                nuts = blackjax.nuts(logdensity, **params)

                def body(s, k):
                    s, i = nuts.step(k, s)
                    return s, (s.position, i.num_integration_steps)

                _, (xs, n) = jax.lax.scan(body, state, jax.random.split(k, DRAWS))
                return xs, (n.sum(), info.info.num_integration_steps.sum())

            return jax.vmap(one)(jax.random.split(k, CHAINS), starts)

        self._go = go
        xs, n = go(keys[0], starts)
        # back to the model's constrained values, like PyMC's own output
        post = self._constrained(xs)
        return post, (float(np.sum(n[0])), float(np.sum(n[1])))

    def _constrained(self, xs):
        """The free variables' values (constrained, as PyMC reports them) of each draw."""
        outs = [v for v in self.model.unobserved_value_vars if v.name in self.names]
        fn = self.model.compile_fn(outs, inputs=self.model.value_vars,
                                   on_unused_input="ignore", point_fn=False)  # fmt: skip
        xs = [np.asarray(x) for x in xs]
        out = {v.name: [] for v in outs}
        for c in range(CHAINS):
            for i in range(DRAWS):
                for v, value in zip(outs, fn(*[x[c, i] for x in xs]), strict=True):
                    out[v.name].append(value)
        return {n: np.asarray(v).reshape(CHAINS, DRAWS, *np.shape(v[0])) for n, v in out.items()}

    def run(self, method: str, seed: int):
        if method.startswith("cr "):
            a = method[3:]
            return self.chainrunner(seed, None if a == "default" else a)
        if method.startswith("nutpie"):
            return self.nutpie(seed, "low rank" in method)
        if method == "numpyro":
            return self.numpyro(seed)
        return self.blackjax_window(seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--json")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    logging.getLogger("pymc").setLevel(logging.ERROR)
    methods = [m for m in args.methods.split(",") if m]
    try:
        import nutpie  # noqa: F401
    except ImportError:
        methods = [m for m in methods if not m.startswith("nutpie")]
    results = {}
    for model in args.models.split(","):
        runner = Runner(model)
        for m in methods:  # once untimed: compiles
            runner.run(m, 100)
        for seed in range(args.seeds):
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
    models = list(dict.fromkeys(k[0] for k in results))
    figures = (
        ("ess_per_1000_grad", "{:.1f}"),
        ("ess_per_1000_grad_with_warmup", "{:.1f}"),
        ("ess_per_s", "{:.0f}"),
    )
    for figure, fmt in figures:
        print(f"\n{figure}: | method | {' | '.join(models)} |")
        print("|---|" + "---:|" * len(models))
        for m in methods:
            cells = [fmt.format(np.mean([r[figure] for r in results[(mo, m)]])) for mo in models]
            print(f"| {m} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r for rows in results.values() for r in rows], f, indent=1)


if __name__ == "__main__":
    main()
