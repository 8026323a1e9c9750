"""Long runs: checkpoints that survive SIGKILL, Ctrl-C keeps the draws, keep=, monitor."""

import functools
import io
import os
import sys
import textwrap

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from interrupting import InterruptingBar, kill_when_written

import chainrunner as cr
from chainrunner.output._diagnostics import ChainrunnerWarning
from chainrunner.pipeline import _run
from chainrunner.programs import _compile, _programs

NUTS = blackjax.nuts(lambda x: -0.5 * jnp.sum(x**2), 0.9, jnp.ones(3))
X0 = jnp.asarray(np.random.default_rng(0).normal(size=(5, 3)), jnp.float32)
KW = {"mesh": cr.chain_mesh(4), "progress": False, "warn": False}


def files(path):
    out = {}
    for name in sorted(os.listdir(path)):
        with open(os.path.join(path, name), "rb") as f:
            out[name] = f.read()
    return out


def test_checkpoint_complete_then_same_call_loads_it(tmp_path):
    path = tmp_path / "ckpt"
    full = cr.run(NUTS, jax.random.key(0), X0, 40, num_warmup=10, chunk_size=8, **KW)
    a = cr.run(NUTS, jax.random.key(0), X0, 40, num_warmup=10, chunk_size=8, checkpoint=path,
               **KW)  # fmt: skip
    np.testing.assert_array_equal(a.draws, full.draws)
    assert a.attrs["resumed_from_draw"] == 0
    before = dict(_compile.compile_counts)
    b = cr.run(NUTS, jax.random.key(0), X0, 40, num_warmup=10, chunk_size=8, checkpoint=path,
               **KW)  # fmt: skip
    assert b.attrs["resumed_from_draw"] == 40  # every posterior draw was on disk
    assert b.attrs["resumed_from_step"] == 50  # the warmup's 10 steps included
    np.testing.assert_array_equal(b.draws, full.draws)
    np.testing.assert_array_equal(b.stats["energy"], full.stats["energy"])
    np.testing.assert_array_equal(b.final_state.position, full.final_state.position)
    assert _compile.compile_counts == before
    # Each chunk file is ArviZ data on its own; a chunk of warmup steps holds no group.
    import xarray as xr

    warmup_only = xr.open_datatree(os.path.join(path, "chunk_000000.nc"), engine="h5netcdf")
    assert not warmup_only.children
    where_it_ends = xr.open_datatree(os.path.join(path, "chunk_000001.nc"), engine="h5netcdf")
    assert where_it_ends["posterior"]["x"].shape == (5, 6, 3)
    chunk = os.path.join(path, "chunk_000002.nc")
    if int(__import__("arviz").__version__.split(".")[0]) >= 1:
        tree = xr.open_datatree(chunk, engine="h5netcdf")
        assert tree["posterior"]["x"].shape == (5, 8, 3)
    else:
        import arviz as az

        data = az.from_netcdf(chunk)
        assert data.posterior["x"].shape == (5, 8, 3)


