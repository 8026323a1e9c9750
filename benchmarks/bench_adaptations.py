"""Effective draws per gradient of blackjax's adaptations through ``cr.from_blackjax``.

Every adaptation, 4 chains x (1000 warmup + 1000 draws) of NUTS on 4 simulated CPU
devices, on models as blackjax's docs write them (log densities in JAX): eight schools
(non-centred), a 100-d Gaussian with a dense covariance, a logistic regression with 12
correlated predictors. The figure is the minimum bulk ESS over the coordinates per 1000
gradients, warmup gradients included (``n_steps`` of every warmup and sampling step):
what a user gets for the work. It does not depend on timing, so it is the same on a
loaded machine; the mean of ``--seeds`` seeds.

    python benchmarks/bench_adaptations.py [--seeds 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "4")

import arviz as az
import blackjax
import jax
import jax.numpy as jnp
import numpy as np
from blackjax.adaptation.low_rank_adaptation import build_growing_window_schedule

import chainrunner as cr

Y8 = jnp.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
S8 = jnp.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])


def eight_schools(p):
    mu, log_tau, eta = p[0], p[1], p[2:]
    theta = mu + jnp.exp(log_tau) * eta
    return (
        -0.5 * jnp.sum(((Y8 - theta) / S8) ** 2)
        - 0.5 * jnp.sum(eta**2)
        - 0.5 * (mu / 5.0) ** 2
        + jax.scipy.stats.cauchy.logpdf(jnp.exp(log_tau), 0.0, 5.0)
        + log_tau
    )


def dense_gaussian(d=100, seed=0):
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    scales = np.logspace(-1, 1, d)  # condition number 1e4 in the covariance
    precision = jnp.asarray((q / scales**2) @ q.T, dtype=jnp.float32)
    return lambda x: -0.5 * x @ precision @ x


def logistic(n=200, k=12, seed=0):
    rng = np.random.default_rng(seed)
    cov = 0.9 ** np.abs(np.subtract.outer(np.arange(k), np.arange(k)))
    X = rng.multivariate_normal(np.zeros(k), cov, size=n)
    beta = rng.normal(size=k)
    y = rng.random(n) < 1 / (1 + np.exp(-X @ beta))
    X, y = jnp.asarray(X, jnp.float32), jnp.asarray(y, jnp.float32)

    def logdensity(b):
        logits = X @ b
        return jnp.sum(y * logits - jnp.logaddexp(0.0, logits)) - 0.5 * jnp.sum(b**2)

    return logdensity


MODELS = {
    "eight schools (NC)": (eight_schools, 10),
    "dense Gaussian 100-d": (dense_gaussian(), 100),
    "logistic, 12 correlated": (logistic(), 12),
}

# nutpie's growing windows and gradient-based start. (blackjax 1.7.1's
# buffer_policy="accumulating" converts its schedule to numpy, which fails under jit:
# blackjax's own run inside jax.jit fails the same way.)
NUTPIE_LIKE = {"schedule_fn": build_growing_window_schedule, "gradient_based_init": True}
ADAPTATIONS = {
    "window (diag)": ("window", {}),
    "window (dense)": ("window", {"is_mass_matrix_diagonal": False}),
    "staged fisher_diag": ("staged", {"metric": "fisher_diag"}),
    "window_low_rank": ("window_low_rank", {}),
    "window_low_rank, nutpie schedule": ("window_low_rank", NUTPIE_LIKE),
    "pathfinder": ("pathfinder", {}),
}


def ess_per_gradient(model, adaptation, options, seed):
    logdensity, d = MODELS[model]
    kernel = cr.from_blackjax(blackjax.nuts, logdensity_fn=logdensity, adaptation=adaptation,
                              **options)  # fmt: skip
    x0 = jax.random.uniform(jax.random.key(seed + 100), (4, d), minval=-2, maxval=2)
    trace = cr.run(kernel, jax.random.key(seed), x0, 1000, num_warmup=1000, keep_warmup=True,
                   progress=False, warn=False)  # fmt: skip
    draws = np.asarray(trace.draws, dtype=np.float64)
    ess = np.asarray(az.ess(az.convert_to_dataset(draws))["x"]).min()
    grads = float(np.sum(trace.stats["n_steps"]) + np.sum(trace.warmup_stats["n_steps"]))
    return 1000 * float(ess) / grads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = {}
    for model in MODELS:
        for label, (adaptation, options) in ADAPTATIONS.items():
            values = [ess_per_gradient(model, adaptation, options, s) for s in range(args.seeds)]
            rows[(model, label)] = float(np.mean(values))
            row = {"model": model, "adaptation": label, "seeds": values,
                   "ess_per_1000_grad": round(rows[(model, label)], 1)}  # fmt: skip
            print(json.dumps(row), flush=True)
    print(f"\n| adaptation | {' | '.join(MODELS)} |")
    print("|---|" + "---:|" * len(MODELS))
    for label in ADAPTATIONS:
        print(f"| {label} | " + " | ".join(f"{rows[(m, label)]:.1f}" for m in MODELS) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"model": m, "adaptation": a, "value": v} for (m, a), v in rows.items()],
                      f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
