"""The low-rank metric at the width its informative directions need (``_low_rank_width``).

Each operation equals blackjax's every-column metric (within rounding), the gradient of
the kinetic energy included; a chain's result does not depend on which chains share its
batch (bit for bit); a ``fisher_low_rank`` run whose warmup keeps a few of 16 directions
samples a correlated Gaussian within Monte-Carlo error, and the same call gives the same
draws.
"""

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from blackjax.mcmc.metrics import LowRankInverseMassMatrix, default_metric
from mcse import mcse, mcse_sd

import chainrunner as cr
from chainrunner.adapters._blackjax import _low_rank_width as lw
from chainrunner.core._lazy import lazy_switch

D, RANK = 20, 16


def _imm(kept: int, seed: int = 0) -> LowRankInverseMassMatrix:
    """A Fisher-like metric: ``kept`` informative directions first, the rest masked to 1."""
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.normal(size=(D, RANK)))
    lam = np.ones(RANK)
    lam[:kept] = rng.choice([0.1, 5.0], kept) * rng.uniform(1, 2, kept)
    sigma = rng.uniform(0.5, 2.0, D)
    return LowRankInverseMassMatrix(*(jnp.asarray(a, jnp.float32) for a in (sigma, u, lam)))


def _operations(metric, p, q, key):
    """Every operation NUTS calls, and the kinetic energy's gradient."""
    ops = {
        "kinetic": metric.kinetic_energy(p),
        "grad": jax.grad(metric.kinetic_energy)(p),
        "turning": metric.check_turning(p, q, p + q),
        "momentum": metric.sample_momentum(key, p),
    }
    for inv in (False, True):
        for trans in (False, True):
            ops[f"scale{inv:d}{trans:d}"] = metric.scale(p, q, inv=inv, trans=trans)
    return ops


@pytest.mark.parametrize("kept", [0, 3, 8, 12])
def test_every_operation_is_blackjaxs(kept):
    imm = _imm(kept)
    p, q = jax.random.normal(jax.random.key(1), (2, D))
    ours = _operations(lw.following_metric(imm), p, q, jax.random.key(2))
    theirs = _operations(default_metric(imm), p, q, jax.random.key(2))
    for name, value in ours.items():
        np.testing.assert_allclose(value, theirs[name], rtol=2e-5, atol=2e-5, err_msg=name)
    assert int(lw.width_index(imm.lam, lw.widths(RANK))) == (0 if kept <= 8 else 1)


def test_a_chain_does_not_depend_on_its_batch():
    """Chain 0 (narrow) alone, beside a narrow chain and beside a wide one: the same bits."""
    imms = [_imm(2, 0), _imm(3, 1), _imm(12, 2)]
    p = jax.random.normal(jax.random.key(3), (3, D))

    def ops(imm, p):
        return _operations(lw.following_metric(imm), p, 0.5 * p, jax.random.key(4))

    def batch(rows):
        stack = jax.tree.map(lambda *a: jnp.stack(a), *[imms[r] for r in rows])
        return jax.jit(jax.vmap(ops))(stack, p[jnp.array(rows)])

    alone = jax.jit(ops)(imms[0], p[0])
    for rows in ([0, 1], [0, 2], [0, 2, 1]):
        out = batch(rows)
        for name, value in alone.items():
            np.testing.assert_array_equal(out[name][0], value, err_msg=f"{rows} {name}")


def test_lazy_switch_under_vmap_map_and_grad_free_branches():
    f = lambda i, x: lazy_switch(i, [lambda x: x, lambda x: x * 2.0, lambda x: -x], x)  # noqa: E731
    i, x = jnp.array([2, 0, 1, 1]), jnp.arange(4.0)
    expected = [0.0, 1.0, 4.0, 6.0]
    np.testing.assert_array_equal(jax.vmap(f)(i, x), expected)
    np.testing.assert_array_equal(jax.jit(jax.vmap(f))(i, x), expected)
    np.testing.assert_array_equal(jax.lax.map(lambda a: f(*a), (i, x)), expected)
    np.testing.assert_array_equal(jax.vmap(f, (None, 0))(jnp.int32(1), x), 2.0 * x)


# A 16-d Gaussian (the narrow width runs from 16 directions on): scales 0.1 to 10, one
# strongly correlated pair (one direction to keep).
SD = np.geomspace(0.1, 10.0, 16)
CORR = np.eye(16)
CORR[14, 15] = CORR[15, 14] = 0.95
PREC = jnp.asarray(np.linalg.inv(CORR * np.outer(SD, SD)), jnp.float32)
X0 = jnp.full((5, 16), 0.5)  # 5 chains: padded on 2 devices


def _run(devices, batch_size="auto", n=1000, warmup=500):
    kernel = cr.from_blackjax(
        blackjax.nuts, logdensity_fn=lambda x: -0.5 * x @ PREC @ x, adaptation="fisher_low_rank"
    )
    return cr.run(kernel, jax.random.key(0), X0, n, num_warmup=warmup, progress=False,
                  mesh=cr.chain_mesh(devices), batch_size=batch_size, warn=False)  # fmt: skip


def test_a_few_directions_sample_the_gaussian_at_the_narrow_width():
    trace = _run(2)
    imm = cr.adapted_parameters(trace)["inverse_mass_matrix"]
    assert imm.U.shape == (5, 16, 16)
    kept = np.asarray(imm.lam != 1).sum(axis=1)
    assert 1 <= kept.min() and kept.max() <= 8, kept  # the width-8 branch ran
    draws = np.asarray(trace.draws, np.float64)
    for j, scale in enumerate(SD):
        x = draws[..., j]
        assert abs(x.mean()) < 5 * mcse(x) + 1e-3 * scale, (j, x.mean())
        assert abs(x.std() - scale) < 5 * mcse_sd(x) + 1e-3 * scale, (j, x.std(), scale)


@pytest.mark.parametrize("devices, batch_size", [(1, 1), (2, None)])
def test_same_call_same_draws(devices, batch_size):
    first = _run(devices, batch_size, n=100, warmup=200)
    again = _run(devices, batch_size, n=100, warmup=200)
    np.testing.assert_array_equal(first.draws, again.draws)
