"""until=: runs that stop when the targets are met; superchains and nested R-hat."""

import json
import warnings

import arviz as az
import blackjax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from interrupting import InterruptingBar

import chainrunner as cr
from chainrunner.output._diagnostics import ChainrunnerWarning
from chainrunner.pipeline import _run
from chainrunner.stopping import _convergence

NUTS = blackjax.nuts(lambda x: -0.5 * jnp.sum(x**2), 0.9, jnp.ones(3))
X0 = jnp.asarray(np.random.default_rng(0).normal(size=(6, 3)), jnp.float32)
KW = {"mesh": cr.chain_mesh(2), "progress": False, "warn": False, "chunk_size": 20}
TARGET = cr.Converged(ess_bulk=300, ess_tail=300, min_draws=40)


def _arviz(x, method):
    fn = az.rhat if method == "rank" else az.ess
    kw = {"method": method}
    out = fn({"a": x}, **kw)["a"]
    return np.asarray(out.values, float)


@pytest.mark.parametrize("seed", range(6))
def test_vectorised_diagnostics_equal_arviz(seed):
    rng = np.random.default_rng(seed)
    m, n = int(rng.integers(2, 9)), int(rng.integers(4, 300))
    x = rng.normal(size=(m, n, 4))
    x[:, :, 0] = np.cumsum(x[:, :, 0], axis=1) * 0.3 + x[:, :, 0]  # autocorrelated
    x[:, :, 1] = np.round(x[:, :, 1])  # ties
    x[:, :, 2] += np.arange(m)[:, None]  # chains disagree
    x[:, :, 3] = x[:, :, 3] > 1.0  # an indicator
    for name, ours, method in (
        ("rhat", _convergence.rhat, "rank"),
        ("bulk", _convergence.ess_bulk, "bulk"),
        ("tail", _convergence.ess_tail, "tail"),
    ):
        expected = np.array([_arviz(x[:, :, j], method) for j in range(4)])
        np.testing.assert_allclose(ours(x), expected, rtol=1e-9, err_msg=name)
        together = _convergence.rhat_and_ess(x)[("rhat", "bulk", "tail").index(name)]
        np.testing.assert_allclose(together, expected, rtol=1e-9, err_msg=name)


@pytest.mark.parametrize("draws", [120, 1100])  # autocovariances by Gram matrix, by FFT
def test_float32_draws_with_ties_equal_arviz(draws):
    """float32 draws (sorted as packed keys) with ties within and between the folded
    halves; superchains; many chains in column blocks on threads."""
    rng = np.random.default_rng(draws)
    m = 64 if draws < 1000 else 4
    x = rng.normal(size=(m, draws, 3)).astype(np.float32)
    x[:, :, 1] = np.round(x[:, :, 1] * 4) / 4  # many ties, folded ties across the median
    # column 2: repeated draws (a rejected proposal keeps the draw before it)
    x[:, 1:, 2] = np.where(rng.uniform(size=(m, draws - 1)) < 0.3, x[:, :-1, 2], x[:, 1:, 2])
    x = x.astype(np.float64)
    r, bulk, tail = _convergence.rhat_and_ess(x)
    for ours, method in ((r, "rank"), (bulk, "bulk"), (tail, "tail")):
        expected = np.array([_arviz(x[:, :, j], method) for j in range(3)])
        np.testing.assert_allclose(ours, expected, rtol=1e-9, err_msg=method)
    blocks = _convergence._BLOCK_VALUES
    try:
        _convergence._BLOCK_VALUES = x.shape[0] * x.shape[1]  # a block per column
        np.testing.assert_array_equal(_convergence.rhat_and_ess(x)[1], bulk)
    finally:
        _convergence._BLOCK_VALUES = blocks


def test_average_ranks_equal_scipy():
    from scipy.stats import rankdata

    x = np.round(np.random.default_rng(7).normal(size=(301, 5)), 1)  # many ties
    np.testing.assert_array_equal(
        _convergence.average_ranks(x), rankdata(x, method="average", axis=0)
    )
    single = np.random.default_rng(8).normal(size=(300_000, 2)).astype(np.float32)
    single[:5, 0] = [-0.0, 0.0, np.inf, -np.inf, 0.0]  # signed zeros tie; infinities
    np.testing.assert_array_equal(
        _convergence.average_ranks(single.astype(np.float64)),
        rankdata(single, method="average", axis=0),
    )


