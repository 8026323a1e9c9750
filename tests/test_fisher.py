"""nutpie's Fisher-divergence adaptation in chainrunner's loop (``"fisher"``,
``"fisher_low_rank"``).

Known answers (moments of a correlated Gaussian within Monte-Carlo error) on 1, 2 and 8
devices with padding; the low-rank estimate equals blackjax's ``fisher_score_low_rank``
of the same draws; the same call gives the same draws, split or whole; the schedule is
nutpie's; wrong options are errors at ``from_blackjax`` time.
"""

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from mcse import mcse, mcse_sd

import chainrunner as cr
from chainrunner.adapters._blackjax import _warmup_fisher as wf
from chainrunner.core._lazy import lazy_cond

# A 4-d Gaussian, scales 0.1 to 10, with one strongly correlated pair.
SD = np.array([0.1, 1.0, 10.0, 3.0])
CORR = np.eye(4)
CORR[2, 3] = CORR[3, 2] = 0.9
COV = CORR * np.outer(SD, SD)
PREC = jnp.asarray(np.linalg.inv(COV), jnp.float32)


def logdensity(x):
    return -0.5 * x @ PREC @ x


X0 = jnp.full((5, 4), 0.5)  # 5 chains: padded on 2 and 8 devices


def _run(name, devices=1, n=1000, warmup=500, key=1, **kw):
    kernel = cr.from_blackjax(blackjax.nuts, logdensity_fn=logdensity, adaptation=name)
    return cr.run(kernel, jax.random.key(key), X0, n, num_warmup=warmup, progress=False,
                  mesh=cr.chain_mesh(devices), warn=False, **kw)  # fmt: skip


@pytest.mark.parametrize(
    "name, devices", [("fisher", 1), ("fisher", 8), ("fisher_low_rank", 2), ("fisher_low_rank", 8)]
)
def test_samples_a_correlated_gaussian(name, devices):
    trace = _run(name, devices)
    draws = np.asarray(trace.draws, dtype=np.float64)
    assert draws.shape == (5, 1000, 4)
    for j, scale in enumerate(SD):
        x = draws[..., j]
        assert abs(x.mean()) < 5 * mcse(x) + 1e-3 * scale, (j, x.mean())
        assert abs(x.std() - scale) < 5 * mcse_sd(x) + 1e-3 * scale, (j, x.std(), scale)
    params = cr.adapted_parameters(trace)
    assert params["step_size"].shape == (5,)
    # The step size is jittered around the adapted one, +-10%, on every draw.
    ratio = trace.stats["step_size"] / params["step_size"][:, None]
    assert 0.9 <= ratio.min() and ratio.max() <= 1.1 and ratio.std() > 0.03


def test_low_rank_finds_the_correlation():
    trace = _run("fisher_low_rank", 1)
    imm = cr.adapted_parameters(trace)["inverse_mass_matrix"]
    assert type(imm).__name__ == "LowRankInverseMassMatrix"
    # float32 and d = 4: min(10, d) directions
    assert imm.sigma.shape == (5, 4) and imm.U.shape == (5, 4, 4) and imm.lam.shape == (5, 4)
    for c in range(5):
        m = (
            np.diag(imm.sigma[c])
            @ (np.eye(4) + imm.U[c] @ np.diag(imm.lam[c] - 1) @ imm.U[c].T)
            @ np.diag(imm.sigma[c])
        )
        # The adapted inverse mass matrix is close to the covariance: its correlation too.
        r = m[2, 3] / np.sqrt(m[2, 2] * m[3, 3])
        assert 0.7 < r < 0.97, r
    # The diagonal one cannot see it, and takes longer trajectories for it.
    diag = _run("fisher", 1)
    assert diag.stats["n_steps"].mean() > 1.3 * trace.stats["n_steps"].mean()


def test_same_call_same_draws_split_or_whole():
    whole = _run("fisher_low_rank", 2, n=100, warmup=200)
    again = _run("fisher_low_rank", 2, n=100, warmup=200)
    np.testing.assert_array_equal(whole.draws, again.draws)
    # Warmup split over two calls continues bitwise.
    first = _run("fisher", 2, n=100, warmup=200)
    kernel = cr.from_blackjax(blackjax.nuts, logdensity_fn=logdensity, adaptation="fisher")
    half = cr.run(kernel, jax.random.key(1), X0, 50, num_warmup=200, progress=False,
                  mesh=cr.chain_mesh(2), warn=False)  # fmt: skip
    rest = cr.run(kernel, jax.random.key(1), half, 50, progress=False, warn=False)
    np.testing.assert_array_equal(first.draws[:, 50:], rest.draws)


