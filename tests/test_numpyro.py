"""The numpyro adapter: kernels, initial values, constrained draws, data as inputs, layouts."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from mcse import mcse
from numpyro.infer import HMC, MCMC, NUTS, SA, BarkerMH

import chainrunner as cr
from chainrunner.programs import _compile

KEY = jax.random.key(0)


def two_sites():
    """a ~ N(1, 2) and b ~ Gamma(3, 2): mean 1.5, var 0.75, positive support."""
    numpyro.sample("a", dist.Normal(1.0, 2.0))
    numpyro.sample("b", dist.Gamma(3.0, 2.0))


MOMENTS = {"a": (1.0, 2.0), "b": (1.5, np.sqrt(0.75))}


def normal_data(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(5.0))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, sigma), obs=y)


def dependent_bound():
    """beta's upper bound depends on alpha; a deterministic site."""
    alpha = numpyro.sample("alpha", dist.Uniform(0.0, 1.0))
    beta = numpyro.sample("beta", dist.Uniform(0.0, 1.0 - alpha))
    numpyro.deterministic("total", alpha + beta)


def _close(x, mean, what):
    """|mean(x) - mean| within 5 Monte-Carlo standard errors (x is (chain, draw))."""
    se = mcse(x)
    assert abs(float(np.mean(x)) - mean) < 5 * se, (what, float(np.mean(x)), mean, se)


def _check_moments(draws, moments):
    for name, (mean, sd) in moments.items():
        x = draws[name]
        _close(x, mean, f"{name} mean")
        _close((x - mean) ** 2, sd**2, f"{name} variance")


# Kernels built once, so that tests sharing one reuse its compiled programs.
_KERNELS = {
    "NUTS": NUTS(two_sites),
    # trajectory_length < pi: with the adapted unit mass matrix, HMC's default 2*pi is a
    # full period of a Gaussian target and would barely move.
    "HMC": HMC(two_sites, trajectory_length=1.0),
    "BarkerMH": BarkerMH(two_sites),
    "SA": SA(two_sites),
}
_DATA_NUTS = NUTS(normal_data)
_WARMUP = {"NUTS": 300, "HMC": 300, "BarkerMH": 500, "SA": 2000}


@pytest.mark.parametrize("name", list(_KERNELS))
def test_kernel_moments(name):
    kernel = _KERNELS[name]
    trace = cr.run(kernel, KEY, None, 1000, num_warmup=_WARMUP[name], num_chains=8, progress=False)
    assert trace.draws["a"].shape == (8, 1000)
    assert np.all(trace.draws["b"] > 0)  # constrained space
    _check_moments(trace.draws, MOMENTS)
    assert "lp" in trace.stats and trace.stats["lp"].shape == (8, 1000)
    expected = {
        "NUTS": {"lp", "diverging", "acceptance_rate", "n_steps", "tree_depth", "energy"},
        "HMC": {"lp", "diverging", "acceptance_rate", "n_steps", "energy", "step_size"},
        "BarkerMH": {"lp", "acceptance_rate", "step_size"},
        "SA": {"lp", "acceptance_rate", "diverging"},
    }[name]
    assert expected <= set(trace.stats)
    if name == "NUTS":
        n = trace.stats["n_steps"]
        np.testing.assert_array_equal(trace.stats["tree_depth"], np.floor(np.log2(n)) + 1)
        # adapted during warmup, fixed afterwards
        step = trace.stats["step_size"]
        assert np.all(step == step[:, :1]) and not np.allclose(step[:, 0], 1.0)


def test_initial_values_dependent_bound_and_deterministic():
    kernel = NUTS(dependent_bound)
    init = {"alpha": jnp.array([0.1, 0.2, 0.3, 0.4]), "beta": jnp.array([0.5, 0.4, 0.3, 0.2])}
    trace = cr.run(kernel, KEY, init, 1000, num_warmup=300, progress=False)
    alpha, beta, total = (trace.draws[k] for k in ("alpha", "beta", "total"))
    assert alpha.shape == beta.shape == total.shape == (4, 1000)
    assert np.all((alpha > 0) & (alpha < 1) & (beta > 0) & (beta < 1 - alpha))
    np.testing.assert_allclose(total, alpha + beta, rtol=1e-6)
    _close(alpha, 0.5, "alpha")  # marginal U(0, 1)
    _close(beta, 0.25, "beta")  # E[(1 - alpha) / 2]
    # The chains start where they were told to (constrained values, one chain here).
    wrapped = cr.from_numpyro(kernel).build_kernel(num_warmup=300)
    state = wrapped.init({"alpha": 0.3, "beta": 0.6}, KEY, wrapped.params)
    start, _ = wrapped.extract(state, state, wrapped.params)
    np.testing.assert_allclose([start["alpha"], start["beta"]], [0.3, 0.6], rtol=1e-5)