def test_nested_rhat_equals_arviz_stats():
    arviz_stats = pytest.importorskip(
        "arviz_stats", reason="arviz 0.x has no nested R-hat to compare with (arviz >= 1 does)"
    )
    rng = np.random.default_rng(3)
    x = rng.normal(size=(12, 50, 3)) + np.repeat(rng.normal(size=(4, 1, 3)), 3, axis=0) * 0.2
    ids = np.arange(12) // 3
    expected = arviz_stats.rhat_nested(x, superchain_ids=list(ids), chain_axis=0, draw_axis=1)
    np.testing.assert_allclose(_convergence.nested_rhat(x, ids), expected, rtol=1e-9)


def test_stops_when_converged_and_draws_are_a_prefix_of_a_fixed_run():
    trace = cr.run(NUTS, jax.random.key(0), X0, 5000, until=TARGET, **KW)
    a = trace.attrs
    assert a["stopped"] == "converged"
    n = trace.num_draws
    assert 40 <= n < 5000 and n % 20 == 0 and a["until_checked_at_draw"] == n
    assert a["until_rhat"] <= 1.01 and min(a["until_ess_bulk"], a["until_ess_tail"]) >= 300
    fixed = cr.run(NUTS, jax.random.key(0), X0, n, **KW)
    np.testing.assert_array_equal(trace.draws, fixed.draws)
    for k in fixed.stats:
        np.testing.assert_array_equal(trace.stats[k], fixed.stats[k])
    np.testing.assert_array_equal(trace.final_state.position, fixed.final_state.position)
    assert trace.num_steps == n
    # the answer: standard normal moments, within Monte-Carlo error
    summary = az.summary(trace.to_arviz())
    assert np.all(np.abs(summary["mean"] / summary["mcse_mean"]) < 4.5)


def test_num_samples_is_the_cap():
    trace = cr.run(NUTS, jax.random.key(1), X0, 60, until=cr.Converged(ess_bulk=1e9), **KW)
    assert trace.attrs["stopped"] == "cap" and trace.num_draws == 60


def test_thinning_keep_and_continuation():
    start = {"a": X0[:, :2], "b": X0[:, 2]}
    nuts = blackjax.nuts(lambda p: -0.5 * (jnp.sum(p["a"] ** 2) + p["b"] ** 2), 0.9, jnp.ones(3))
    kw = {**KW, "thinning": 2}
    trace = cr.run(nuts, jax.random.key(2), start, 4000, until=TARGET, keep="b", **kw)
    assert trace.attrs["stopped"] == "converged" and set(trace.draws) == {"b"}
    fixed = cr.run(nuts, jax.random.key(2), start, 2 * trace.num_draws, keep="b", **kw)
    np.testing.assert_array_equal(trace.draws["b"], fixed.draws["b"])
    more = cr.run(nuts, jax.random.key(2), trace, 4000, until=TARGET, keep="b", **kw)
    assert more.attrs["stopped"] == "converged" and more.attrs["first_step"] == trace.num_steps


def test_resumed_run_stops_where_the_uninterrupted_one_did(tmp_path, monkeypatch):
    args = (NUTS, jax.random.key(3), X0, 5000)
    full = cr.run(*args, until=TARGET, **KW)
    stop = full.num_draws
    assert stop >= 60  # so that the interrupted run below stopped before converging
    monkeypatch.setattr(_run, "progress_bar", lambda *a, **k: InterruptingBar(at=3))
    with pytest.warns(ChainrunnerWarning, match="interrupted"):
        cr.run(*args, until=TARGET, checkpoint=tmp_path / "c", **KW)
    monkeypatch.undo()
    resumed = cr.run(*args, until=TARGET, checkpoint=tmp_path / "c", **KW)
    assert resumed.attrs["resumed_from_draw"] == 40 and resumed.num_draws == stop
    np.testing.assert_array_equal(resumed.draws, full.draws)
    again = cr.run(*args, until=TARGET, checkpoint=tmp_path / "c", **KW)  # all on disk
    assert again.attrs["resumed_from_draw"] == stop and again.attrs["stopped"] == "converged"
    np.testing.assert_array_equal(again.draws, full.draws)
    with open(tmp_path / "c" / "manifest.json") as f:
        assert json.load(f)["chunks"][-1]["end"] == stop  # the chunk in flight was not kept
    with pytest.raises(ValueError, match=r"belongs to another run.*until"):
        cr.run(*args, checkpoint=tmp_path / "c", **KW)


