"""Every adaptation's warmup watched, interruptible and resumable (issue 58).

The cross-chain warmups (ChEES, MEADS, pooled Fisher), blackjax's MCLMC tuners and its
one-call adaptations (window low rank, staged, pathfinder: ``_split``) run chunk by chunk:
the same draws and parameters in any chunks, bit for bit; the bar moves after every
chunk; Ctrl-C keeps the warmup done so far (states, parameters, kept draws). Window and
the Fisher adaptations warm up in the sampling loop's chunks, with the same promises.
Every one of the eleven resumes bit for bit after a ``SIGKILL`` in its warmup."""

import warnings

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import warmup_run
from interrupting import InterruptingBar, Recorder, kill_when_written
from warmup_run import START, keeps, kernel, logdensity

import chainrunner as cr
from chainrunner.pipeline import _run

KW = {"progress": False, "warn": False}
# blackjax's adaptations that are one call, cut around their scan (``_split``)
ONE_CALL = ("window_low_rank", "staged", "pathfinder")


def run(adaptation, **kw):
    options = {"num_warmup": 30, "keep_warmup": keeps(adaptation), "mesh": cr.chain_mesh(2),
               **KW, **kw}  # fmt: skip
    return cr.run(kernel(adaptation), jax.random.key(1), START, 10, **options)


def assert_same(a, b, thinned=False):
    """``a`` and ``b`` have the same draws and adapted parameters; ``thinned``: ``a``'s
    warmup kept every second step of ``b``'s (draw ``i``: the state after step
    ``2 (i + 1)``), and its sampling draws are not compared (the sampling loop, thinned,
    rounds GHMC's and adjusted MCLMC's steps otherwise on jax 0.12, 2e-7: not the
    warmup's doing)."""

    def kept(x):
        return np.asarray(x)[:, 1::2] if thinned else x

    if not thinned:
        np.testing.assert_array_equal(a.draws, b.draws)
    if a.warmup_stats is not None or b.warmup_stats is not None:
        np.testing.assert_array_equal(a.warmup_draws, kept(b.warmup_draws))
        assert set(a.warmup_stats) == set(b.warmup_stats)
        for name in a.warmup_stats:
            np.testing.assert_array_equal(a.warmup_stats[name], kept(b.warmup_stats[name]))
    assert set(cr.adapted_parameters(a)) == set(cr.adapted_parameters(b))
    # (a low-rank metric is a tuple of arrays)
    jax.tree.map(np.testing.assert_array_equal, cr.adapted_parameters(a), cr.adapted_parameters(b))


# The MCLMC tuners' steps for num_warmup=30: mclmc 33 (blackjax rounds its phases:
# 10 + 10, 3, 10), adjusted_mclmc 45 (15 + 15, then 15 again)
ADAPTATIONS = ["chees", "meads", "pooled", "mclmc", "adjusted_mclmc"]


def label(adaptation):
    """What the bar says while the warmup runs."""
    per_chain = "mclmc" in adaptation or adaptation in ONE_CALL
    return "warmup (each chain)" if per_chain else "warmup (across chains)"


def test_a_warmup_without_a_scan_is_one_step_on_the_bar(monkeypatch):
    """A built adaptation whose ``run`` has no scan of its steps (here none at all) runs
    as one step: the bar moves once."""
    from blackjax.adaptation.base import AdaptationResults

    bars = []
    monkeypatch.setattr(_run, "progress_bar", lambda *a: bars.append(Recorder(*a)) or bars[-1])

    def run_(rng_key, position, num_steps):
        state = blackjax.hmc.init(position, logdensity)
        parameters = {"step_size": 0.5, "inverse_mass_matrix": jnp.ones(3),
                      "num_integration_steps": 5}  # fmt: skip
        return AdaptationResults(state, parameters), None

    built = blackjax.base.AdaptationAlgorithm(run_)
    tuned = cr.from_blackjax(blackjax.hmc, logdensity_fn=logdensity, adaptation=built)
    trace = cr.run(tuned, jax.random.key(1), START, 10, num_warmup=30, chunk_size=12, **KW)
    assert [n for desc, n in bars[0].updates if desc == "warmup (each chain)"] == [30]
    assert cr.adapted_parameters(trace)["step_size"].shape == (8,)


def interrupted(adaptation, at, monkeypatch, **kw):
    monkeypatch.setattr(_run, "progress_bar", lambda *a, **k: InterruptingBar(at=at))
    with pytest.warns(cr.ChainrunnerWarning, match="interrupted in the cross-chain warmup"):
        trace = run(adaptation, **kw)
    monkeypatch.undo()
    return trace


