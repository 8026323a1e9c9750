"""The pipeline of stages (issue 15): each stage alone, and the defects fixed on the way."""

import os
import subprocess
import sys
import warnings

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from interrupting import InterruptingBar

import chainrunner as cr
from chainrunner.adapters import as_adapter
from chainrunner.core._threads import Background
from chainrunner.output import _diagnostics
from chainrunner.output._diagnostics import ChainrunnerWarning
from chainrunner.pipeline import _host, _loop, _plan, _start
from chainrunner.programs import _compile, _programs

HERE = os.path.dirname(os.path.abspath(__file__))
KW = {"progress": False, "warn": False}


def logdensity(x):
    return -0.5 * jnp.sum(x**2)


NUTS = blackjax.nuts(logdensity, 0.8, jnp.ones(2))
X0 = jnp.zeros((5, 2))


def checked_plan(**options):
    defaults = dict(
        num_warmup=0, num_chains=None, thinning=1, mesh=None, batch_size="auto",
        chunk_size=None, progress=False, keep_warmup=False, keep=None, checkpoint=None,
        monitor=False, warn=True, on_bad_init="raise", init_jitter=1.0,
    )  # fmt: skip
    return _plan.plan(jax.random.key(0), options.pop("num_samples", 12), **{**defaults, **options})


# -- the stages, one by one -----------------------------------------------------------


def test_plan_checks_everything_without_jax_work():
    plan = checked_plan(num_warmup=6, thinning=3, keep="x", checkpoint="somewhere")
    assert plan.keep == ("x",) and plan.checkpoint == "somewhere" and plan.thinning == 3
    with pytest.raises(ValueError, match="num_warmup=4 is not a multiple of thinning=3"):
        checked_plan(num_warmup=4, thinning=3)


def test_start_place_schedule_and_describe():
    plan = checked_plan(num_warmup=6, chunk_size=5, mesh=cr.chain_mesh(2), batch_size=2)
    start = _start.starting_point(plan, as_adapter(NUTS), X0)
    assert (start.num_chains, start.first_step, start.cross_chain) == (5, 0, False)
    placed = _start.place(plan, start)
    assert placed.layout.padded == 8 and placed.layout.batch_size == 2
    assert np.asarray(placed.chains).tolist() == [0, 1, 2, 3, 4, 4, 4, 4]
    sched = _loop.schedule(plan, start, placed.layout, start.kernel, None)
    assert sched == _loop.Schedule(
        first_step=0, warmup_draws=6, total_draws=18, chunk_len=5, thinning=1
    )
    # a cross-chain warmup runs before the loop: the loop starts after it
    crossed = start._replace(cross_chain=True)
    assert _loop.schedule(plan, crossed, placed.layout, start.kernel, None) == (
        6,
        0,
        12,
        5,
        1,
        False,
    )
    from chainrunner.pipeline._run import Run, describe

    d = describe(Run(plan, as_adapter(NUTS), start, placed), sched)
    assert d["num_chains"] == 5 and d["padded_chains"] == 3 and d["chunk_size"] == 5


def test_attrs_and_checkpoint_identity_come_from_one_description(tmp_path):
    trace = cr.run(NUTS, jax.random.key(1), X0, 10, chunk_size=5, checkpoint=tmp_path / "c", **KW)
    import json

    with open(tmp_path / "c" / "manifest.json") as f:
        config = json.load(f)["config"]
    shared = set(config) - {"fingerprint", "state"}
    assert shared and all(config[k] == trace.attrs[k] for k in shared)


def test_sink_never_returns_unfilled_memory():
    like = (jnp.zeros((2, 3)), {"lp": jnp.zeros((2, 3))})
    sink = _host.Sink(2, 6, like)
    assert jax.tree.leaves(sink.result())[0].shape == (2, 0)
    tree = (np.ones((2, 3)), {"lp": np.ones((2, 3))})
    sink.write(tree, 3, slice(0, 3))  # draws 3..5 written, 0..2 never
    with pytest.raises(RuntimeError, match="never written"):
        sink.result()
    sink.write(tree, 0, slice(0, 3))
    assert jax.tree.leaves(sink.result())[0].shape == (2, 6)