def _ar1():
    def step(rng_key, x):  # AR(1), stationary N(0, 1), autocorrelation 0.95 per draw
        return 0.95 * x + jnp.sqrt(1 - 0.95**2) * jax.random.normal(rng_key, x.shape), {}

    def init(position, rng_key):
        return position + 0.1 * jax.random.normal(rng_key, position.shape)

    return cr.Kernel(init=init, step=step)


def test_superchains_start_together_and_report_nested_rhat():
    x0 = jnp.asarray(np.random.default_rng(4).normal(size=(16, 2)) * 3, jnp.float32)
    still = _ar1()._replace(step=lambda rng_key, x: (x, {}))  # draws = the initial states
    first = cr.run(still, jax.random.key(4), x0, 1, superchains=4, **KW).draws[:, 0]
    np.testing.assert_array_equal(first.reshape(4, 4, 2), np.repeat(first[::4, None], 4, 1))
    assert not np.array_equal(first[0], first[4])
    kernel = _ar1()
    trace = cr.run(kernel, jax.random.key(4), x0, 30, superchains=4, **KW)
    d = trace.diagnostics
    assert d.superchains == 4 and set(d.nested_rhat) == {"x"}
    ids = np.arange(16) // 4
    expected = _convergence.nested_rhat(trace.draws.astype(np.float64), ids).max()
    assert d.nested_rhat["x"] == pytest.approx(expected, rel=1e-9)
    with pytest.raises(ValueError, match="superchains=5 must divide"):
        cr.run(kernel, jax.random.key(4), x0, 30, superchains=5, **KW)