def test_mismatched_checkpoint_is_refused_and_left_untouched(tmp_path):
    path = tmp_path / "ckpt"
    cr.run(NUTS, jax.random.key(0), X0, 16, chunk_size=8, checkpoint=path, **KW)
    before = files(path)
    other = blackjax.nuts(lambda x: -0.5 * jnp.sum(x**2), 0.5, jnp.ones(3))
    wider = blackjax.nuts(lambda x: -0.5 * jnp.sum(x**2), 0.5, jnp.ones(4))
    cases = [  # (change, its words, the raw value of the second line)
        ({"rng_key": jax.random.key(1)}, "another seed", "seed: checkpoint"),
        ({"num_samples": 24}, "another num_samples (16 in the checkpoint)", "num_samples"),
        ({"kernel": other}, "another model, log density or kernel", "fingerprint: checkpoint"),
        ({"mesh": cr.chain_mesh(2)}, "another chunk layout (the checkpoint's num_devices=", ""),
        ({"chunk_size": 4}, "call with the checkpoint's layout (chunk_size=8", "chunk_size"),
        ({"position": X0[:4]}, "another chain count (5 chains in the checkpoint, 4 in", ""),
        ({"kernel": wider, "position": jnp.zeros((5, 4))}, "another dimension", "first differing"),
    ]
    for change, words, raw in cases:
        args = {"kernel": NUTS, "rng_key": jax.random.key(0), "position": X0, "num_samples": 16,
                "chunk_size": 8, "mesh": KW["mesh"], **change}  # fmt: skip
        with pytest.raises(ValueError, match="belongs to another run; left untouched") as e:
            cr.run(args["kernel"], args["rng_key"], args["position"], args["num_samples"],
                   chunk_size=args["chunk_size"], mesh=args["mesh"], checkpoint=path,
                   progress=False, warn=False)  # fmt: skip
        first, second = str(e.value).split("\n")
        assert words in first, first
        assert ("another model" in first) == (change.get("kernel") is other), first
        if "chain count" in words:  # its padding follows from it: not another layout
            assert "chunk layout" not in first, first
        assert "In detail" in second and raw in second and len(second) < 400, second
        assert files(path) == before
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"not empty and has no manifest\.json"):
        cr.run(NUTS, jax.random.key(0), X0, 16, checkpoint=tmp_path / "other", **KW)


# The run a test kills, in a process of its own (4 devices): this module's ``ar1_run``.
SCRIPT = textwrap.dedent(
    """
    import sys
    import jax
    jax.config.update("jax_num_cpu_devices", 4)
    sys.path.insert(0, sys.argv[2])
    from test_long_runs import ar1_run
    ar1_run(sys.argv[1])
    """
)


def ar1_run(checkpoint=None):
    """An AR(1) chain (stationary N(0, 1)) on 4 devices in chunks of 5 draws."""

    def step(rng_key, x):
        return 0.9 * x + jnp.sqrt(0.19) * jax.random.normal(rng_key, x.shape), {}

    kernel = cr.Kernel(init=lambda position, rng_key: position, step=step)
    return cr.run(kernel, jax.random.key(3), jnp.zeros((6, 4)), 600, num_warmup=100,
                  chunk_size=5, mesh=cr.chain_mesh(4), progress=False, warn=False,
                  checkpoint=checkpoint)  # fmt: skip


def test_sigkill_then_resume_equals_uninterrupted(tmp_path):
    """A run killed (``SIGKILL``, a process of its own) after its fifth chunk on disk;
    the same call again (here) resumes from the checkpoint and gives the uninterrupted
    run's draws."""
    script = tmp_path / "long_run.py"
    script.write_text(SCRIPT)
    path = str(tmp_path / "ckpt")
    cmd = [sys.executable, str(script), path, os.path.dirname(__file__)]
    kill_when_written(
        cmd, os.path.join(path, "manifest.json"), 5, {**os.environ, "TQDM_DISABLE": "1"}
    )

    resumed = ar1_run(path)
    plain = ar1_run()
    assert resumed.draws.shape == (6, 600, 4)
    np.testing.assert_array_equal(resumed.draws, plain.draws)
    assert 0 < resumed.attrs["resumed_from_step"] < 700  # it resumed: less work than starting over


def test_keyboard_interrupt_keeps_the_draws(monkeypatch):
    full = cr.run(NUTS, jax.random.key(4), X0, 60, num_warmup=10, chunk_size=10, **KW)
    # update 1 is the bar's start; updates 2.. are chunks: stop during the 4th chunk.
    monkeypatch.setattr(_run, "progress_bar", lambda *a, **k: InterruptingBar(at=5))
    with pytest.warns(ChainrunnerWarning, match=r"interrupted.*cr.run\(kernel, rng_key, trace"):
        part = cr.run(NUTS, jax.random.key(4), X0, 60, num_warmup=10, chunk_size=10, **KW)
    monkeypatch.undo()
    assert part.attrs["interrupted"] is True
    kept = part.draws.shape[1]
    assert 0 < kept < 60
    np.testing.assert_array_equal(part.draws, full.draws[:, :kept])
    rest = cr.run(NUTS, jax.random.key(4), part, 70 - part.num_steps, chunk_size=10, **KW)
    np.testing.assert_array_equal(np.concatenate([part.draws, rest.draws], 1), full.draws)