# -- errors on helper threads reach the caller --------------------------------------------


def test_background_errors_are_raised_by_result():
    job = Background(lambda: (_ for _ in ()).throw(KeyError("lost?")), "test")
    with pytest.raises(KeyError, match="lost"):
        job.result()
    assert isinstance(job.failed(), KeyError)


def test_loop_compile_error_on_the_helper_thread_reaches_the_caller(monkeypatch):
    real = _loop.compile_loop
    seen = []

    def failing(*args, **kwargs):
        import threading

        if threading.current_thread().name == "chainrunner-compile-loop":
            seen.append(True)
            raise RuntimeError("compile failed on the helper thread")
        return real(*args, **kwargs)

    monkeypatch.setattr(_loop, "compile_loop", failing)
    key = jax.random.key(123)  # a fresh run, not cached: the loop compiles ahead
    nuts = blackjax.nuts(lambda x: -0.25 * jnp.sum(x**2), 0.8, jnp.ones(2))
    with pytest.raises(RuntimeError, match="helper thread"):
        cr.run(nuts, key, X0, 7, **KW)
    assert seen


def test_checkpoint_writer_error_reaches_the_caller(tmp_path, monkeypatch):
    from chainrunner.output import _checkpoint

    def broken(self, *args, **kwargs):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(_checkpoint.Checkpoint, "write_chunk", broken)
    with pytest.raises(OSError, match="disk full"):
        cr.run(NUTS, jax.random.key(2), X0, 10, chunk_size=5, checkpoint=tmp_path / "c", **KW)


# -- defects found on the way ---------------------------------------------------------------


def test_keep_names_are_checked_before_anything_compiles():
    nuts = blackjax.nuts(lambda p: -0.5 * jnp.sum(p["a"] ** 2), 0.8, jnp.ones(2))
    before = dict(_programs.trace_counts)
    with pytest.raises(ValueError, match=r"keep names \['b'\]"):
        cr.run(nuts, jax.random.key(0), {"a": jnp.zeros((3, 2))}, 10, keep="b", **KW)
    with pytest.raises(ValueError, match="draws are an array, not a dict of sites"):
        cr.run(NUTS, jax.random.key(0), X0, 10, keep="b", **KW)
    assert _programs.trace_counts == before


def test_meads_with_one_chain_raises():
    meads = cr.from_blackjax(blackjax.ghmc, logdensity_fn=logdensity, adaptation="meads")
    with pytest.raises(ValueError, match="needs at least 2 chains, got 1"):
        cr.run(meads, jax.random.key(0), jnp.zeros((1, 2)), 10, num_warmup=10, **KW)


def test_cross_chain_runs_record_num_warmup_and_thin_kept_warmup():
    chees = cr.from_blackjax(blackjax.dynamic_hmc, logdensity_fn=logdensity, adaptation="chees")
    trace = cr.run(chees, jax.random.key(0), X0, 10, num_warmup=12, thinning=2,
                   keep_warmup=True, **KW)  # fmt: skip
    assert trace.attrs["num_warmup"] == 12 and trace.num_steps == 22
    assert trace.warmup_draws.shape == (5, 6, 2)
    full = cr.run(chees, jax.random.key(0), X0, 10, num_warmup=12, keep_warmup=True, **KW)
    np.testing.assert_array_equal(trace.warmup_draws, full.warmup_draws[:, 1::2])
    np.testing.assert_array_equal(trace.warmup_stats["lp"], full.warmup_stats["lp"][:, 1::2])


