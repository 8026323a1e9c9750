"""The Fisher adaptation pooled over all chains (``pooled=True``).

Batched estimator updates equal one draw at a time; moments of a correlated Gaussian
within Monte-Carlo error on 1, 2 and 8 devices with padding; bitwise the same on any
device count for the same batch width; one shared step size and mass matrix, which a
continued run keeps; with many chains and a short warmup the pooled estimate is closer to
the target's covariance than the per-chain ones; wrong options are errors before any work.
"""

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from mcse import mcse, mcse_sd
from test_fisher import PREC, SD, logdensity  # the same correlated 4-d Gaussian

import chainrunner as cr
from chainrunner.adapters._blackjax import _warmup_fisher as wf


def _kernel(name="fisher_low_rank", **options):
    return cr.from_blackjax(
        blackjax.nuts, logdensity_fn=logdensity, adaptation=name, pooled=True, **options
    )


def _run(name="fisher_low_rank", devices=1, chains=5, n=1000, warmup=500, key=1, **kw):
    x0 = jnp.full((chains, 4), 0.5)
    return cr.run(_kernel(name), jax.random.key(key), x0, n, num_warmup=warmup, progress=False,
                  mesh=cr.chain_mesh(devices), warn=False, **kw)  # fmt: skip


def _dense(imm):
    if not hasattr(imm, "sigma"):
        return np.diag(imm)
    s = np.diag(imm.sigma)
    return s @ (np.eye(len(imm.sigma)) + imm.U @ np.diag(imm.lam - 1) @ imm.U.T) @ s


def test_batched_updates_equal_one_draw_at_a_time():
    rng = np.random.default_rng(0)
    x, g = rng.normal(size=(2, 30, 5)) * [1.0, 3.0, 0.1, 10.0, 1.0]
    good = rng.random(30) > 0.2
    one = wf.CoMoments.empty(jnp.zeros(5, jnp.float32))
    for xi, gi, ok in zip(x, g, good, strict=True):
        one = one.add(jnp.asarray(xi, jnp.float32), jnp.asarray(gi, jnp.float32), jnp.bool_(ok))
    batched = wf.CoMoments.empty(jnp.zeros(5, jnp.float32))
    for rows in (slice(0, 1), slice(1, 17), slice(17, 30)):
        batched = batched.add(jnp.asarray(x[rows], jnp.float32), jnp.asarray(g[rows], jnp.float32),
                              jnp.asarray(good[rows]))  # fmt: skip
    assert float(batched.moments.weight) == good.sum()
    for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(batched), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    # The diagonal estimator is the same update.
    diag = wf.Moments.empty(jnp.zeros(5)).add(jnp.asarray(x), jnp.asarray(g), jnp.asarray(good))
    np.testing.assert_allclose(diag.m2_x, np.var(x[good], axis=0) * good.sum(), rtol=1e-5)


@pytest.mark.parametrize(
    "name, devices", [("fisher", 1), ("fisher_low_rank", 2), ("fisher_low_rank", 8)]
)
def test_pooled_samples_a_correlated_gaussian(name, devices):
    trace = _run(name, devices, keep_warmup=True)
    draws = np.asarray(trace.draws, dtype=np.float64)
    assert draws.shape == (5, 1000, 4)
    for j, scale in enumerate(SD):
        x = draws[..., j]
        assert abs(x.mean()) < 5 * mcse(x) + 1e-3 * scale, (j, x.mean())
        assert abs(x.std() - scale) < 5 * mcse_sd(x) + 1e-3 * scale, (j, x.std(), scale)
    params = cr.adapted_parameters(trace)
    assert params["step_size"].shape == ()  # one for every chain
    imm = params["inverse_mass_matrix"]
    assert (
        (imm.sigma.shape, imm.U.shape) == ((4,), (4, 4)) if name != "fisher" else imm.shape == (4,)
    )
    # The step size is jittered around the adapted one, +-10%, on every draw.
    ratio = trace.stats["step_size"] / params["step_size"]
    assert 0.9 <= ratio.min() and ratio.max() <= 1.1 and ratio.std() > 0.03
    assert trace.attrs["adaptation"] == name and trace.attrs["adaptation_pooled"] == 1
    assert trace.warmup_stats["n_steps"].shape == (5, 500)
    assert trace.warmup_draws.shape == (5, 500, 4)


@pytest.mark.parametrize("name", ["fisher", "fisher_low_rank"])
def test_same_draws_on_any_device_count_and_a_continued_run_keeps_the_parameters(name):
    # 5 chains in batches of 2: 3 batches on 1 device (1 padding row), 2 on each of 2
    # devices (3 padding rows, one batch of padding only).
    runs = [_run(name, devices=d, n=50, warmup=100, batch_size=2, keep_warmup=True)
            for d in (1, 2)]  # fmt: skip
    for other in runs[1:]:
        first, params = jax.tree.leaves(runs[0].kernel_params), jax.tree.leaves(other.kernel_params)
        for a, b in zip(first, params, strict=True):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(runs[0].warmup_draws, other.warmup_draws)
        np.testing.assert_array_equal(runs[0].draws, other.draws)
    # a continued run samples on with the adapted parameters
    more = cr.run(_kernel(name), jax.random.key(1), runs[0], 50, progress=False, warn=False)
    assert more.draws.shape == (5, 50, 4)
    for a, b in zip(jax.tree.leaves(runs[0].kernel_params), jax.tree.leaves(more.kernel_params),
                    strict=True):  # fmt: skip
        np.testing.assert_array_equal(a, b)
    jax.tree.map(np.testing.assert_array_equal, cr.adapted_parameters(more),
                 cr.adapted_parameters(runs[0]))  # fmt: skip


def student_t(x):  # heavier tails than a Gaussian: the Fisher estimate is not exact
    return -0.5 * (5 + 4) * jnp.log1p(x @ PREC @ x / 5)


def test_many_chains_adapt_from_all_their_draws():
    # 32 chains, a warmup of 100 draws: one estimate from 32 x 85 draws, not 32 of 85.
    # Two pooled estimates (two keys) agree far better than two chains' own do.
    def adapted(key, **options):
        kernel = cr.from_blackjax(blackjax.nuts, logdensity_fn=student_t,
                                  adaptation="fisher_low_rank", **options)  # fmt: skip
        trace = cr.run(kernel, jax.random.key(key), jnp.full((32, 4), 0.5), 10, num_warmup=100,
                       progress=False, warn=False)  # fmt: skip
        return cr.adapted_parameters(trace)["inverse_mass_matrix"]

    w = np.diag(1 / SD)  # each error in the target's own scale

    def gap(m1, m2):
        return np.linalg.norm(w @ (_dense(m1) - _dense(m2)) @ w)

    pooled = gap(adapted(1, pooled=True), adapted(2, pooled=True))
    each = adapted(1)
    chain = [jax.tree.map(lambda a, c=c: a[c], each) for c in range(32)]
    per_chain = [gap(chain[c], chain[c + 1]) for c in range(0, 32, 2)]
    assert pooled < 0.5 * np.median(per_chain), (pooled, np.median(per_chain))


def test_errors_before_any_work():
    with pytest.raises(TypeError, match="pooled must be True or False"):
        cr.from_blackjax(blackjax.nuts, logdensity_fn=logdensity, adaptation="fisher", pooled=1)
    with pytest.raises(ValueError, match="pooled=True needs num_warmup > 0"):
        cr.run(_kernel(), jax.random.key(0), jnp.zeros((4, 4)), 10, progress=False)
