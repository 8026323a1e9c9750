"""run: statistics, reproducibility, chunking, continuation, caching."""

import logging
import threading
import types

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chainrunner as cr
from chainrunner.core import _threads
from chainrunner.programs import _compile, _programs


def std_normal(x):
    return -0.5 * jnp.sum(x**2)


NUTS = blackjax.nuts(std_normal, 0.9, jnp.ones(3))


def check_moments(trace, name="x"):
    """Mean 0 and sd 1 for every coordinate, within 4 Monte-Carlo standard errors."""
    import arviz as az

    summary = az.summary(trace.to_arviz(), var_names=[name])
    assert np.all(summary["ess_bulk"] > 50), summary
    z_mean = summary["mean"] / summary["mcse_mean"]
    z_sd = (summary["sd"] - 1.0) / summary["mcse_sd"]
    assert np.all(np.abs(z_mean) < 4.0), summary
    assert np.all(np.abs(z_sd) < 4.0), summary


def x0(num_chains, dim=3, seed=0):
    return jnp.asarray(np.random.default_rng(seed).normal(size=(num_chains, dim)), jnp.float32)


def test_nuts_standard_normal_moments():
    trace = cr.run(NUTS, jax.random.key(0), x0(8), 1000, num_warmup=100, progress=False)
    assert trace.draws.shape == (8, 1000, 3)
    assert set(trace.stats) == {
        "diverging", "energy", "lp", "acceptance_rate", "n_steps", "tree_depth"
    }  # fmt: skip
    for v in trace.stats.values():
        assert v.shape == (8, 1000)
    assert not trace.stats["diverging"].any()
    np.testing.assert_allclose(trace.stats["lp"], -0.5 * np.sum(trace.draws**2, -1), rtol=1e-5)
    check_moments(trace)