def test_keyboard_interrupt_with_checkpoint_resumes(monkeypatch, tmp_path):
    path = tmp_path / "ckpt"
    full = cr.run(NUTS, jax.random.key(5), X0, 50, chunk_size=10, **KW)
    monkeypatch.setattr(_run, "progress_bar", lambda *a, **k: InterruptingBar(at=3))
    with pytest.warns(ChainrunnerWarning, match="same checkpoint"):
        cr.run(NUTS, jax.random.key(5), X0, 50, chunk_size=10, checkpoint=path, **KW)
    monkeypatch.undo()
    again = cr.run(NUTS, jax.random.key(5), X0, 50, chunk_size=10, checkpoint=path, **KW)
    assert again.attrs["resumed_from_draw"] == 20
    np.testing.assert_array_equal(again.draws, full.draws)


def test_an_interrupted_run_with_warmup_resumes_from_the_draws_it_returned(monkeypatch, tmp_path):
    """resumed_from_draw counts posterior draws (the warmup's are in resumed_from_step),
    and every draw a Ctrl-C returned is on disk: the resume starts after them."""
    path = tmp_path / "ckpt"
    run = functools.partial(cr.run, NUTS, jax.random.key(5), X0, 50, num_warmup=20,
                            chunk_size=10, **KW)  # fmt: skip
    monkeypatch.setattr(_run, "progress_bar", lambda *a, **k: InterruptingBar(at=4))
    with pytest.warns(ChainrunnerWarning, match="same checkpoint"):
        part = run(checkpoint=path)
    monkeypatch.undo()
    again = run(checkpoint=path)
    assert part.draws.shape[1] == again.attrs["resumed_from_draw"] == 10
    assert again.attrs["resumed_from_step"] == 30
    np.testing.assert_array_equal(again.draws[:, :10], part.draws)
    np.testing.assert_array_equal(again.draws, run().draws)


def test_keep_names_or_function():
    nuts = blackjax.nuts(lambda p: -0.5 * (jnp.sum(p["a"] ** 2) + p["b"] ** 2), 0.8, jnp.ones(3))
    start = {"a": jnp.zeros((2, 2)), "b": jnp.zeros(2)}
    full = cr.run(nuts, jax.random.key(6), start, 20, **KW)
    only_b = cr.run(nuts, jax.random.key(6), start, 20, keep=["b"], **KW)
    assert set(only_b.draws) == {"b"}
    np.testing.assert_array_equal(only_b.draws["b"], full.draws["b"])
    assert set(only_b.stats) == set(full.stats)

    def norm(state, info):
        return jnp.sum(state.position["a"] ** 2)

    fn = cr.run(nuts, jax.random.key(6), start, 20, keep=norm, **KW)
    np.testing.assert_allclose(fn.draws, np.sum(full.draws["a"] ** 2, -1), rtol=1e-6)
    with pytest.raises(ValueError, match=r"keep names \['c'\]"):
        cr.run(nuts, jax.random.key(6), start, 20, keep="c", **KW)
    with pytest.raises(TypeError, match="keep must be None"):
        cr.run(nuts, jax.random.key(6), start, 20, keep=3, **KW)


def test_monitor_shows_rhat_and_ess(capsys):
    cr.run(NUTS, jax.random.key(7), X0, 40, chunk_size=10, mesh=cr.chain_mesh(4),
           progress=True, monitor=True, warn=False)  # fmt: skip
    err = capsys.readouterr().err
    assert "rhat=" in err and "ess_bulk=" in err and "ess_tail=" in err


