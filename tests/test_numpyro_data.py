"""numpyro models as their users write them: numpy on the data, and kernels whose init
computes from the data (HMCECS with a Taylor proxy)."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from mcse import mcse
from numpyro.infer import HMCECS, MCMC, NUTS

import chainrunner as cr

DB = os.path.join(os.path.dirname(__file__), "..", "data", "posteriordb")


def ar_k(K, y):
    """posteriordb's arK, written with numpy on its data (as numpyro's MCMC allows)."""
    y = np.asarray(y)
    T = len(y)
    lags = np.stack([y[K - k : T - k] for k in range(1, K + 1)], axis=1)
    alpha = numpyro.sample("alpha", dist.Normal(0.0, 10.0))
    beta = numpyro.sample("beta", dist.Normal(0.0, 10.0).expand([K]))
    sigma = numpyro.sample("sigma", dist.HalfCauchy(2.5))
    numpyro.sample("y", dist.Normal(alpha + lags @ beta, sigma), obs=y[K:])


def _within_mcse(draws, ref_mean, ref_mcse, name):

    x = np.asarray(draws, np.float64)
    flat = x.reshape(x.shape[0], x.shape[1], -1)
    for j in range(flat.shape[2]):
        se = mcse(flat[:, :, j])
        mean = flat[:, :, j].mean()
        tol = 4.5 * np.hypot(se, ref_mcse[j])
        assert abs(mean - ref_mean[j]) <= tol, (name, j, mean, ref_mean[j], tol)


def test_model_with_numpy_on_its_data_runs_with_data_closed_over():
    with open(os.path.join(DB, "data", "arK.json")) as f:
        data = json.load(f)
    with open(os.path.join(DB, "reference", "arK-arK.json")) as f:
        ref = json.load(f)["params"]
    y = np.asarray(data["y"], np.float32)
    kernel = cr.from_numpyro(NUTS(ar_k), model_args=(data["K"], y))
    assert kernel.data == "constants" and "TracerArrayConversionError" in kernel.data_reason
    trace = cr.run(kernel, jax.random.key(0), None, 500, num_warmup=500, num_chains=4,
                   mesh=cr.chain_mesh(2), progress=False, warn=False)  # fmt: skip
    assert trace.attrs["numpyro_data"] == "constants"
    for site in ("alpha", "beta", "sigma"):
        labels = [k for k in ref if k == site or k.startswith(site + "[")]
        means = [ref[k]["mean"] for k in labels]
        mcses = [ref[k]["mcse_mean"] for k in labels]
        _within_mcse(trace.draws[site], means, mcses, site)
    mcmc = MCMC(NUTS(ar_k), num_warmup=500, num_samples=500, num_chains=4,
                chain_method="parallel", progress_bar=False)  # fmt: skip
    mcmc.run(jax.random.PRNGKey(0), data["K"], y)  # numpyro's own run of the same model

    for site, theirs in mcmc.get_samples(group_by_chain=True).items():
        theirs = np.asarray(theirs, np.float64).reshape(4, 500, -1)
        means = theirs.mean(axis=(0, 1))
        mcses = [mcse(theirs[:, :, j]) for j in range(theirs.shape[2])]
        _within_mcse(trace.draws[site], means, mcses, site)
    forced = cr.from_numpyro(NUTS(ar_k), model_args=(data["K"], y), data="inputs")
    with pytest.raises(jax.errors.TracerArrayConversionError):
        cr.run(forced, jax.random.key(0), None, 10, num_chains=2, progress=False)


def test_data_modes_and_errors():
    def model(y):
        mu = numpyro.sample("mu", dist.Normal())
        numpyro.sample("y", dist.Normal(mu), obs=y)

    y = np.ones(3)
    assert cr.from_numpyro(NUTS(model), model_args=(y,)).data == "inputs"
    closed = cr.from_numpyro(NUTS(model), model_args=(y,), data="constants")
    assert closed.data == "constants" and closed.build_kernel(num_warmup=5).params == ()
    with pytest.raises(ValueError, match="data must be one of"):
        cr.from_numpyro(NUTS(model), model_args=(y,), data="closed")


def _logistic(features, obs, subsample_size):
    n, m = features.shape
    theta = numpyro.sample("theta", dist.Normal(jnp.zeros(m), 0.5 * jnp.ones(m)))
    with numpyro.plate("N", n, subsample_size=subsample_size):
        batch_feats = numpyro.subsample(features, event_dim=1)
        batch_obs = numpyro.subsample(obs, event_dim=0)
        numpyro.sample("obs", dist.Bernoulli(logits=theta @ batch_feats.T), obs=batch_obs)


def test_hmcecs_with_a_taylor_proxy_matches_numpyros_mcmc():
    rng = np.random.default_rng(0)
    features = rng.normal(size=(2000, 3)).astype(np.float32)
    true = np.array([0.8, -0.5, 0.3], np.float32)
    obs = (rng.uniform(size=2000) < 1 / (1 + np.exp(-features @ true))).astype(np.float32)
    ref_params = {"theta": jnp.asarray(true)}
    args = (features, obs, 200)

    def kernel():
        proxy = HMCECS.taylor_proxy(ref_params)
        return HMCECS(NUTS(_logistic), num_blocks=10, proxy=proxy)

    trace = cr.run(cr.from_numpyro(kernel(), model_args=args), jax.random.key(1), None, 400,
                   num_warmup=300, num_chains=4, mesh=cr.chain_mesh(2), progress=False,
                   warn=False)  # fmt: skip
    mcmc = MCMC(kernel(), num_warmup=300, num_samples=400, num_chains=4,
                chain_method="parallel", progress_bar=False)  # fmt: skip
    mcmc.run(jax.random.PRNGKey(1), *args)
    theirs = np.asarray(mcmc.get_samples(group_by_chain=True)["theta"], np.float64)

    ref_mean = theirs.mean(axis=(0, 1))
    ref_mcse = [mcse(theirs[:, :, j]) for j in range(3)]
    _within_mcse(trace.draws["theta"], ref_mean, ref_mcse, "theta")


def _discrete(y):
    z = numpyro.sample("z", dist.Bernoulli(0.3))
    mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
    numpyro.sample("y", dist.Normal(mu + 2.0 * z, 1.0), obs=y)


def _gibbs_z(rng_key, gibbs_sites, hmc_sites):
    y, mu = np.array([1.0, 2.5, 1.8, 2.2]), hmc_sites["mu"]
    logit = jnp.log(0.3 / 0.7) + jnp.sum(
        dist.Normal(mu + 2.0, 1.0).log_prob(y) - dist.Normal(mu, 1.0).log_prob(y)
    )
    return {"z": dist.Bernoulli(logits=logit).sample(rng_key)}


@pytest.mark.parametrize(
    "make",
    [
        lambda: numpyro.infer.MixedHMC(numpyro.infer.HMC(_discrete, trajectory_length=1.2)),
        lambda: numpyro.infer.DiscreteHMCGibbs(NUTS(_discrete)),
        lambda: numpyro.infer.HMCGibbs(NUTS(_discrete), gibbs_fn=_gibbs_z, gibbs_sites=["z"]),
    ],
    ids=["MixedHMC", "DiscreteHMCGibbs", "HMCGibbs"],
)
def test_discrete_kernels_match_numpyros_mcmc(make):
    y = np.array([1.0, 2.5, 1.8, 2.2])
    trace = cr.run(cr.from_numpyro(make(), model_args=(y,)), jax.random.key(3), None, 1000,
                   num_warmup=500, num_chains=4, mesh=cr.chain_mesh(2), progress=False,
                   warn=False)  # fmt: skip
    mcmc = MCMC(make(), num_warmup=500, num_samples=1000, num_chains=4,
                chain_method="parallel", progress_bar=False)  # fmt: skip
    mcmc.run(jax.random.PRNGKey(3), y)

    for site in ("mu", "z"):
        theirs = np.asarray(mcmc.get_samples(group_by_chain=True)[site], np.float64)
        _within_mcse(trace.draws[site], [theirs.mean()], [mcse(theirs)], site)


def test_blackjax_state_without_position_is_a_clear_error():
    import blackjax

    orbital = blackjax.orbital_hmc(lambda x: -0.5 * jnp.sum(x**2), 0.1, jnp.ones(2), 10)
    with pytest.raises(TypeError, match=r"has no `position`.*cr\.Kernel\(.*extract="):
        cr.run(orbital, jax.random.key(0), jnp.zeros((2, 2)), 5, progress=False, warn=False)