def test_data_are_inputs_no_recompile_and_observed_data():
    kernel = _DATA_NUTS
    rng = np.random.default_rng(1)
    y1 = rng.normal(3.0, 2.0, size=50).astype(np.float32)
    cr.run(
        cr.from_numpyro(kernel, model_args=(y1,)), KEY, None, 500, num_warmup=300,
        num_chains=4, progress=False,
    )  # fmt: skip
    counts = dict(_compile.compile_counts)
    y2 = (y1 - 3.0 + 7.0).astype(np.float32)  # same shape, new values
    trace = cr.run(
        cr.from_numpyro(kernel, model_args=(y2,)), KEY, None, 500, num_warmup=300,
        num_chains=4, progress=False,
    )  # fmt: skip
    assert _compile.compile_counts == counts, "new data of the same shape recompiled"
    _close(trace.draws["mu"], float(np.mean(y2)), "mu follows the new data")
    data = trace.to_arviz()
    np.testing.assert_array_equal(np.asarray(data["observed_data"]["y"]), y2)


def test_matches_numpyro_mcmc():
    y = np.random.default_rng(2).normal(-1.0, 0.5, size=50).astype(np.float32)
    mcmc = MCMC(
        NUTS(normal_data), num_warmup=300, num_samples=500, num_chains=4,
        chain_method="vectorized", progress_bar=False,
    )  # fmt: skip
    mcmc.run(jax.random.key(1), y)
    theirs = mcmc.get_samples(group_by_chain=True)
    trace = cr.run(
        cr.from_numpyro(_DATA_NUTS, model_args=(y,)), KEY, None, 500, num_warmup=300,
        num_chains=4, progress=False,
    )  # fmt: skip
    ours = trace.draws
    for name in ("mu", "sigma"):
        a, b = np.asarray(ours[name], np.float64), np.asarray(theirs[name], np.float64)
        err = np.hypot(mcse(a), mcse(b))
        assert abs(a.mean() - b.mean()) < 5 * err, (name, a.mean(), b.mean(), err)
    # numpyro's adaptation, each chain's, as numpyro's MCMC keeps it (adapt_state)
    adapted, state = cr.adapted_parameters(trace), mcmc.last_state.adapt_state
    assert adapted["step_size"].shape == (4,)
    ratio = np.median(adapted["step_size"]) / np.median(np.asarray(state.step_size))
    assert 0.5 < ratio < 2.0, (adapted["step_size"], state.step_size)
    imm = {k: np.asarray(v) for k, v in state.inverse_mass_matrix.items()}
    assert {k: v.shape for k, v in adapted["inverse_mass_matrix"].items()} == {
        k: v.shape for k, v in imm.items()
    }


def test_draws_do_not_depend_on_the_device_count():
    # HMC (gradients, a leapfrog loop) keeps compiles short; NUTS behaves the same way.
    kernel = HMC(two_sites, num_steps=5, trajectory_length=None)

    def draws(num_devices, batch_size, num_samples=30):
        trace = cr.run(
            kernel, KEY, None, num_samples, num_warmup=30, num_chains=8,
            mesh=cr.chain_mesh(num_devices), batch_size=batch_size, progress=False,
        )  # fmt: skip
        return trace.draws["a"]

    # One chain per vmap (batch_size=1) on 1, 2, 4 and 8 devices: bitwise identical.
    ref = draws(8, 1)
    for d in (1, 2, 4):
        np.testing.assert_array_equal(draws(d, 1), ref)
    # Other vmap widths are not compared: XLA may round differently at width 1 than at
    # widths >= 2 (an ulp), and accept/reject decisions and step-size adaptation amplify
    # that into different chains after a few dozen steps.


def test_continue_equals_one_longer_run():
    kernel = _KERNELS["BarkerMH"]
    opts = {"num_chains": 8, "chunk_size": 20, "progress": False}
    one = cr.run(kernel, KEY, None, 60, num_warmup=500, **opts)
    first = cr.run(kernel, KEY, None, 20, num_warmup=500, **opts)
    more = cr.run(kernel, KEY, first, 40, **opts)  # num_warmup=0: no more adaptation
    np.testing.assert_array_equal(
        np.concatenate([first.draws["a"], more.draws["a"]], axis=1), one.draws["a"]
    )