def test_bad_long_run_options(tmp_path):
    with pytest.raises(TypeError, match="checkpoint must be a folder path"):
        cr.run(NUTS, jax.random.key(0), X0, 10, checkpoint=3, **KW)
    with pytest.raises(TypeError, match="monitor must be True or False"):
        cr.run(NUTS, jax.random.key(0), X0, 10, monitor="yes", **KW)
    with pytest.raises(ValueError, match="on_bad_init must be one of"):
        cr.run(NUTS, jax.random.key(0), X0, 10, on_bad_init="ignore", **KW)
    with pytest.raises(ValueError, match="init_jitter must be a positive number"):
        cr.run(NUTS, jax.random.key(0), X0, 10, on_bad_init="reinit", init_jitter=-1.0, **KW)


def bounded(x):
    return jnp.where(jnp.all(x > 0), -0.5 * jnp.sum((x - 2.0) ** 2), -jnp.inf)


def test_on_bad_init_warn_and_reinit():
    nuts = blackjax.nuts(bounded, 0.3, jnp.ones(3))
    start = jnp.full((6, 3), 2.0).at[jnp.array([1, 4]), 0].set(-0.3)
    with pytest.raises(ValueError, match=r"chain\(s\) \[1, 4\].*on_bad_init=\"reinit\""):
        cr.run(nuts, jax.random.key(0), start, 10, **KW)
    with pytest.warns(ChainrunnerWarning, match=r"chain\(s\) \[1, 4\].*anyway"):
        cr.run(nuts, jax.random.key(0), start, 10, on_bad_init="warn", **KW)
    with pytest.warns(ChainrunnerWarning, match=r"re-initialised chain\(s\) \[1, 4\]"):
        trace = cr.run(nuts, jax.random.key(0), start, 10, on_bad_init="reinit",
                       init_jitter=1.0, **KW)  # fmt: skip
    assert trace.attrs["reinitialised_chains"] == [1, 4]
    assert np.all(trace.draws > 0)
    # Healthy chains keep their start; the same call reinitialises the same way.
    again = cr.run(nuts, jax.random.key(0), start, 10, on_bad_init="reinit", init_jitter=1.0,
                   **KW)  # fmt: skip
    np.testing.assert_array_equal(trace.draws, again.draws)


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_quiet_runs_take_longer_chunks_and_watched_ones_250(tmp_path, monkeypatch):
    """``chunk_size=None``: up to 2000 draws per call (the same draws as chunks of 250):
    the whole run with ``progress=False``, an eighth of it where a bar may show (at least
    250), 250 with checkpoints, ``until`` or the monitor; never a terminal's say."""
    kw = {**KW, "batch_size": 1, "num_warmup": 100}
    quiet = cr.run(NUTS, jax.random.key(5), X0, 2100, **kw)  # 2200 draws: 2000, then 200
    fixed = cr.run(NUTS, jax.random.key(5), X0, 2100, chunk_size=250, **kw)
    assert quiet.attrs["chunk_size"] == 2000 and fixed.attrs["chunk_size"] == 250
    np.testing.assert_array_equal(quiet.draws, fixed.draws)
    np.testing.assert_array_equal(quiet.stats["energy"], fixed.stats["energy"])
    np.testing.assert_array_equal(quiet.final_state.position, fixed.final_state.position)
    # 500, 1000 or 2000 draws per call: runs of other lengths share a few programs, and
    # a continued quiet run takes its trace's program again
    before = dict(_compile.compile_counts)
    assert cr.run(NUTS, jax.random.key(6), X0, 1700, **kw).attrs["chunk_size"] == 2000
    more = cr.run(NUTS, jax.random.key(5), quiet, 300, **{**kw, "num_warmup": 0})
    assert more.attrs["chunk_size"] == 2000 and _compile.compile_counts == before
    assert cr.run(NUTS, jax.random.key(5), X0, 300, **kw).attrs["chunk_size"] == 500
    watched = {
        "checkpoint": {"checkpoint": tmp_path / "ckpt"},
        "until": {"until": cr.Converged(rhat=1.5, ess_bulk=10, ess_tail=10)},
    }
    for name, extra in watched.items():
        trace = cr.run(NUTS, jax.random.key(5), X0, 400, **{**kw, **extra})
        assert trace.attrs["chunk_size"] == 250, name
    assert cr.run(NUTS, jax.random.key(5), X0, 100, **kw).attrs["chunk_size"] == 200  # one
    # progress=None or True: an eighth of the run per chunk, whether or not stderr is a
    # terminal (a bar shows where tqdm decides; the programs are the same)
    for progress, stderr in [(None, io.StringIO()), (None, _Terminal()), (True, _Terminal())]:
        monkeypatch.setattr(sys, "stderr", stderr)
        for steps, chunk in [(400, 250), (3900, 500), (7900, 1000), (20000, 2000)]:
            bar = {**kw, "progress": progress, "num_warmup": 0}
            trace = _schedule_of(steps, **bar)
            assert trace == chunk, (progress, steps)
    monkeypatch.setattr(sys, "stderr", _Terminal())
    kw["progress"] = None
    assert cr.run(NUTS, jax.random.key(5), X0, 400, **kw).attrs["chunk_size"] == 250
    assert "500/500" in sys.stderr.getvalue()  # the bar was shown