@pytest.mark.parametrize(
    ("name", "algorithm", "num_samples", "thinning"),
    [
        ("hmc", blackjax.hmc(std_normal, 0.5, jnp.ones(3), 5), 1000, 1),
        ("mala", blackjax.mala(std_normal, 0.5), 2000, 2),
        # rmh's proposal_generator returns the proposed position: a symmetric random walk.
        (
            "rmh",
            blackjax.rmh(std_normal, lambda k, x: x + 1.2 * jax.random.normal(k, x.shape)),
            4000,
            4,
        ),
    ],
)
def test_other_blackjax_kernels(name, algorithm, num_samples, thinning):
    trace = cr.run(
        algorithm,
        jax.random.key(1),
        x0(8),
        num_samples,
        num_warmup=200,
        thinning=thinning,
        mesh=cr.chain_mesh(4),
        progress=False,
    )
    assert trace.draws.shape == (8, num_samples // thinning, 3)
    assert "acceptance_rate" in trace.stats and "lp" in trace.stats
    check_moments(trace)


def test_hand_written_kernel():
    """An AR(1) chain with stationary N(0, 1): a cr.Kernel needs no blackjax."""

    def step(rng_key, state):
        x = 0.5 * state + jnp.sqrt(0.75) * jax.random.normal(rng_key, state.shape)
        return x, {"acceptance_rate": jnp.float32(1.0)}

    kernel = cr.Kernel(init=lambda position, rng_key: position, step=step)
    trace = cr.run(kernel, jax.random.key(2), x0(6), 2000, num_warmup=20, progress=False)
    assert set(trace.stats) == {"acceptance_rate"}
    check_moments(trace)


def test_same_seed_same_layout_is_bitwise():
    kw = {"mesh": cr.chain_mesh(4), "batch_size": 2, "progress": False}
    a = cr.run(NUTS, jax.random.key(3), x0(6), 100, **kw)
    b = cr.run(NUTS, jax.random.key(3), x0(6), 100, **kw)
    c = cr.run(NUTS, jax.random.key(4), x0(6), 100, **kw)
    np.testing.assert_array_equal(a.draws, b.draws)
    for k in a.stats:
        np.testing.assert_array_equal(a.stats[k], b.stats[k])
    assert not np.array_equal(a.draws, c.draws)
    # Chains differ from one another (keys per chain, not shared).
    assert not np.array_equal(a.draws[0], a.draws[1])


def test_same_batch_width_is_bitwise_across_device_counts():
    """Documented promise: the draws depend on the per-device vmap width, not the devices."""
    draws = {}
    for d, b in [(1, 1), (2, 1), (8, 1), (8, None), (4, 2), (1, 2)]:  # meshes 1, 2, 4, 8
        trace = cr.run(NUTS, jax.random.key(5), x0(8), 50, mesh=cr.chain_mesh(d), batch_size=b,
                       progress=False)  # fmt: skip
        width = 8 // d if b is None else min(b, 8 // d)
        draws.setdefault(width, []).append(trace.draws)
    for same in draws.values():
        for other in same[1:]:
            np.testing.assert_array_equal(same[0], other)
    # Different widths agree to float32 round-off (XLA may sum in another order).
    np.testing.assert_allclose(draws[1][0], draws[2][0], atol=2e-5)


def test_padding_does_not_change_draws():
    """13 chains on 8 devices (3 padded) equal the same 13 chains on one device."""
    a = cr.run(NUTS, jax.random.key(6), x0(13), 40, mesh=cr.chain_mesh(8), batch_size=1,
               progress=False)  # fmt: skip
    b = cr.run(NUTS, jax.random.key(6), x0(13), 40, mesh=cr.chain_mesh(1), batch_size=1,
               progress=False)  # fmt: skip
    assert a.draws.shape == (13, 40, 3)
    assert a.attrs["padded_chains"] == 3
    np.testing.assert_array_equal(a.draws, b.draws)


@pytest.mark.parametrize("chunk_size", [1, 7, 30, 64])
def test_chunked_equals_unchunked(chunk_size):
    kw = {"mesh": cr.chain_mesh(2), "progress": False}
    whole = cr.run(NUTS, jax.random.key(7), x0(4), 60, num_warmup=4, **kw)
    parts = cr.run(NUTS, jax.random.key(7), x0(4), 60, num_warmup=4, chunk_size=chunk_size, **kw)
    np.testing.assert_array_equal(whole.draws, parts.draws)
    np.testing.assert_array_equal(whole.stats["energy"], parts.stats["energy"])


def test_thinning_keeps_every_kth_step():
    kw = {"mesh": cr.chain_mesh(2), "progress": False}
    full = cr.run(NUTS, jax.random.key(8), x0(4), 60, **kw)
    thin = cr.run(NUTS, jax.random.key(8), x0(4), 60, thinning=3, chunk_size=7, **kw)
    np.testing.assert_array_equal(thin.draws, full.draws[:, 2::3])


def test_continue_equals_one_long_run():
    kw = {"mesh": cr.chain_mesh(4), "progress": False, "chunk_size": 16}
    long = cr.run(NUTS, jax.random.key(9), x0(5), 80, num_warmup=10, **kw)
    first = cr.run(NUTS, jax.random.key(9), x0(5), 30, num_warmup=10, **kw)
    second = cr.run(NUTS, jax.random.key(9), first, 50, **kw)
    assert second.num_steps == long.num_steps == 90
    np.testing.assert_array_equal(np.concatenate([first.draws, second.draws], 1), long.draws)
    # final_state keeps the chain axis, sharded over the mesh.
    assert second.final_state.position.shape == (5, 3)


def test_keep_warmup():
    kw = {"mesh": cr.chain_mesh(2), "progress": False, "chunk_size": 7}
    kept = cr.run(NUTS, jax.random.key(10), x0(2), 20, num_warmup=10, keep_warmup=True, **kw)
    assert kept.warmup_draws.shape == (2, 10, 3)
    assert kept.warmup_stats["diverging"].shape == (2, 10)
    allsteps = cr.run(NUTS, jax.random.key(10), x0(2), 30, **kw)
    np.testing.assert_array_equal(
        np.concatenate([kept.warmup_draws, kept.draws], 1), allsteps.draws
    )
    dropped = cr.run(NUTS, jax.random.key(10), x0(2), 20, num_warmup=10, **kw)
    assert dropped.warmup_draws is None
    np.testing.assert_array_equal(dropped.draws, kept.draws)


def test_pytree_positions():
    nuts = blackjax.nuts(lambda p: std_normal(p["a"]) + std_normal(p["b"]), 0.8,
                         jnp.ones(3))  # fmt: skip
    pos = {"a": jnp.zeros((3, 2)), "b": jnp.ones((3,))}
    trace = cr.run(nuts, jax.random.key(11), pos, 20, progress=False)
    assert trace.draws["a"].shape == (3, 20, 2) and trace.draws["b"].shape == (3, 20)


def test_no_recompile_for_new_seed_values_or_length():
    # A log density of this test's own: programs are found by what they compute, and
    # another test's run of the same computation would have compiled them already.
    nuts = blackjax.nuts(lambda x: -0.5 * jnp.sum((x / 1.0625) ** 2), 0.9, jnp.ones(3))
    kw = {"mesh": cr.chain_mesh(4), "batch_size": 1, "chunk_size": 25, "progress": False}
    cr.run(nuts, jax.random.key(12), x0(6), 50, **kw)
    before = dict(_compile.compile_counts)
    cr.run(nuts, jax.random.key(13), x0(6, seed=1), 50, **kw)  # new seed and values
    cr.run(nuts, jax.random.key(13), x0(6), 100, **kw)  # a whole number of chunks
    cr.run(nuts, jax.random.key(13), x0(6), 60, num_warmup=15, **kw)  # any length, in fact
    assert _compile.compile_counts == before
    # A new chunk length or layout is a new program.
    cr.run(nuts, jax.random.key(13), x0(6), 50, **{**kw, "chunk_size": 10})
    assert _compile.compile_counts["chunk"] == before["chunk"] + 1


def test_replicated_params_are_reused_while_their_leaves_live():
    """A repeated run's data are replicated once (jax arrays are immutable); numpy data,
    which can change in place, are copied every time; the entry dies with its leaves."""
    import gc

    from chainrunner.pipeline import _start

    two, four = cr.chain_mesh(2), cr.chain_mesh(4)
    kernel = types.SimpleNamespace(params={"y": jnp.arange(3.0), "n": jnp.int32(3)})
    placed = _start.replicate_params(kernel, two)
    assert placed["y"].sharding.is_fully_replicated and len(placed["y"].devices()) == 2
    assert _start.replicate_params(kernel, two) is placed
    assert _start.replicate_params(types.SimpleNamespace(params=dict(kernel.params)), two) is placed
    assert _start.replicate_params(kernel, four) is not placed  # another mesh
    host = types.SimpleNamespace(params={"y": np.arange(3.0)})
    first = _start.replicate_params(host, two)
    host.params["y"][0] = 7.0  # changed in place: the next run sees it
    assert first["y"][0] == 0.0 and _start.replicate_params(host, two)["y"][0] == 7.0
    leaves, treedef = jax.tree.flatten(kernel.params)
    keys = [(mesh, treedef, *map(id, leaves)) for mesh in (two, four)]
    assert all(key in _start._REPLICATED for key in keys)
    del kernel, placed, leaves
    gc.collect()
    assert not any(key in _start._REPLICATED for key in keys)  # gone with the leaves


def test_second_call_compiles_nothing(caplog):
    """JAX's own compile log: a repeated run with a new seed and start compiles nothing."""
    kw = {"mesh": cr.chain_mesh(8), "batch_size": 2, "chunk_size": 10, "progress": False}
    nuts = blackjax.nuts(lambda x: std_normal(x) - 0.25, 0.9, jnp.ones(3))  # this test's own

    def compiles(seed, start):
        caplog.clear()
        with jax.log_compiles(True), caplog.at_level(logging.WARNING, logger="jax"):
            cr.run(nuts, jax.random.key(seed), start, 30, **kw)
        return [r.getMessage() for r in caplog.records if "ompil" in r.getMessage()]

    assert compiles(14, x0(10))  # the log does see compilations (and lowerings)
    # Every run traces its programs, to find them by what they compute; the same traces
    # again are neither lowered ("Compiling ..." in JAX's log) nor compiled.
    assert compiles(15, x0(10, seed=2)) == []


def test_first_call_compiles_only_the_init_and_the_loop(caplog):
    """Chain keys derive inside the two programs: no helper program compiles."""
    # a computation no other test runs: nothing is cached (programs are found by what
    # they compute, not by the kernel object)
    nuts = blackjax.nuts(lambda x: std_normal(x) - 0.16, 0.7, jnp.ones(3))
    start, key = np.zeros((8, 3), np.float32), jax.random.key(16)  # 8 chains: no padding
    with jax.log_compiles(True), caplog.at_level(logging.WARNING, logger="jax"):
        cr.run(nuts, key, start, 30, mesh=cr.chain_mesh(4), chunk_size=10, progress=False)
    done = [r.getMessage() for r in caplog.records]
    done = [m for m in done if m.startswith("Finished XLA compilation")]
    assert len(done) == 2, done


_COMPILED: list[str] = []  # the threads that compiled, while a test listens


def _listen(event, duration, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":
        _COMPILED.append(threading.current_thread().name)


jax.monitoring.register_event_duration_secs_listener(_listen)


def test_loop_compiles_on_a_second_thread_while_the_init_compiles():
    nuts = blackjax.nuts(lambda x: std_normal(x) - 0.18, 0.6, jnp.ones(3))  # nothing cached
    start, key = np.zeros((4, 3), np.float32), jax.random.key(18)
    _COMPILED.clear()
    trace = cr.run(nuts, key, start, 30, mesh=cr.chain_mesh(2), chunk_size=10, progress=False)
    assert sorted(_COMPILED) == sorted([threading.current_thread().name,
                                        "chainrunner-compile-loop"])  # fmt: skip
    assert trace.attrs["compile_time"] > 0
    _COMPILED.clear()
    cr.run(nuts, key, start, 30, mesh=cr.chain_mesh(2), chunk_size=10, progress=False)
    assert _COMPILED == []


def test_under_thread_local_jax_settings_the_loop_compiles_on_the_calling_thread():
    """jax's config contexts are thread-local: under one the second thread's settings
    differ, so the loop compiles on the calling thread, after the init as before. The
    x64 scope (run's for a PyMC kernel) is carried over to the second thread instead."""
    nuts = blackjax.nuts(lambda x: std_normal(x) - 0.27, 0.7, jnp.ones(3))  # nothing cached
    with jax.default_matmul_precision("highest"):
        _COMPILED.clear()
        cr.run(nuts, jax.random.key(17), np.zeros((4, 3), np.float32), 30,
               mesh=cr.chain_mesh(2), chunk_size=10, progress=False, warn=False)  # fmt: skip
    assert set(_COMPILED) == {threading.current_thread().name} and len(_COMPILED) >= 2
    with jax.enable_x64(True):
        nuts = blackjax.nuts(lambda x: std_normal(x) - 0.31, 0.7, jnp.ones(3, jnp.float64))
        start, key = np.zeros((4, 3), np.float64), jax.random.key(17)
        _COMPILED.clear()
        trace = cr.run(nuts, key, start, 30, mesh=cr.chain_mesh(2), chunk_size=10,
                       progress=False, warn=False)  # fmt: skip
    assert sorted(_COMPILED) == sorted([threading.current_thread().name,
                                        "chainrunner-compile-loop"])  # fmt: skip
    assert trace.draws.dtype == np.float64


def test_a_bad_start_is_reported_while_the_loop_still_compiles():
    def logdensity(x):
        return jnp.where(x[0] > 0, std_normal(x), -jnp.inf)

    nuts = blackjax.nuts(logdensity, 0.5, jnp.ones(3))
    start = np.ones((4, 3), np.float32)
    start[2, 0] = -1.0
    # An earlier test's compile may still run on its helper thread (a run that raised):
    # it would count here.
    for thread in list(_threads._LIVE):
        thread.join()
    counts, traced = dict(_compile.compile_counts), dict(_programs.trace_counts)
    with pytest.raises(ValueError, match=r"chain\(s\) \[2\]"):
        cr.run(nuts, jax.random.key(0), start, 30, mesh=cr.chain_mesh(2), progress=False)
    # The loop was traced before run raised (nothing is traced later, behind a test's back)
    assert _programs.trace_counts["chunk"] == traced.get("chunk", 0) + 1
    # and its compile lands in the cache: the corrected run compiles nothing more.
    start[2, 0] = 1.0
    trace = cr.run(nuts, jax.random.key(0), start, 30, mesh=cr.chain_mesh(2), progress=False,
                   warn=False)  # fmt: skip
    assert _compile.compile_counts["chunk"] == counts.get("chunk", 0) + 1
    assert trace.draws.shape == (4, 30, 3)


def test_retry_keys_fold_in_each_try():
    init, _ = _programs.chain_keys(jax.random.key(3), 3)
    got = jax.vmap(_programs.retry_key)(init, jnp.asarray([0, 1, 3]))
    fold = jax.random.fold_in
    want = [init[0], fold(init[1], 1), fold(fold(fold(init[2], 1), 2), 3)]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(jax.random.key_data(g), jax.random.key_data(w))


def test_non_finite_start_names_the_chains():
    def logdensity(x):
        return jnp.where(x[0] > 0, std_normal(x), -jnp.inf)

    nuts = blackjax.nuts(logdensity, 0.5, jnp.ones(3))
    start = jnp.ones((6, 3)).at[jnp.array([1, 4]), 0].set(-1.0)
    with pytest.raises(ValueError, match=r"not finite at the start of chain\(s\) \[1, 4\]"):
        cr.run(nuts, jax.random.key(0), start, 10, progress=False)


def test_progress_bar_one_bar_for_the_mesh(capsys):
    cr.run(NUTS, jax.random.key(0), x0(16), 40, num_warmup=20, chunk_size=10,
           mesh=cr.chain_mesh(8), progress=True)  # fmt: skip
    err = capsys.readouterr().err
    assert "60/60" in err and "sampling" in err
    # One bar for the whole mesh: it counts steps once, not once per device.
    assert "/480" not in err and "/120" not in err  # (not a rate such as 1480 step/s)
    cr.run(NUTS, jax.random.key(0), x0(16), 40, mesh=cr.chain_mesh(8), progress=False)
    assert capsys.readouterr().err == ""


def test_attrs_record_layout_and_times():
    trace = cr.run(NUTS, jax.random.key(0), x0(6), 20, mesh=cr.chain_mesh(4), batch_size=1,
                   progress=False)  # fmt: skip
    a = trace.attrs
    assert a["num_devices"] == 4 and a["chains_per_device"] == 2 and a["padded_chains"] == 2
    assert a["batch_size"] == 1 and a["chunk_size"] == 20  # min(total, default)
    assert a["jax_version"] == jax.__version__ and a["chainrunner_version"] == cr.__version__
    assert a["seed"] == [0, 0] and a["sampling_time"] > 0 and a["compile_time"] >= 0


def test_legacy_uint32_key_accepted():
    a = cr.run(NUTS, jax.random.PRNGKey(3), x0(2), 10, progress=False)
    b = cr.run(NUTS, jax.random.key(3), x0(2), 10, progress=False)
    np.testing.assert_array_equal(a.draws, b.draws)


def test_auto_batch_size_is_one_for_a_short_cpu_run_and_a_vmap_on_accelerators():
    """``batch_size="auto"`` (the default): a short CPU run keeps 1 (the compile
    dominates; ``tests/test_batch_choice.py`` tests the probe), None elsewhere."""
    trace = cr.run(NUTS, jax.random.key(0), x0(8), 20, mesh=cr.chain_mesh(2), progress=False)
    assert trace.attrs["batch_size"] == 1 and "auto" in trace.attrs["batch_size_choice"]
    one = cr.run(NUTS, jax.random.key(0), x0(8), 20, mesh=cr.chain_mesh(2), batch_size=1,
                 progress=False)  # fmt: skip
    np.testing.assert_array_equal(trace.draws, one.draws)  # the same program
    eight = cr.run(NUTS, jax.random.key(0), x0(8), 20, mesh=cr.chain_mesh(8), progress=False)
    np.testing.assert_array_equal(trace.draws, eight.draws)  # one chain per device: 1

    class Device:
        platform = "gpu"

    class Mesh:
        devices = np.array([Device(), Device()])
        shape = types.MappingProxyType({"chain": 2})

    from chainrunner.layout import _mesh

    assert _mesh.auto_batch_size("auto", Mesh(), 3)[0] is None
    assert _mesh.auto_batch_size("auto", Mesh(), 2) == (
        1,
        "auto: one chain per device on gpu, not vmapped",
    )
    assert _mesh.auto_batch_size(3, Mesh(), 3) == (3, "given")
    out = cr.chain_map(lambda x: 2 * x, mesh=cr.chain_mesh(2), batch_size="auto")(jnp.ones(5))
    np.testing.assert_array_equal(out, 2 * np.ones(5))
    with pytest.raises(TypeError, match="batch_size must be an int >= 1, None or 'auto'"):
        cr.run(NUTS, jax.random.key(0), x0(8), 20, batch_size="fast", progress=False)