def test_bare_model_is_nuts_and_reuses_programs():
    a = cr.from_numpyro(two_sites)
    assert isinstance(a.kernel, NUTS)
    kw = {"num_warmup": 5, "num_chains": 2, "progress": False, "warn": False}
    cr.run(a, KEY, None, 5, **kw)
    before = dict(_compile.compile_counts)
    cr.run(cr.from_numpyro(two_sites), KEY, None, 5, **kw)
    assert _compile.compile_counts == before  # a new kernel of the same model


def test_errors():
    with pytest.raises(ValueError, match=r"'gamma'.*latent sites are \['alpha', 'beta'\]"):
        cr.run(NUTS(dependent_bound), KEY, {"gamma": jnp.zeros(2)}, 10, progress=False)
    with pytest.raises(ValueError, match="num_chains is required"):
        cr.run(NUTS(two_sites), KEY, None, 10, progress=False)
    with pytest.raises(ValueError, match="num_chains=3 but initial_position has 2 chains"):
        cr.run(NUTS(two_sites), KEY, {"a": jnp.zeros(2)}, 10, num_chains=3, progress=False)
    with pytest.raises(TypeError, match="pass its kernel instead"):
        cr.from_numpyro(MCMC(NUTS(two_sites), num_warmup=1, num_samples=1))
    with pytest.raises(TypeError, match="model_args must be a tuple"):
        cr.from_numpyro(NUTS(two_sites), model_args=np.zeros(3))
    with pytest.raises(TypeError, match="kernel must be a numpyro MCMCKernel"):
        cr.from_numpyro("nuts")


def impossible():
    numpyro.sample("x", dist.Normal())
    numpyro.factor("never", -jnp.inf)


def test_no_valid_initial_point_names_the_chains():
    # numpyro's search for a valid start fails inside the compiled program; the adapter
    # reports those chains' log density as nan, and run names them.
    with pytest.raises(ValueError, match=r"chain\(s\) \[0, 1\].*Cannot find valid initial"):
        cr.run(NUTS(impossible), KEY, None, 10, num_chains=2, progress=False)


def test_log_likelihood_on_request():
    def model(y):
        mu = numpyro.sample("mu", dist.Normal())
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    y = np.array([0.5, -1.0, 2.0], np.float32)
    plain = cr.from_numpyro(NUTS(model), model_args=(y,))
    asked = cr.from_numpyro(NUTS(model), model_args=(y,), log_likelihood=True)
    assert "log_likelihood" not in cr.run(plain, KEY, None, 5, num_chains=2, progress=False).groups
    trace = cr.run(asked, KEY, None, 20, num_warmup=10, num_chains=2, progress=False)
    ll = trace.groups["log_likelihood"]["y"]
    assert ll.shape == (2, 20, 3)
    mu = trace.draws["mu"][..., None]
    np.testing.assert_allclose(ll, -0.5 * (y - mu) ** 2 - 0.5 * np.log(2 * np.pi), rtol=1e-5)
    data = trace.to_arviz()
    assert data["log_likelihood"]["y"].shape == (2, 20, 3)


def test_log_likelihood_without_the_sites_it_needs_warns_and_keeps_the_draws():
    def model(y):
        mu = numpyro.sample("mu", dist.Normal())
        tau = numpyro.sample("tau", dist.HalfNormal())
        numpyro.sample("y", dist.Normal(mu, tau), obs=y)

    asked = cr.from_numpyro(NUTS(model), model_args=(np.array([0.1, 0.5]),), log_likelihood=True)
    with pytest.warns(cr.ChainrunnerWarning, match="could not be computed from the draws"):
        trace = cr.run(asked, KEY, None, 10, num_chains=2, keep=["mu"], progress=False, warn=False)
    assert trace.draws["mu"].shape == (2, 10) and "log_likelihood" not in trace.groups


X64_SCRIPT = textwrap.dedent(
    """
    import jax
    jax.config.update("jax_num_cpu_devices", 2)
    jax.config.update("jax_enable_x64", True)
    import numpy as np, numpyro, numpyro.distributions as dist
    import chainrunner as cr

    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    y = np.linspace(1.0, 3.0, 20)
    kernel = cr.from_numpyro(numpyro.infer.BarkerMH(model), model_args=(y,))
    trace = cr.run(kernel, jax.random.key(0), None, 1000, num_warmup=500, num_chains=4,
                   progress=False)
    assert trace.draws["mu"].dtype == np.float64, trace.draws["mu"].dtype
    assert trace.stats["lp"].dtype == np.float64
    assert abs(trace.draws["mu"].mean() - 2.0) < 0.1, trace.draws["mu"].mean()
    print("ok")
    """
)


def test_float64_in_a_subprocess():
    env = {**os.environ, "TQDM_DISABLE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", X64_SCRIPT], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