def test_ctrl_c_in_the_first_warmup_chunk_stops_the_run(monkeypatch):
    from chainrunner.adapters._blackjax import _warmup_sharded

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(_warmup_sharded, "compiled", ctrl_c)  # while the first chunk compiles
    with pytest.raises(KeyboardInterrupt), warnings.catch_warnings():
        warnings.simplefilter("error")  # no notice: nothing was adapted, nothing returned
        run("chees", chunk_size=10)


@pytest.mark.parametrize("adaptation", ADAPTATIONS)
def test_in_chunks_the_bar_moves_ctrl_c_keeps_the_warmup_and_the_same_call_resumes_it(
    adaptation, monkeypatch, tmp_path
):
    """One warmup watched, stopped by Ctrl-C after its second chunk of three, sampled on
    from, and resumed bit for bit from its checkpoint (one test: the same programs); in
    other chunks, bit for bit the same warmup."""
    whole = watched_stopped_and_resumed(adaptation, monkeypatch, tmp_path)  # chunks of 10
    if keeps(adaptation):
        assert whole.warmup_draws.shape == (8, 30, 3)
        # chunks of 7 draws of 2 steps: 14, 14, then one of 2; the warmup draws every
        # second step's
        assert_same(run(adaptation, chunk_size=7, thinning=2), whole, thinned=True)
    else:  # chunks of 8 of 33 and 8 of 45 steps, then the rest
        assert_same(run(adaptation, chunk_size=7), whole)


@pytest.mark.parametrize("adaptation", ONE_CALL)
def test_a_one_call_warmup_in_chunks(adaptation, monkeypatch, tmp_path):
    """blackjax's one-call warmups, cut around their scan: in chunks the warmup in one
    chunk bit for bit, watched, stopped and resumed. (The cut itself is tested under both
    Pythons in test_split.py; each of the three runs here under one: ``DIVIDED``.)"""
    whole = run(adaptation, chunk_size=30)
    assert whole.warmup_draws.shape == (8, 30, 3)
    assert_same(watched_stopped_and_resumed(adaptation, monkeypatch, tmp_path), whole)


def watched_stopped_and_resumed(adaptation, monkeypatch, tmp_path):
    """The warmup in chunks of 10 of 30: the bar moves after each, Ctrl-C after the
    second keeps it, sampling goes on from it, and the same call resumes it bit for bit;
    the uninterrupted run."""
    bars = []
    monkeypatch.setattr(_run, "progress_bar", lambda *a: bars.append(Recorder(*a)) or bars[-1])
    whole = run(adaptation, chunk_size=10)
    monkeypatch.undo()
    # the bar: mclmc in chunks of 11 of its 33 steps, adjusted_mclmc 15 of 45; 10 each
    assert [n for desc, n in bars[0].updates if desc == label(adaptation)] == [10, 10, 10]
    assert bars[0].n == bars[0].total == 40

    part = interrupted(adaptation, 2, monkeypatch, chunk_size=10, checkpoint=tmp_path)
    assert part.attrs["interrupted"] is True and part.attrs["warmup_steps_done"] == 20
    assert part.draws.shape == (8, 0, 3) and part.num_steps == 20
    if keeps(adaptation):
        np.testing.assert_array_equal(part.warmup_draws, whole.warmup_draws[:, :20])
    params = cr.adapted_parameters(part)
    assert set(params) == set(cr.adapted_parameters(whole))
    assert all(np.all(np.isfinite(v)) for v in jax.tree.leaves(params))
    # sampling on from it: the parameters adapted so far, the steps numbered on
    more = cr.run(kernel(adaptation), jax.random.key(1), part, 10, **KW)
    assert more.draws.shape == (8, 10, 3) and more.num_steps == 30
    assert np.all(np.isfinite(more.draws))

    resumed = run(adaptation, chunk_size=10, checkpoint=tmp_path)
    assert resumed.attrs["warmup_resumed_from_step"] == 20
    assert_same(resumed, whole)
    again = run(adaptation, chunk_size=10, checkpoint=tmp_path)  # all on disk: nothing runs
    assert again.attrs["warmup_resumed_from_step"] == 30 and again.attrs["resumed_from_draw"] == 10
    assert_same(again, whole)
    return whole


