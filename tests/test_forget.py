"""warmup_until=: warmup of adaptive length, ended when nested R-hat says the chains forgot."""

import warnings

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chainrunner as cr
from chainrunner.output._diagnostics import ChainrunnerWarning
from chainrunner.pipeline import _forget


def _logdensity(x):
    return -0.5 * jnp.sum(x**2)


NUTS = blackjax.nuts(_logdensity, 0.9, jnp.ones(2))
# Two superchains of 6 chains, started far apart (12 chains: padding on 8 devices).
X0 = jnp.repeat(jnp.array([[-8.0, 8.0], [8.0, -8.0]], jnp.float32), 6, axis=0)
KW = {"progress": False, "warn": False, "superchains": 2}
TARGET = cr.Forgotten(window=20, max_draws=400)


def _ar1(rho):
    def step(rng_key, x):
        return rho * x + jnp.sqrt(1 - rho**2) * jax.random.normal(rng_key, x.shape), {}

    return cr.Kernel(init=lambda position, rng_key: position, step=step)


@pytest.mark.parametrize("devices", [1, 2, 8])
def test_fixed_kernel_equals_fixed_run_with_longer_warmup(devices):
    """Without adaptation the burn-in is warmup steps: same draws as num_warmup larger by B."""
    mesh = cr.chain_mesh(devices)
    trace = cr.run(NUTS, jax.random.key(0), X0, 60, warmup_until=TARGET, mesh=mesh, **KW)
    burned = trace.attrs["burn_in_steps"]
    assert trace.attrs["warmup_forgotten"] and 0 < burned <= 400 and burned % 20 == 0
    assert trace.attrs["burn_in_nested_rhat"] <= 1.01
    fixed = cr.run(NUTS, jax.random.key(0), X0, 60, num_warmup=burned, mesh=mesh, **KW)
    assert np.array_equal(trace.draws, fixed.draws)
    for name in fixed.stats:
        assert np.array_equal(trace.stats[name], fixed.stats[name]), name
    assert trace.num_steps == fixed.num_steps == burned + 60
    more, more_fixed = (cr.run(NUTS, jax.random.key(0), t, 20, **KW) for t in (trace, fixed))
    assert np.array_equal(more.draws, more_fixed.draws)  # the final state is the same too


def test_window_adaptation_then_windows_with_thinning_and_kept_warmup():
    """The adaptation runs as without the option; the added windows are kept as warmup."""
    nuts = cr.from_blackjax(blackjax.nuts, logdensity_fn=_logdensity, adaptation="window")
    kw = {**KW, "num_warmup": 40, "thinning": 2, "keep_warmup": True, "chunk_size": 7}
    # window 4 > the last 4 of 20 adaptation draws (the adaptation is still moving them)
    trace = cr.run(nuts, jax.random.key(1), X0, 60, warmup_until=cr.Forgotten(window=4), **kw)
    burned = trace.attrs["burn_in_steps"]
    assert trace.attrs["warmup_forgotten"] and burned % 8 == 0
    kw.pop("chunk_size")
    fixed = cr.run(nuts, jax.random.key(1), X0, 60 + burned, **kw)
    b = burned // 2
    assert np.array_equal(trace.draws, fixed.draws[:, b:])
    assert np.array_equal(
        trace.warmup_draws, np.concatenate([fixed.warmup_draws, fixed.draws[:, :b]], 1)
    )
    assert trace.warmup_draws.shape == (12, 20 + b, 2)
    assert trace.num_steps == fixed.num_steps


def test_long_enough_adaptation_adds_nothing():
    # At stationarity the first window's nested R-hat (12 chains of 20 draws, 2 superchains,
    # iid normal draws, 4000 simulations) exceeds 1.01 in 35% of runs and 1.05 in 0.03%:
    # a chain that forgot passes the looser target on the first window, whatever the seed.
    target = cr.Forgotten(nested_rhat=1.05, window=20, max_draws=400)
    nuts = cr.from_blackjax(blackjax.nuts, logdensity_fn=_logdensity, adaptation="window")
    trace = cr.run(nuts, jax.random.key(2), X0, 40, num_warmup=200, warmup_until=target, **KW)
    assert trace.attrs["warmup_forgotten"] and trace.attrs["burn_in_steps"] == 0
    fixed = cr.run(nuts, jax.random.key(2), X0, 40, num_warmup=200, **KW)
    assert np.array_equal(trace.draws, fixed.draws)


def test_cross_chain_warmup_then_windows_keeps_every_warmup_stat():
    chees = cr.from_blackjax(blackjax.dynamic_hmc, logdensity_fn=_logdensity, adaptation="chees")
    trace = cr.run(
        chees, jax.random.key(3), X0, 40, num_warmup=30, warmup_until=TARGET,
        keep_warmup=True, **KW,
    )  # fmt: skip
    burned = trace.attrs["burn_in_steps"]
    assert trace.attrs["warmup_forgotten"] and burned > 0
    assert trace.warmup_draws.shape == (12, 30 + burned, 2)
    for name, x in trace.warmup_stats.items():
        assert x.shape == (12, 30 + burned), name
    # step_size is a warmup stat only: NaN in the added windows, never dropped
    assert np.isnan(trace.warmup_stats["step_size"][:, 30:]).all()