def _correlated(d: int, dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    cov = q @ np.diag(np.geomspace(0.01, 10.0, d)) @ q.T
    x = (rng.multivariate_normal(np.zeros(d), cov, size=200) + 3.0).astype(dtype)
    g = -((x - 3.0) @ np.linalg.inv(cov)).astype(dtype)
    return x, g, cov


def _dense(p, d):
    s = np.diag(np.asarray(p.sigma, np.float64))
    u, lam = np.asarray(p.U, np.float64), np.asarray(p.lam, np.float64)
    return s @ (np.eye(d) + u @ np.diag(lam - 1) @ u.T) @ s


def _ours(x, g, rank, d):
    m = wf.CoMoments.empty(jnp.zeros(d, x.dtype))
    for xi, gi in zip(x, g, strict=True):
        m = m.add(jnp.asarray(xi), jnp.asarray(gi), jnp.bool_(True))
    m = m.add(jnp.asarray(x[0] + 100.0), jnp.asarray(g[0]), jnp.bool_(False))  # not counted
    # rank None: every direction (no subspace iteration, basis of width 0)
    width = 0 if rank is None else rank
    basis = jax.random.normal(jax.random.key(0), (d, width), x.dtype)
    start = jnp.stack([jnp.linalg.qr(basis)[0]] * 2)
    options = {**wf.LOW_RANK_OPTIONS, "max_rank": d if rank is None else rank}
    return wf.low_rank_metric(m, start, options, iterations=50)[0], options


@pytest.mark.parametrize("rank", [10, None])
def test_low_rank_estimate_is_blackjax_algorithm_1(rank):
    """In float64, nutpie's numbers: blackjax's ``fisher_score_low_rank`` of the draws."""
    from blackjax.adaptation.metric_estimators import fisher_score_low_rank

    d = 30
    assert wf.LOW_RANK_OPTIONS["max_rank"] is None  # nutpie's: every direction
    with jax.enable_x64(True):
        x, g, _ = _correlated(d, np.float64)
        ours, options = _ours(x, g, rank, d)
        ref = fisher_score_low_rank(jnp.asarray(x), jnp.asarray(g), options["max_rank"])
        np.testing.assert_allclose(ours.sigma, ref.sigma, rtol=1e-6)
        assert np.abs(_dense(ours, d) - _dense(ref, d)).max() < 1e-5 * np.abs(_dense(ref, d)).max()


def test_low_rank_estimate_in_float32_is_near_float64s():
    """In float32 the regularisation is kept within float32's resolution
    (``float32_regularisation``): the metric stays within a few percent of float64's."""
    d = 30
    x, g, _ = _correlated(d, np.float32)
    ours, _ = _ours(x, g, None, d)
    with jax.enable_x64(True):
        ref, _ = _ours(x.astype(np.float64), g.astype(np.float64), None, d)
    assert np.isfinite(np.asarray(ours.lam)).all()
    assert np.abs(_dense(ours, d) - _dense(ref, d)).max() < 0.05 * np.abs(_dense(ref, d)).max()


def test_rank_of():
    assert wf.rank_of({"max_rank": None}, 100, jnp.float32) == 100  # float32 too
    assert wf.rank_of({"max_rank": None}, 100, np.float64) == 100
    assert wf.rank_of({"max_rank": None}, 300, np.float64) == wf.FULL_RANK_LIMIT == 100
    assert wf.rank_of({"max_rank": 30}, 12, jnp.float32) == 12


def test_schedule_is_nutpies():
    s = wf.schedule(1000, wf.OPTIONS)
    assert not s.adapts_metric[850:].any() and s.adapts_metric[:850].all()
    switches = np.flatnonzero(s.switch)
    # every 10 draws in the first 30% (the initial point counts), then windows of
    # 80, 120 (x1.5), ... while one still fits before the step-size-only window.
    np.testing.assert_array_equal(switches[:3], [8, 18, 28])
    assert switches[switches < 300].size == 30
    np.testing.assert_array_equal(switches[switches >= 300], [378, 498])


def test_lazy_cond_under_vmap_and_map():
    f = lambda p, x: lazy_cond(p, lambda x: x * 2.0, lambda x: x + 1.0, x)  # noqa: E731
    p = jnp.array([True, False, True])
    x = jnp.arange(3.0)
    np.testing.assert_array_equal(jax.vmap(f)(p, x), [0.0, 2.0, 4.0])
    np.testing.assert_array_equal(jax.lax.map(lambda a: f(*a), (p, x)), [0.0, 2.0, 4.0])
    np.testing.assert_array_equal(jax.vmap(f, (None, 0))(jnp.bool_(False), x), x + 1.0)
    np.testing.assert_array_equal(jax.jit(jax.vmap(f))(p, x), [0.0, 2.0, 4.0])


@pytest.mark.parametrize(
    "options, error, match",
    [
        ({"switch_fraq": 80}, TypeError, "unknown option.*switch_fraq"),
        ({"early_window": 0.9}, ValueError, "early_window \\+ step_size_window"),
        ({"target_acceptance_rate": 1.5}, ValueError, "target_acceptance_rate must be in"),
        ({"switch_freq": 0}, ValueError, "switch_freq must be a positive integer"),
        ({"window_growth": 0.5}, ValueError, "window_growth must be >= 1"),
        ({"max_rank": 3}, TypeError, "unknown option.*max_rank"),  # diagonal only
        ({"update_freq": True}, ValueError, "update_freq must be a positive integer"),
    ],
)
def test_errors_at_from_blackjax(options, error, match):
    with pytest.raises(error, match=match):
        cr.from_blackjax(blackjax.nuts, logdensity_fn=logdensity, adaptation="fisher", **options)


def test_factory_errors():
    with pytest.raises(TypeError, match="no inverse_mass_matrix"):
        cr.from_blackjax(blackjax.mala, logdensity_fn=logdensity, adaptation="fisher_low_rank")
    k = cr.from_blackjax(
        blackjax.hmc, logdensity_fn=logdensity, adaptation="fisher", num_integration_steps=5
    )
    trace = cr.run(k, jax.random.key(0), X0, 20, num_warmup=20, progress=False, warn=False)
    assert trace.draws.shape == (5, 20, 4)


def _decompositions(jaxpr):
    """The operand shapes of every ``eigh`` and ``qr`` in ``jaxpr``, at any depth."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in ("eigh", "householder_product", "geqrf", "qr"):
            found.append(eqn.invars[0].aval.shape)
        for value in eqn.params.values():
            for v in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(v, "jaxpr", v)
                if hasattr(inner, "eqns"):
                    found += _decompositions(inner)
    return found


@pytest.mark.parametrize("width", [0, 3])
def test_the_update_decomposes_one_chain_at_a_time_under_vmap(width):
    """jax 0.10's batched ``eigh`` beside other work on 2 CPU devices never returned (a
    vmapped 100-d PyMC model hung): the update's ``eigh`` and ``qr`` see one chain's
    matrices, however many chains the vmap holds."""
    d, chains = 8, 3
    x, g, _ = (jnp.asarray(a) for a in _correlated(d, np.float32))
    m = wf.CoMoments.empty(x[0])
    m = jax.lax.fori_loop(0, 50, lambda i, m: m.add(x[i], g[i], jnp.bool_(True)), m)
    batch = jax.tree.map(lambda a: jnp.stack([a] * chains), m)
    basis = jnp.stack([jnp.eye(d)[:, :width]] * 2)
    options = {**wf.LOW_RANK_OPTIONS, "max_rank": d if width == 0 else width}
    update = jax.vmap(lambda m: wf.low_rank_metric(m, basis, options)[0])
    shapes = _decompositions(jax.make_jaxpr(update)(batch).jaxpr)
    assert shapes and all(len(s) == 2 for s in shapes), shapes
    looped, batched = update(batch), wf.low_rank_metric(m, basis, options)[0]
    for a, b in zip(jax.tree.leaves(looped), jax.tree.leaves(batched), strict=True):
        np.testing.assert_array_equal(a[1], b)


def test_the_low_rank_update_counts_at_its_share_of_the_steps():
    """The layout rule counts the update's arithmetic at one draw in ``update_freq``: a
    50-d model's step is not priced as an eigendecomposition every draw."""
    from chainrunner.programs import _jaxpr

    prec = jnp.eye(50)
    kernel = cr.from_blackjax(blackjax.nuts, logdensity_fn=lambda x: -0.5 * x @ prec @ x,
                              adaptation="fisher_low_rank")  # fmt: skip
    trace = cr.run(kernel, jax.random.key(0), jnp.zeros((2, 50)), 4, num_warmup=20,
                   progress=False, warn=False)  # fmt: skip
    counted = trace.attrs["batch_size_choice"]
    flops = float(counted.split(" flops a step")[0].rsplit(" ", 1)[1])
    assert flops < 1e6, counted  # 4.4e5; the update in full on every draw: 3.2e6
    cond = jax.make_jaxpr(lambda p, x: lazy_cond(p, lambda x: x @ prec, lambda x: x, x, 0.1))
    assert _jaxpr._costly_share(cond(True, jnp.ones(50)).jaxpr.eqns[0]) == 0.1
    unsaid = jax.make_jaxpr(lambda p, x: lazy_cond(p, lambda x: x @ prec, lambda x: x, x))
    assert _jaxpr._costly_share(unsaid(True, jnp.ones(50)).jaxpr.eqns[0]) is None