def test_many_short_chains_stop_on_nested_rhat_where_rhat_would_not():
    """1,024 chains in 16 superchains (started far apart) of an AR(1) chain."""
    kernel = _ar1()
    start = np.random.default_rng(5).normal(size=(16, 1, 2)) * 3
    x0 = jnp.asarray(np.repeat(start, 64, axis=1).reshape(1024, 2), jnp.float32)
    target = cr.Converged(nested_rhat=1.01, ess_bulk=400, ess_tail=400, min_draws=10)
    kw = {**KW, "mesh": cr.chain_mesh(8), "chunk_size": 10}
    trace = cr.run(kernel, jax.random.key(5), x0, 2000, superchains=16, until=target, **kw)
    assert trace.attrs["stopped"] == "converged"
    n = trace.num_draws
    assert n < 2000 and trace.attrs["until_nested_rhat"] <= 1.01
    classic = _convergence.rhat(trace.draws.astype(np.float64)).max()
    assert classic > 1.01, (n, classic)  # classic R-hat would not have stopped here
    # and the answer is right: mean 0, sd 1 after the chains forgot their starts
    tail = trace.draws[:, n // 2 :].reshape(-1, 2)
    assert np.all(np.abs(tail.mean(0)) < 0.25) and np.all(np.abs(tail.std(0) - 1) < 0.2)


@pytest.mark.parametrize(
    ("until", "error", "match"),
    [
        ({"ess_bulk": 400}, TypeError, "until must be None or cr.Converged"),
        (cr.Converged(rhat=0.9), ValueError, "until.rhat must be a number >= 1"),
        (cr.Converged(growth=1.0), ValueError, "until.growth must be a number > 1"),
        (cr.Converged(min_draws=2), ValueError, "until.min_draws must be an int >= 4"),
    ],
)
def test_bad_targets(until, error, match):
    with pytest.raises(error, match=match):
        cr.run(NUTS, jax.random.key(0), X0, 10, until=until, **KW)


def test_progress_bar_shows_the_targets(monkeypatch):
    shown = []

    class Bar(InterruptingBar):
        def set_postfix(self, postfix, refresh=False):
            shown.append(dict(postfix))

    monkeypatch.setattr(_run, "progress_bar", lambda *a, **k: Bar(at=10**9))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cr.run(NUTS, jax.random.key(6), X0, 5000, until=TARGET, **KW)
    assert shown and shown[-1]["rhat"].endswith("/1.01") and shown[-1]["ess"].endswith("/300")


def test_non_finite_draws_never_converge():
    from chainrunner.stopping import _until

    x = np.random.default_rng(8).normal(size=(4, 400, 2))
    assert _until.evaluate(x, cr.Converged(ess_bulk=10, ess_tail=10), None)[0].met
    x[1, 7, 0] = np.nan
    assert not _until.evaluate(x, cr.Converged(ess_bulk=10, ess_tail=10), None)[0].met
    x[1, 7, 0] = np.inf
    assert not _until.evaluate(x, cr.Converged(ess_bulk=10, ess_tail=10), None)[0].met


@pytest.mark.parametrize("seed", range(8))
def test_checking_the_suspects_first_decides_as_a_whole_check(seed):
    """A check that starts with the columns that missed last time decides as a full one."""
    from chainrunner.stopping import _until

    rng = np.random.default_rng(seed)
    m, n, k = 8, int(rng.integers(20, 300)), 6
    x = rng.normal(size=(m, n, k))
    x[:, :, : int(rng.integers(0, 3))] += rng.normal(size=(m, 1, 1)) * rng.uniform(0, 0.3)
    x = np.cumsum(x * rng.uniform(0, 1, size=k), axis=1) * 0.05 + x  # some autocorrelation
    target = cr.Converged(ess_bulk=float(rng.integers(50, 800)), ess_tail=100)
    for superchains in (None, np.arange(m) // 2):
        whole, suspects = _until.evaluate(x, target, superchains)
        assert whole.complete and len(suspects) <= 2
        if not whole.met:
            assert len(suspects) >= 1
        for guess in (suspects, np.array([0]), np.array([k - 1, 2]), np.arange(k - 1), "guess"):
            staged = _until.evaluate(x, target, superchains, guess)[0]
            assert staged.met == whole.met
            if staged.complete:
                assert staged == whole


def test_resume_replays_the_check_at_a_short_last_chunk(tmp_path):
    target = cr.Converged(ess_bulk=10, ess_tail=10, min_draws=90)
    args = (NUTS, jax.random.key(9), X0, 90)
    first = cr.run(
        *args, until=target, checkpoint=tmp_path / "c", **KW
    )  # chunks of 20: 4 x 20 + 10
    assert first.attrs["stopped"] == "converged" and first.num_draws == 90
    again = cr.run(*args, until=target, checkpoint=tmp_path / "c", **KW)
    assert again.attrs["stopped"] == "converged" and again.attrs["until_checked_at_draw"] == 90


def test_one_superchain_is_refused_and_interrupted_runs_say_so(monkeypatch):
    with pytest.raises(ValueError, match="superchains must be >= 2"):
        cr.run(NUTS, jax.random.key(0), X0, 10, superchains=1, **KW)
    monkeypatch.setattr(_run, "progress_bar", lambda *a, **k: InterruptingBar(at=4))
    with pytest.warns(ChainrunnerWarning, match="interrupted"):
        part = cr.run(NUTS, jax.random.key(0), X0, 5000, until=cr.Converged(ess_bulk=1e9), **KW)
    assert part.attrs["stopped"] == "interrupted"


def test_a_converged_run_computes_no_chunk_after_its_stop():
    """The chunk after a check is started only once the check has not stopped the run."""
    steps = []

    def step(rng_key, x):
        jax.debug.callback(lambda: steps.append(1))
        return 0.5 * x + jax.random.normal(rng_key, x.shape), {}

    kernel = cr.Kernel(init=lambda position, rng_key: position, step=step)
    target = cr.Converged(ess_bulk=50, ess_tail=50, min_draws=20)
    # batch_size given: no auto probe, whose draws would run the step too
    trace = cr.run(kernel, jax.random.key(3), jnp.zeros((4, 2)), 10_000, until=target,
                   mesh=cr.chain_mesh(1), chunk_size=10, batch_size=1, progress=False,
                   warn=False)  # fmt: skip
    jax.effects_barrier()
    assert trace.attrs["stopped"] == "converged" and trace.num_draws < 1000
    assert len(steps) == 4 * trace.num_draws  # 4 chains, not one chunk more


def test_an_element_constant_everywhere_does_not_block_convergence():
    from chainrunner.stopping import _until

    x = np.random.default_rng(9).normal(size=(4, 400, 3))
    x[:, :, 1] = 1.0  # constant in every chain and draw: no R-hat, no say in mixing
    status = _until.evaluate(x, cr.Converged(ess_bulk=10, ess_tail=10), None)[0]
    assert status.met and np.isfinite(status.rhat)
    x[:, :, :] = 1.0  # every element constant: no chain moved, not converged
    assert not _until.evaluate(x, cr.Converged(ess_bulk=10, ess_tail=10), None)[0].met
    stuck = np.random.default_rng(9).normal(size=(4, 400, 2))
    stuck[:, :, 1] = np.arange(4)[:, None]  # constant within chains, not between: stuck
    assert not _until.evaluate(stuck, cr.Converged(ess_bulk=10, ess_tail=10), None)[0].met
