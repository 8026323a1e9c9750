"""posteriordb reference posteriors, sampled with numpyro NUTS through chainrunner.

Models follow Stan's parameterisation and names (see data/posteriordb/README.md). Each
posterior runs in its own subprocess with float64 enabled (a process-wide JAX setting),
4 chains x 1000 draws after 1000 warmup steps, on 2 CPU devices; and again with
``until=cr.Converged()`` (a cap of 4000 draws), which must stop converged and match the
references just the same; and with nutpie's Fisher adaptation on the model's log density
(``cr.from_numpyro(NUTS(model), adaptation="fisher_low_rank")``, blackjax's NUTS); and
with blackjax's NUTS window-adapted, 16 chains vmapped 8 per device: the NUTS state
machine (issue 37), against the same references.

Pass rule (README): ``|mean - ref| <= 4 * sqrt(mcse^2 + ref_mcse^2)``; ``sd`` within 15%
of the reference, or within ``4 * sqrt(mcse_sd^2 + ref_mcse_sd^2)`` (heavy tails, as
``tau`` in eight schools, make the relative rule too strict for a 4000-draw run).
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

HERE = os.path.dirname(__file__)
DB = os.path.join(HERE, "..", "data", "posteriordb")

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import jax
    jax.config.update("jax_num_cpu_devices", 2)
    jax.config.update("jax_enable_x64", True)
    import arviz as az
    import jax.numpy as jnp
    import numpy as np
    import numpyro
    import numpyro.distributions as dist
    from numpyro.distributions import constraints
    import chainrunner as cr

    def eight_schools_noncentered(J, y, sigma):
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
        theta_trans = numpyro.sample("theta_trans", dist.Normal(0.0, 1.0).expand([J]))
        theta = numpyro.deterministic("theta", mu + tau * theta_trans)
        numpyro.sample("y", dist.Normal(theta, sigma), obs=y)

    def kidscore_interaction(kid_score, mom_hs, mom_iq):
        beta = numpyro.sample("beta", dist.ImproperUniform(constraints.real, (), (4,)))
        sigma = numpyro.sample("sigma", dist.HalfCauchy(2.5))
        mu = beta[0] + beta[1] * mom_hs + beta[2] * mom_iq + beta[3] * mom_hs * mom_iq
        numpyro.sample("kid_score", dist.Normal(mu, sigma), obs=kid_score)

    def arK(K, T, y):
        alpha = numpyro.sample("alpha", dist.Normal(0.0, 10.0))
        beta = numpyro.sample("beta", dist.Normal(0.0, 10.0).expand([K]))
        sigma = numpyro.sample("sigma", dist.HalfCauchy(2.5))
        lags = jnp.stack([y[K - k : T - k] for k in range(1, K + 1)], axis=-1)
        numpyro.sample("y", dist.Normal(alpha + lags @ beta, sigma), obs=y[K:])

    def low_dim_gauss_mix(y):
        mu = numpyro.sample("mu", dist.ImproperUniform(constraints.ordered_vector, (), (2,)))
        numpyro.factor("mu_prior", dist.Normal(0.0, 2.0).log_prob(mu).sum())
        sigma = numpyro.sample("sigma", dist.HalfNormal(2.0).expand([2]))
        theta = numpyro.sample("theta", dist.Beta(5.0, 5.0))
        lp1 = jnp.log(theta) + dist.Normal(mu[0], sigma[0]).log_prob(y)
        lp2 = jnp.log1p(-theta) + dist.Normal(mu[1], sigma[1]).log_prob(y)
        numpyro.factor("y", jnp.logaddexp(lp1, lp2).sum())

    name, db = sys.argv[1], sys.argv[2]
    data = json.load(open(os.path.join(db, "data", name.split("-")[0] + ".json")))
    arr = lambda k: np.asarray(data[k], dtype=np.float64)
    if name == "eight_schools-eight_schools_noncentered":
        kernel = numpyro.infer.NUTS(eight_schools_noncentered, target_accept_prob=0.95)
        args = (data["J"], arr("y"), arr("sigma"))
    elif name == "kidiq-kidscore_interaction":
        # Flat priors and mom_iq ~ 100 make beta strongly correlated: a dense mass matrix.
        kernel = numpyro.infer.NUTS(kidscore_interaction, dense_mass=True)
        args = (arr("kid_score"), arr("mom_hs"), arr("mom_iq"))
    elif name == "arK-arK":
        kernel = numpyro.infer.NUTS(arK)
        args = (data["K"], data["T"], arr("y"))
    else:
        kernel = numpyro.infer.NUTS(low_dim_gauss_mix)
        args = (arr("y"),)
    # "until": num_samples is a cap; the run stops once R-hat <= 1.01 and bulk and tail
    # ESS >= 400 for every element (cr.Converged's defaults), checked every 50 draws.
    until = cr.Converged() if sys.argv[3] == "until" else None
    options = {}
    if sys.argv[3] == "fisher":  # nutpie's adaptation on the model's log density, as
        # users write it: no dense_mass (the low rank finds kidiq's correlations itself)
        kernel = numpyro.infer.NUTS(kernel.model, target_accept_prob=kernel._target_accept_prob)
        options = {"adaptation": "fisher_low_rank"}
    machine = sys.argv[3] == "machine"
    if machine:  # blackjax's NUTS, window-adapted, 8 chains in one vmap per device: the
        # state machine in which no chain waits (dense_mass and the target carry over)
        options = {"adaptation": "window"}
    adapter = cr.from_numpyro(kernel, model_args=args, **options)
    trace = cr.run(adapter, jax.random.key(20240101), None,
                   4000 if until else 1000, num_warmup=1000, num_chains=16 if machine else 4,
                   batch_size=None if machine else "auto", progress=False,
                   until=until, chunk_size=50 if until else None)
    out = {"divergences": int(trace.stats["diverging"].sum()), "draws": trace.num_draws,
           "stopped": trace.attrs.get("stopped"), "layout": trace.attrs["layout"],
           "machine": machine and adapter.build_kernel(num_warmup=1000).machine is not None,
           "sampling_time": trace.attrs["sampling_time"], "params": {}}
    for site, draws in trace.draws.items():
        draws = np.asarray(draws, dtype=np.float64)
        flat = draws.reshape(draws.shape[:2] + (-1,))
        for j in range(flat.shape[-1]):
            label = site if draws.ndim == 2 else f"{site}[{j + 1}]"
            x = flat[..., j]
            sd = float(x.std(ddof=1))
            # MCSE of the sd: the delta method on the second central moment (arviz 0.x's
            # method="sd" raises under the numpy that PyMC 5 resolves)
            mcse_sd = float(np.ravel(az.mcse((x - x.mean()) ** 2))[0]) / (2 * sd)
            out["params"][label] = [float(x.mean()), sd, float(np.ravel(az.mcse(x))[0]),
                                    mcse_sd]
    assert draws.dtype == np.float64
    print(json.dumps(out))
    """
)