def test_cap_warns_and_records_not_forgotten():
    sticky = _ar1(0.999)  # moves too slowly to forget in 40 draws
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace = cr.run(
            sticky, jax.random.key(4), X0, 10, warmup_until=cr.Forgotten(window=20, max_draws=40),
            **KW,
        )  # fmt: skip
    messages = [str(w.message) for w in caught if issubclass(w.category, ChainrunnerWarning)]
    assert any("after 40 added warmup draws nested R-hat is still" in m for m in messages)
    assert trace.attrs["warmup_forgotten"] is False and trace.attrs["burn_in_steps"] == 40
    assert trace.draws.shape == (12, 10, 2)


def test_stuck_chains_are_not_forgotten():
    still = cr.Kernel(init=lambda position, rng_key: position, step=lambda k, x: (x, {}))
    with pytest.warns(ChainrunnerWarning, match="nested R-hat is not finite"):
        trace = cr.run(
            still, jax.random.key(5), X0, 5, warmup_until=cr.Forgotten(window=4, max_draws=8),
            **KW,
        )  # fmt: skip
    assert trace.attrs["warmup_forgotten"] is False


def test_many_short_chains_moments_after_adaptive_warmup():
    """1,024 AR(1) chains in 16 superchains: forgotten, then the moments are right."""
    far = np.random.default_rng(1).normal(size=(16, 1, 2)) * 5
    start = jnp.asarray(np.repeat(far, 64, axis=1).reshape(1024, 2), jnp.float32)
    trace = cr.run(
        _ar1(0.9), jax.random.key(6), start, 20, superchains=16, progress=False, warn=False,
        warmup_until=cr.Forgotten(window=10, max_draws=500),
    )  # fmt: skip
    assert trace.attrs["warmup_forgotten"] and 0 < trace.attrs["burn_in_steps"] < 500
    x = np.asarray(trace.draws, np.float64)
    # 1024 x 20 draws of an AR(1) with rho 0.9: ESS about 1024 * 20 * 0.1 / 1.9 ~ 1078
    se = 1.0 / np.sqrt(1000)
    np.testing.assert_allclose(x.mean(axis=(0, 1)), 0.0, atol=5 * se)
    np.testing.assert_allclose(x.var(axis=(0, 1)), 1.0, atol=5 * np.sqrt(2) * se)


def test_errors():
    with pytest.raises(ValueError, match="warmup_until needs superchains"):
        cr.run(NUTS, jax.random.key(0), X0, 10, warmup_until=TARGET, progress=False)
    with pytest.raises(TypeError, match=r"warmup_until must be None or cr\.Forgotten"):
        cr.run(NUTS, jax.random.key(0), X0, 10, warmup_until=1.01, **KW)
    for bad, match in (
        (cr.Forgotten(nested_rhat=0.9), "nested_rhat must be a number >= 1"),
        (cr.Forgotten(window=3), "window must be an int >= 4"),
        (cr.Forgotten(window=10, max_draws=25), "max_draws=25 must be a multiple"),
    ):
        with pytest.raises(ValueError, match=match):
            cr.run(NUTS, jax.random.key(0), X0, 10, warmup_until=bad, **KW)
    with pytest.raises(ValueError, match="does not work with checkpoint"):
        cr.run(NUTS, jax.random.key(0), X0, 10, warmup_until=TARGET, checkpoint="x", **KW)
    trace = cr.run(NUTS, jax.random.key(0), X0, 10, **KW)
    with pytest.raises(ValueError, match="applies to a fresh run"):
        cr.run(NUTS, jax.random.key(0), trace, 10, warmup_until=TARGET, **KW)


def test_join_warmup_without_parts():
    part = ({"x": np.zeros((2, 3))}, {"lp": np.zeros((2, 3))})
    assert _forget.join_warmup((None, None), part) is part
    assert _forget.join_warmup(part, None) is part


def test_an_element_constant_everywhere_does_not_block_forgetting():
    """A constant element (a Cholesky factor's zero, a constant Deterministic) has no
    nested R-hat (0 / 0): it says nothing about mixing and is left out."""

    def step(rng_key, s):
        x = 0.5 * s["x"] + jax.random.normal(rng_key, s["x"].shape)
        return {"x": x, "one": s["one"]}, {}

    kernel = cr.Kernel(init=lambda position, rng_key: position, step=step)
    start = {"x": X0, "one": jnp.ones((12, 1))}
    trace = cr.run(kernel, jax.random.key(7), start, 10, warmup_until=TARGET, **KW)
    assert trace.attrs["warmup_forgotten"] and trace.attrs["burn_in_steps"] < 400
