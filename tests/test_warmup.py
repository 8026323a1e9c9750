"""Warmup: window adaptation per chain; ChEES and MEADS across all chains (padding masked)."""

import json
import os

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from mcse import mcse, mcse_sd

import chainrunner as cr
from chainrunner.adapters._blackjax._warmup_window import WindowState

adapted_parameters = cr.adapted_parameters

SHARED = os.path.join(os.path.dirname(__file__), "..", "data", "posteriordb")


def small_logdensity(x):
    return -0.5 * jnp.sum((x / jnp.array([1.0, 3.0, 0.3])) ** 2)


WINDOW = cr.from_blackjax(blackjax.nuts, logdensity_fn=small_logdensity, adaptation="window")
CHEES = cr.from_blackjax(blackjax.dynamic_hmc, logdensity_fn=small_logdensity, adaptation="chees")
MEADS = cr.from_blackjax(blackjax.ghmc, logdensity_fn=small_logdensity, adaptation="meads")
START6 = jax.random.normal(jax.random.key(5), (6, 3))


def batch_mcse(y):
    """Monte-Carlo standard error of ``y.mean()`` by batch means (10 batches per chain)."""
    c, n = y.shape[:2]
    means = y[:, : n // 10 * 10].reshape(c, 10, n // 10, *y.shape[2:]).mean(axis=2)
    return means.reshape(c * 10, *y.shape[2:]).std(axis=0, ddof=1) / np.sqrt(c * 10)


def test_window_nuts_50d_correlated_gaussian():
    # Correlated Gaussian, marginal sds from 0.3 to 3, correlation 0.5 between neighbours.
    d = 50
    sd = np.geomspace(0.3, 3.0, d)
    corr = np.eye(d) + 0.5 * (np.eye(d, k=1) + np.eye(d, k=-1))
    cov = corr * np.outer(sd, sd)
    prec = jnp.asarray(np.linalg.inv(cov), jnp.float32)

    def logdensity(x):
        return -0.5 * x @ prec @ x

    nuts = cr.from_blackjax(blackjax.nuts, logdensity_fn=logdensity, adaptation="window")
    trace = cr.run(
        nuts, jax.random.key(1), jnp.zeros((4, d)), 500, num_warmup=500, progress=False, warn=False
    )
    assert trace.draws.dtype == np.float32
    acc = trace.stats["acceptance_rate"].mean()
    assert 0.7 < acc < 0.95, acc
    x = trace.draws.astype(np.float64)
    centred = (x - x.mean(axis=(0, 1))) ** 2
    var = centred.mean(axis=(0, 1))
    tol = 5 * batch_mcse(centred)
    assert np.all(np.abs(var - np.diag(cov)) < tol), np.max(np.abs(var - np.diag(cov)) / tol)
    # The adapted diagonal inverse mass matrix tracks the marginal variances.
    imm = adapted_parameters(trace)["inverse_mass_matrix"]
    assert imm.shape == (4, d)
    ratio = imm / np.diag(cov)
    assert 0.5 < np.median(ratio) < 1.5
    # The step size is fixed after warmup, per chain.
    ss = trace.stats["step_size"]
    np.testing.assert_array_equal(ss, np.broadcast_to(ss[:, :1], ss.shape))
    np.testing.assert_array_equal(ss[:, 0], adapted_parameters(trace)["step_size"])


def eight_schools_logdensity(data):
    y, sigma = jnp.asarray(data["y"], jnp.float32), jnp.asarray(data["sigma"], jnp.float32)

    def logdensity(p):
        tau = jnp.exp(p["log_tau"])
        theta = p["mu"] + tau * p["theta_trans"]
        lp = -0.5 * jnp.sum(p["theta_trans"] ** 2) - 0.5 * (p["mu"] / 5.0) ** 2
        lp += -jnp.log1p((tau / 5.0) ** 2) + p["log_tau"]  # HalfCauchy(5), Jacobian
        return lp - 0.5 * jnp.sum(((y - theta) / sigma) ** 2)

    return logdensity


def test_window_eight_schools_noncentered_matches_posteriordb():
    with open(os.path.join(SHARED, "data", "eight_schools.json")) as f:
        data = json.load(f)
    name = "eight_schools-eight_schools_noncentered.json"
    with open(os.path.join(SHARED, "reference", name)) as f:
        ref = json.load(f)["params"]
    nuts = cr.from_blackjax(
        blackjax.nuts,
        logdensity_fn=eight_schools_logdensity(data),
        adaptation="window",
        target_acceptance_rate=0.9,
    )
    start = {"mu": jnp.zeros(4), "log_tau": jnp.zeros(4), "theta_trans": jnp.zeros((4, 8))}
    trace = cr.run(nuts, jax.random.key(2), start, 1000, num_warmup=500, progress=False, warn=False)
    d = {k: np.asarray(v, np.float64) for k, v in trace.draws.items()}
    tau = np.exp(d["log_tau"])
    params = {"mu": d["mu"], "tau": tau}
    theta = d["mu"][..., None] + tau[..., None] * d["theta_trans"]
    params.update({f"theta[{j + 1}]": theta[..., j] for j in range(8)})
    assert trace.stats["diverging"].sum() <= 4
    for label, x in params.items():
        r = ref[label]
        mean_tol = 4 * np.hypot(mcse(x), r["mcse_mean"])
        assert abs(x.mean() - r["mean"]) <= mean_tol, (label, x.mean(), r["mean"], mean_tol)
        sd_tol = max(0.15 * r["sd"], 4 * np.hypot(mcse_sd(x), r["mcse_sd"]))
        assert abs(x.std(ddof=1) - r["sd"]) <= sd_tol, (label, x.std(ddof=1), r["sd"])


def test_window_same_seed_bitwise_and_continuation():
    start = jnp.zeros((5, 3))
    run = dict(progress=False, warn=False, keep_warmup=True)
    a = cr.run(WINDOW, jax.random.key(3), start, 40, num_warmup=60, **run)
    b = cr.run(WINDOW, jax.random.key(3), start, 40, num_warmup=60, **run)
    np.testing.assert_array_equal(a.warmup_draws, b.warmup_draws)
    np.testing.assert_array_equal(a.warmup_stats["step_size"], b.warmup_stats["step_size"])
    np.testing.assert_array_equal(a.draws, b.draws)
    # The state's step counter is chainrunner's step number: a continued run goes on
    # with the adapted parameters and equals one longer run.
    assert isinstance(a.final_state, WindowState)
    np.testing.assert_array_equal(np.asarray(a.final_state.step), 100)
    first = cr.run(WINDOW, jax.random.key(3), start, 20, num_warmup=60, progress=False, warn=False)
    more = cr.run(WINDOW, jax.random.key(3), first, 20, progress=False, warn=False)
    np.testing.assert_array_equal(np.concatenate([first.draws, more.draws], axis=1), a.draws)
    # Warmup moved the step size; sampling does not.
    assert np.ptp(a.warmup_stats["step_size"]) > 0
    assert np.ptp(more.stats["step_size"], axis=1).max() == 0


def cross_chain_step_size(obj, num_devices, **kw):
    trace = cr.run(
        obj,
        jax.random.key(0),
        START6,
        10,
        num_warmup=150,
        progress=False,
        warn=False,
        mesh=cr.chain_mesh(num_devices),
        **kw,
    )
    assert trace.attrs["adaptation"] == obj.adaptation
    return trace, trace.attrs["adapted_step_size"]


# (bitwise on 1, 3 and 8 devices, with padding chains: tests/test_cross_chain_sharded.py)


def test_cross_chain_is_not_naive_per_device_adaptation():
    # What a shard_map'd blackjax ChEES would do: each device adapts on its own chains.
    import optax

    mesh = cr.chain_mesh(3)

    def per_device(positions):
        warmup = blackjax.chees_adaptation(small_logdensity, positions.shape[0])
        (_, p), _ = warmup.run(jax.random.key(0), positions, 0.1, optax.adam(0.025), 150)
        return p["step_size"][None]

    naive = jax.jit(
        jax.shard_map(
            per_device, mesh=mesh, in_specs=P("chain"), out_specs=P("chain"), check_vma=False
        )
    )(START6)
    naive = np.asarray(naive)
    _, shared = cross_chain_step_size(CHEES, 3)
    assert naive.shape == (3,)
    assert np.ptp(naive) / shared > 1e-2  # the devices disagree with each other ...
    # ... and with the shared value, by far more than the 1e-5 that layouts may differ by.
    assert np.all(np.abs(naive - shared) / shared > 1e-4)
    assert np.max(np.abs(naive - shared) / shared > 1e-2)


def test_cross_chain_keep_warmup_and_sampling_quality():
    trace = cr.run(
        CHEES,
        jax.random.key(4),
        START6,
        200,
        num_warmup=150,
        progress=False,
        warn=False,
        keep_warmup=True,
    )
    assert trace.warmup_draws.shape == (6, 150, 3)
    assert trace.warmup_stats["acceptance_rate"].shape == (6, 150)
    assert trace.stats["acceptance_rate"].mean() > 0.5
    sd = trace.draws.std(axis=(0, 1))
    np.testing.assert_allclose(sd, [1.0, 3.0, 0.3], rtol=0.35)
    assert set(adapted_parameters(trace)) == {"step_size", "num_leapfrog_steps"}
    # Continuing samples on with the adapted parameters: equals one longer run.
    more = cr.run(CHEES, jax.random.key(4), trace, 50, progress=False, warn=False)
    longer = cr.run(CHEES, jax.random.key(4), START6, 250, num_warmup=150, progress=False,
                    warn=False)  # fmt: skip
    np.testing.assert_array_equal(np.concatenate([trace.draws, more.draws], 1), longer.draws)


def test_errors():
    with pytest.raises(ValueError, match="adaptation must be None, one of"):
        cr.from_blackjax(blackjax.nuts, logdensity_fn=small_logdensity, adaptation="stan")
    with pytest.raises(TypeError, match="needs logdensity_fn"):
        cr.from_blackjax(blackjax.nuts, adaptation="window")
    with pytest.raises(TypeError, match=r"blackjax\.ghmc"):
        cr.from_blackjax(blackjax.nuts, logdensity_fn=small_logdensity, adaptation="meads")
    with pytest.raises(TypeError, match="unknown option"):
        cr.from_blackjax(
            blackjax.ghmc, logdensity_fn=small_logdensity, adaptation="meads", step_size=0.1
        )
    with pytest.raises(TypeError, match="apply only with adaptation"):
        cr.from_blackjax(blackjax.nuts, logdensity_fn=small_logdensity)
    with pytest.raises(ValueError, match="needs num_warmup > 0"):
        cr.run(CHEES, jax.random.key(0), START6, 10, progress=False)
    bad = cr.from_blackjax(
        blackjax.ghmc, logdensity_fn=small_logdensity, adaptation="meads", num_folds=4
    )
    with pytest.raises(ValueError, match="num_folds=4 must divide"):
        cr.run(bad, jax.random.key(0), START6, 10, num_warmup=10, progress=False)


def test_keep_with_a_cross_chain_warmup():
    """keep= names are checked with the adapted kernel (its step needs the adapted params)."""

    def logdensity(x):
        return -0.5 * jnp.sum(x["a"] ** 2) - 0.5 * jnp.sum(x["b"] ** 2)

    chees = cr.from_blackjax(blackjax.dynamic_hmc, logdensity_fn=logdensity, adaptation="chees")
    x0 = {"a": jnp.zeros((4, 2)), "b": jnp.zeros((4, 3))}
    kw = {"num_warmup": 20, "progress": False, "warn": False}
    trace = cr.run(chees, jax.random.key(0), x0, 20, keep=["a"], **kw)
    assert sorted(trace.draws) == ["a"] and trace.draws["a"].shape == (4, 20, 2)
    with pytest.raises(ValueError, match="keep names"):
        cr.run(chees, jax.random.key(0), x0, 20, keep=["zz"], **kw)