POSTERIORS = [
    "eight_schools-eight_schools_noncentered",
    "kidiq-kidscore_interaction",
    "arK-arK",
    "low_dim_gauss_mix-low_dim_gauss_mix",
]


# The state machine's draws equal blackjax's NUTS to rounding (tests/test_nuts_fsm.py):
# here two posteriors suffice, the funnel of eight schools (divergences, the longest
# trajectories) and arK (correlated), 16 chains each (CI time).
MACHINE_POSTERIORS = POSTERIORS[:1] + POSTERIORS[2:3]
CASES = [(p, m) for m in ("fixed", "until", "fisher") for p in POSTERIORS] + [
    (p, "machine") for p in MACHINE_POSTERIORS
]


@pytest.mark.slow
@pytest.mark.parametrize(("posterior", "mode"), CASES, ids=[f"{p}-{m}" for p, m in CASES])
def test_posteriordb_reference(posterior, mode):
    """1000 + 1000 draws; or ``until=cr.Converged()``: stopped converged, same answer; or
    nutpie's adaptation (blackjax's NUTS on numpyro's log density): the same answer; or
    window-adapted blackjax NUTS vmapped as the state machine: the same answer."""
    env = {**os.environ, "TQDM_DISABLE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, posterior, DB, mode],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if mode == "machine":  # the vmapped state machine ran
        assert result["machine"] and "8 per device, batch_size=None" in result["layout"], result
    if mode == "until":  # every variable met the targets before the cap
        assert result["stopped"] == "converged" and result["draws"] < 4000, result["draws"]
    with open(os.path.join(DB, "reference", posterior + ".json")) as f:
        reference = json.load(f)["params"]
    failures = []
    for label, ref in reference.items():
        mean, sd, mcse, mcse_sd = result["params"][label]
        mean_tol = 4 * np.hypot(mcse, ref["mcse_mean"])
        if abs(mean - ref["mean"]) > mean_tol:
            failures.append(f"{label}: mean {mean:.4g} vs {ref['mean']:.4g} (tol {mean_tol:.3g})")
        sd_tol = max(0.15 * ref["sd"], 4 * np.hypot(mcse_sd, ref["mcse_sd"]))
        if abs(sd - ref["sd"]) > sd_tol:
            failures.append(f"{label}: sd {sd:.4g} vs {ref['sd']:.4g} (tol {sd_tol:.3g})")
    assert not failures, failures