@pytest.mark.parametrize("adaptation", warmup_run.IN_LOOP)
def test_an_in_loop_warmup_moves_the_bar_and_ctrl_c_keeps_it(adaptation, monkeypatch):
    """Window and the Fisher adaptations warm up in the sampling loop's chunks: the bar
    moves after each warmup chunk, and Ctrl-C in the warmup returns its draws so far,
    the chains' states and the parameters adapted so far, one per chain. (Their resume
    after a kill: ``test_sigkill_in_the_warmup_then_resume_equals_uninterrupted``.)"""
    options = {"num_warmup": 30, "keep_warmup": True, "chunk_size": 10, "mesh": cr.chain_mesh(2),
               "warn": False}  # fmt: skip
    bars = []
    monkeypatch.setattr(_run, "progress_bar", lambda *a: bars.append(Recorder(*a)) or bars[-1])
    whole = cr.run(kernel(adaptation), jax.random.key(1), START, 10, **options)
    assert [n for desc, n in bars[0].updates if desc == "warmup"] == [0, 10, 10]
    assert [n for desc, n in bars[0].updates if desc == "sampling"] == [10, 10]

    monkeypatch.setattr(_run, "progress_bar", lambda *a, **k: InterruptingBar(at=2))
    with pytest.warns(cr.ChainrunnerWarning, match="interrupted after 10 of 40 steps"):
        part = cr.run(kernel(adaptation), jax.random.key(1), START, 10, **options)
    assert part.attrs["interrupted"] is True and part.num_steps == 10
    assert part.draws.shape == (8, 0, 3)
    np.testing.assert_array_equal(part.warmup_draws, whole.warmup_draws[:, :10])
    params = cr.adapted_parameters(part)
    assert set(params) == set(cr.adapted_parameters(whole)) == {"step_size", "inverse_mass_matrix"}
    assert params["step_size"].shape == (8,)
    assert all(np.all(np.isfinite(v)) for v in jax.tree.leaves(params))


def test_a_warmup_checkpoint_of_another_model_is_refused(monkeypatch, tmp_path):
    interrupted("chees", 2, monkeypatch, chunk_size=10, checkpoint=tmp_path)
    other = cr.from_blackjax(blackjax.dynamic_hmc, adaptation="chees",
                             logdensity_fn=lambda x: -0.5 * jnp.sum(x**2))  # fmt: skip
    with pytest.raises(ValueError, match=r"belongs to another run.*another model"):
        cr.run(other, jax.random.key(1), START, 10, num_warmup=30, chunk_size=10,
               keep_warmup=True, mesh=cr.chain_mesh(2), checkpoint=tmp_path, **KW)  # fmt: skip


@pytest.mark.parametrize("adaptation", list(warmup_run.FACTORY))
def test_sigkill_in_the_warmup_then_resume_equals_uninterrupted(adaptation, tmp_path):
    """Every adaptation: a run killed (``SIGKILL``) after its third warmup chunk on disk;
    the same call again resumes mid-warmup from the checkpoint, and gives the draws, the
    kept warmup draws and the adapted parameters of the uninterrupted run. (The killed
    run is a process of its own; the resumed and the uninterrupted run this one.)"""
    import os
    import sys

    path = str(tmp_path / "ckpt")
    in_loop = adaptation in warmup_run.IN_LOOP
    manifest = os.path.join(path, "manifest.json" if in_loop else "warmup_manifest.json")
    cmd = [sys.executable, warmup_run.__file__, adaptation, path]
    kill_when_written(cmd, manifest, 3, {**os.environ, "TQDM_DISABLE": "1"})
    if not in_loop:
        assert not os.path.exists(os.path.join(path, "manifest.json"))  # killed in the warmup

    resumed = warmup_run.warmup_run(adaptation, path)
    plain = warmup_run.warmup_run(adaptation)
    done = resumed.attrs["resumed_from_step" if in_loop else "warmup_resumed_from_step"]
    assert 0 < done < warmup_run.NUM_WARMUP  # it resumed mid-warmup
    assert resumed.draws.shape == (8, 100, 3)
    if keeps(adaptation):
        assert resumed.warmup_draws.shape == (8, warmup_run.NUM_WARMUP, 3)
    assert_same(resumed, plain)


def test_the_default_warmup_chunk_divides_the_warmup():
    from types import SimpleNamespace

    from chainrunner.pipeline._loop import warmup_chunk

    def chunk(num_warmup, thinning=1, progress=None, chunk_size=None, checkpoint=None):
        plan = SimpleNamespace(num_warmup=num_warmup, thinning=thinning, progress=progress,
                               chunk_size=chunk_size, checkpoint=checkpoint, monitor=False,
                               until=None, warmup_until=None)  # fmt: skip
        return warmup_chunk(plan)

    # under a bar: an eighth of the warmup, at least 250 draws, and one that divides it
    assert [chunk(n) for n in (300, 700, 1000, 1500, 6000)] == [150, 175, 250, 250, 1000]
    assert chunk(997) == 250  # none divides a prime length: a last chunk of its own
    assert chunk(1000, progress=False) == 1000  # no bar: one chunk
    assert chunk(600, thinning=2) == 300  # steps: 150 draws of 2
    assert chunk(300, checkpoint="folder") == 150  # boundaries every 250 draws at most
    assert chunk(300, chunk_size=250) == 250  # as given