def test_warnings_through_sample_point_at_the_callers_line():
    def stuck_step(rng_key, x):
        return x, {"acceptance_rate": jnp.zeros(())}

    kernel = cr.Kernel(init=lambda p, k: p, step=stuck_step)
    for call in (cr.run, cr.sample):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call(kernel, jax.random.key(0), X0, 20, progress=False)  # this line
        found = [w for w in caught if issubclass(w.category, ChainrunnerWarning)]
        assert found, call
        assert all(w.filename == __file__ for w in found), [w.filename for w in found]


def test_interruption_warning_points_at_the_callers_line(monkeypatch):
    from chainrunner.pipeline import _run

    monkeypatch.setattr(_run, "progress_bar", lambda *a, **k: InterruptingBar(at=3))
    with pytest.warns(ChainrunnerWarning, match="interrupted") as caught:
        cr.sample(NUTS, jax.random.key(0), X0, 20, chunk_size=5, **KW)
    assert caught[0].filename == __file__


def test_plain_function_as_kernel_gets_chainrunners_error():
    with pytest.raises(
        TypeError, match=r"kernel must be a blackjax SamplingAlgorithm.*'logdensity'"
    ):
        cr.run(logdensity, jax.random.key(0), X0, 10, **KW)


def test_bare_numpyro_model_still_runs():
    def model():
        numpyro.sample("x", dist.Normal())

    trace = cr.run(model, jax.random.key(0), None, 10, num_warmup=10, num_chains=2, **KW)
    assert trace.draws["x"].shape == (2, 10)


def test_monitor_cost_grows_with_the_chunk_not_the_run(monkeypatch):
    sizes = []

    def counting(draws):
        sizes.append(jax.tree.leaves(draws)[0].shape[1])
        return {"rhat": "1.000"}

    monkeypatch.setattr(_host, "monitor_values", counting)
    cr.run(NUTS, jax.random.key(0), X0, 400, chunk_size=10, monitor=True, **KW)
    # 40 chunks; recomputing every chunk would pass 10 + 20 + ... + 400 = 8200 draws.
    assert sum(sizes) <= 2 * 400 + 10, sizes
    assert sizes[-1] >= 200  # and it still follows the run


def test_window_adaptation_refuses_factories_without_a_mass_matrix():
    with pytest.raises(TypeError, match="takes no inverse_mass_matrix"):
        cr.from_blackjax(blackjax.mala, logdensity_fn=logdensity, adaptation="window")


def test_compile_cache_is_bounded_and_shared():
    assert _compile._EXECUTABLES.size == _compile.CACHE_SIZE


def test_no_import_circles_and_no_long_functions():
    tool = os.path.join(HERE, "..", "..", "shared", "tools", "house.py")
    if not os.path.exists(tool):
        pytest.skip("../shared/tools/house.py is not beside this checkout")
    out = subprocess.run(
        [sys.executable, tool, os.path.join(HERE, "..", "chainrunner"), "--max-lines", "60"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_monitor_values_reads_rhat_and_ess():
    draws = np.random.default_rng(0).normal(size=(4, 200))
    out = _diagnostics.monitor_values(draws)
    assert set(out) == {"rhat", "ess_bulk", "ess_tail"} and float(out["rhat"]) < 1.05


ARVIZ_MISSING = """
import sys
sys.modules["arviz"] = None  # `import arviz` now raises ImportError, on every thread
import jax
jax.config.update("jax_num_cpu_devices", 2)
import blackjax, jax.numpy as jnp
import chainrunner as cr
nuts = blackjax.nuts(lambda x: -0.5 * jnp.sum(x**2), 0.8, jnp.ones(2))
try:
    cr.sample(nuts, jax.random.key(0), jnp.zeros((2, 2)), 20, progress=False)
except ImportError as e:
    print("raised:", e)
"""


def test_arviz_import_error_on_the_preload_thread_reaches_the_caller():
    out = subprocess.run([sys.executable, "-c", ARVIZ_MISSING], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "raised:" in out.stdout and "arviz" in out.stdout, out.stdout + out.stderr[-2000:]