def _schedule_of(num_samples, **kw):
    """The chunk length ``run`` would take, from its plan (nothing sampled)."""
    from chainrunner.adapters import as_adapter
    from chainrunner.pipeline import _loop, _plan, _start

    options = {k: kw.get(k, v) for k, v in _PLAN_DEFAULTS.items()}
    plan = _plan.plan(jax.random.key(0), num_samples, **options)
    start = _start.starting_point(plan, as_adapter(NUTS, "run"), X0)
    layout = _start.place(plan, start).layout
    return _loop.schedule(plan, start, layout, start.kernel, None).chunk_len


_PLAN_DEFAULTS = {
    "num_warmup": 0, "num_chains": None, "thinning": 1, "mesh": None, "batch_size": "auto",
    "chunk_size": None, "progress": None, "keep_warmup": False, "keep": None,
    "checkpoint": None, "monitor": False, "warn": True, "on_bad_init": "raise",
    "init_jitter": 1.0, "until": None, "superchains": None, "warmup_until": None,
}  # fmt: skip


def test_a_quiet_chunk_keeps_a_devices_outputs_within_its_bytes(monkeypatch):
    """The quiet chunk shrinks where ``QUIET_CHUNK_BYTES`` per device would be passed,
    to no fewer than 250 draws; draws and stats as with chunks of 250."""

    def outputs_per_device(trace, per_device=2):  # 5 chains on 4 devices: at most 2 each
        arrays = jax.tree.leaves((trace.draws, trace.stats))
        return per_device * sum(a.dtype.itemsize * int(np.prod(a.shape[2:])) for a in arrays)

    kw = {**KW, "batch_size": 1}
    for budget, expected in [(None, 600), (1, 250)]:
        # a new kernel each time: the budget is not part of the compiled program's key
        nuts = blackjax.nuts(lambda x: -0.5 * jnp.sum(x**2), 0.9, jnp.ones(3))
        per_draw = outputs_per_device(cr.run(nuts, jax.random.key(1), X0, 4, **kw))
        if budget is None:
            budget = expected * per_draw + per_draw // 2  # room for 600 draws
        monkeypatch.setattr(_programs, "QUIET_CHUNK_BYTES", budget)
        trace = cr.run(nuts, jax.random.key(1), X0, 900, **kw)
        assert trace.attrs["chunk_size"] == expected
        fixed = cr.run(nuts, jax.random.key(1), X0, 900, chunk_size=250, **kw)
        np.testing.assert_array_equal(trace.draws, fixed.draws)
        np.testing.assert_array_equal(trace.stats["n_steps"], fixed.stats["n_steps"])
