"""``batch_size="auto"``: chosen by a probe in the middle of the warmup, cached, and
bitwise a run of ``batch_size=1`` up to the switch continued with the chosen one."""

import types
import typing

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chainrunner as cr
from chainrunner import _choose, _loop, _switch


def logdensity(x):
    return -0.5 * jnp.sum(x**2)


NUTS = blackjax.nuts(logdensity, 0.9, jnp.ones(3))
X0 = jnp.asarray(np.random.default_rng(0).normal(size=(10, 3)), jnp.float32)


def run(batch_size="auto", num_samples=40, **kw):
    return cr.run(NUTS, jax.random.key(3), X0, num_samples, mesh=cr.chain_mesh(4),
                  batch_size=batch_size, progress=False, warn=False, **kw)  # fmt: skip


@pytest.fixture
def probes(monkeypatch):
    """Makes ``auto`` probe every run and see the vmapped program as faster (or not).

    Times are faked: a draw of the first program run (``batch_size=1``) takes 1 s; of any
    other 0.5 s if ``probes.vmap_wins``, else 2 s. Compiles of the vmapped program are
    counted.
    """
    _choose.forget()
    monkeypatch.setattr(_choose, "COST_SHARE", 1e9)
    seen, real_compile, real_chunk = [], _loop.compile_loop, _loop.run_chunk
    ns = types.SimpleNamespace(vmap_wins=True, vmap_compiles=0, vmap_fails=False)

    def fake_chunk(program, state, placed, thinning, sched, at, count):
        _, after, out = real_chunk(program, state, placed, thinning, sched, at, count)
        if not seen or program is seen[0]:
            seen.append(program)
            return 1.0 * count, after, out
        return (0.5 if ns.vmap_wins else 2.0) * count, after, out

    def counting_compile(kernel, plan, placed, *args, **kw):
        if placed.layout.batch_size is None:
            ns.vmap_compiles += 1
            if ns.vmap_fails:
                raise RuntimeError("this model cannot be vmapped")
        return real_compile(kernel, plan, placed, *args, **kw)

    monkeypatch.setattr(_loop, "run_chunk", fake_chunk)
    monkeypatch.setattr(_loop, "compile_loop", counting_compile)
    yield ns
    _choose.forget()


def one_then(width, draws, total, **kw):
    """A run of ``batch_size=1`` for ``draws`` draws, continued with ``width``."""
    part = run(batch_size=1, num_samples=draws, **kw)
    rest = cr.run(NUTS, jax.random.key(3), part, total - draws, mesh=cr.chain_mesh(4),
                  batch_size=width, progress=False, warn=False)  # fmt: skip
    return np.concatenate([part.draws, rest.draws], 1), rest


def test_a_probed_vmap_takes_over_the_run_of_batch_size_one_and_is_cached(probes):
    auto = run()
    a = auto.attrs
    assert a["batch_size"] == "all" and "one vmap" in a["batch_size_choice"], a
    assert a["batch_size_probe_time"] > 0 and probes.vmap_compiles >= 1
    # 40 draws: 2 probe draws with 1 (the run's own), the rest with the vmap
    expected, rest = one_then(None, 2, 40)
    np.testing.assert_array_equal(auto.draws, expected)
    np.testing.assert_array_equal(auto.final_state.position, rest.final_state.position)
    assert auto.num_steps == 40 and a["layout"] == rest.attrs["layout"]
    again = run()  # the same call: the cached choice, no timing, the same draws
    assert "earlier run" in again.attrs["batch_size_choice"]
    assert "batch_size_probe_time" not in again.attrs
    np.testing.assert_array_equal(auto.draws, again.draws)
    longer = cr.run(NUTS, jax.random.key(3), X0, 44, mesh=cr.chain_mesh(4), progress=False,
                    warn=False)  # fmt: skip
    assert "batch_size_probe_time" in longer.attrs  # another run length: probed again


def test_a_probed_loop_that_wins_keeps_batch_size_one(probes):
    probes.vmap_wins = False
    auto = run()
    assert auto.attrs["batch_size"] == 1 and "against" in auto.attrs["batch_size_choice"]
    np.testing.assert_array_equal(auto.draws, run(batch_size=1).draws)


@pytest.mark.parametrize("vmap_wins", [True, False])
def test_half_the_warmup_runs_with_one_and_the_probe_draws_are_the_runs_own(probes, vmap_wins):
    """Thinned, chunked, warmup kept: the first half of the warmup and the probe draws
    are those of ``batch_size=1``, and the run switches after them."""
    probes.vmap_wins = vmap_wins
    kw = {"num_warmup": 100, "thinning": 2, "keep_warmup": True, "chunk_size": 7}
    auto = run(**kw)  # 50 + 20 loop draws: the probe at the chunk boundary 28, 2 draws
    assert auto.attrs["batch_size"] == ("all" if vmap_wins else 1)
    one = run(batch_size=1, **kw)
    np.testing.assert_array_equal(auto.warmup_draws[:, :30], one.warmup_draws[:, :30])
    if not vmap_wins:
        np.testing.assert_array_equal(auto.warmup_draws, one.warmup_draws)
        np.testing.assert_array_equal(auto.draws, one.draws)
    assert auto.num_steps == one.num_steps == 140 and np.all(np.isfinite(auto.draws))
    assert auto.attrs["sampling_time"] >= 2.0  # the kept probe draws count as sampling


def test_after_a_burn_in_the_switch_is_at_the_first_draw(probes):
    """``warmup_until``: the burn-in windows run with 1, the probe at the first draw after."""
    kw = {"num_warmup": 20, "warmup_until": cr.Forgotten(window=4), "superchains": 2}
    auto = run(**kw)
    one = run(batch_size=1, **kw)
    assert auto.attrs["batch_size"] == "all"
    assert auto.attrs["burn_in_steps"] == one.attrs["burn_in_steps"]
    np.testing.assert_array_equal(auto.draws[:, :2], one.draws[:, :2])


def test_a_vmap_that_fails_leaves_the_run_to_batch_size_one(probes):
    probes.vmap_fails = True
    auto = run()
    a = auto.attrs
    assert a["batch_size"] == 1, a
    assert (
        "batch_size=None failed: RuntimeError: this model cannot be vmapped"
        in (a["batch_size_choice"])
    )
    np.testing.assert_array_equal(auto.draws, run(batch_size=1).draws)


def test_continuing_keeps_the_batch_size_and_superchains_follow_the_choice(probes):
    part = run(superchains=2)
    assert part.attrs["batch_size"] == "all"
    rest = cr.run(NUTS, jax.random.key(3), part, 20, mesh=cr.chain_mesh(4), progress=False,
                  warn=False)  # fmt: skip
    assert rest.attrs["batch_size"] == "all"
    assert rest.attrs["batch_size_choice"] == "auto: all, as the continued trace"
    expected, _ = one_then(None, 2, 60, superchains=2)
    np.testing.assert_array_equal(np.concatenate([part.draws, rest.draws], 1), expected)


def test_a_numpyro_model_switches_in_the_middle_of_its_warmup(probes):
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import NUTS as NumpyroNUTS

    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    kernel = cr.from_numpyro(NumpyroNUTS(model), model_args=(np.array([0.5, -0.3, 1.2]),))
    kw = {"num_warmup": 20, "num_chains": 10, "mesh": cr.chain_mesh(4), "progress": False,
          "warn": False, "keep_warmup": True, "chunk_size": 5}  # fmt: skip
    auto = cr.run(kernel, jax.random.key(0), None, 20, **kw)
    assert auto.attrs["batch_size"] == "all"
    one = cr.run(kernel, jax.random.key(0), None, 20, batch_size=1, **kw)
    # warmup 20, chunks of 5: the probe at draw 10 (2 of the 30 draws left)
    np.testing.assert_array_equal(auto.warmup_draws["mu"][:, :12], one.warmup_draws["mu"][:, :12])
    assert np.all(np.isfinite(auto.draws["mu"]))


def test_a_short_run_keeps_batch_size_one_without_compiling_a_vmap(monkeypatch):
    """The compile dominates: sampling with 1 is cheaper than a vmap's extra compile."""
    _choose.forget()
    calls = []
    real = _loop.compile_loop
    monkeypatch.setattr(_loop, "compile_loop", lambda k, plan, placed, *a, **kw: (
        calls.append(placed.layout.batch_size), real(k, plan, placed, *a, **kw))[1])  # fmt: skip
    auto = run()
    assert auto.attrs["batch_size"] == 1 and None not in calls
    assert "a vmapped program would add" in auto.attrs["batch_size_choice"]
    np.testing.assert_array_equal(auto.draws, run(batch_size=1).draws)
    # batch_size=1 draws do not depend on the device count
    eight = cr.run(NUTS, jax.random.key(3), X0, 40, mesh=cr.chain_mesh(8), batch_size=1,
                   progress=False, warn=False)  # fmt: skip
    np.testing.assert_array_equal(auto.draws, eight.draws)
    # The same call again: the cached 1 runs batch_size=1's chunks from the start, with
    # no stop at the switch point (nothing timed, nothing held)
    switched = []
    monkeypatch.setattr(_switch, "early", lambda *a: switched.append(a[4]))
    again = run()
    assert switched == [] and "earlier run" in again.attrs["batch_size_choice"]
    np.testing.assert_array_equal(again.draws, auto.draws)
    assert "batch_size_probe_time" not in again.attrs
    _choose.forget()


def test_no_probe_where_a_timing_could_not_be_repeated(probes, tmp_path):
    """Checkpoints (a resume must find the layout) and a given batch size: no probe."""
    ckpt = run(checkpoint=str(tmp_path / "c"))
    assert ckpt.attrs["batch_size"] == 1 and "checkpoint" in ckpt.attrs["batch_size_choice"]
    given = run(batch_size=2)
    assert given.attrs["batch_size_choice"] == "given"
    for trace in (ckpt, given):
        assert "batch_size_probe_time" not in trace.attrs


def test_one_chain_per_device_probes_a_vmap_of_one(probes, monkeypatch):
    """With one chain per device the candidate is a ``vmap`` of that chain (XLA may lay
    its step out better than the plain loop's); ``batch_size=1`` stays unbatched."""
    four = X0[:4]

    def one_each(batch_size="auto", num_samples=40, start=four, chunk_size=10, **kw):
        return cr.run(NUTS, jax.random.key(3), start, num_samples, mesh=cr.chain_mesh(4),
                      batch_size=batch_size, chunk_size=chunk_size, progress=False, warn=False,
                      **kw)  # fmt: skip

    auto = one_each()  # probed at the first chunk boundary: 10 + 2 draws with 1
    assert auto.attrs["batch_size"] == "all" and "one vmap" in auto.attrs["batch_size_choice"]
    assert auto.attrs["chains_per_device"] == 1 and probes.vmap_compiles >= 1
    part = one_each(batch_size=1, num_samples=12)
    assert part.attrs["batch_size"] == 1  # 1 stays 1 with one chain per device
    rest = one_each(batch_size=None, num_samples=28, start=part)
    np.testing.assert_array_equal(auto.draws, np.concatenate([part.draws, rest.draws], 1))
    at = []
    real_settle = _switch.settle

    def settle(*args):
        at.append(args[7])  # the loop draw it probes at
        return real_settle(*args)

    monkeypatch.setattr(_switch, "settle", settle)
    _choose.forget()
    one_each(num_warmup=40)  # a vmap of one waits for no chain: probed at once, not at 20
    assert at == [10]
    single = one_each(chunk_size=None)  # one chunk: not probed
    assert "not probed" in single.attrs["batch_size_choice"]
    probes.vmap_wins = False
    _choose.forget()
    kept = one_each()
    assert kept.attrs["batch_size"] == 1
    np.testing.assert_array_equal(kept.draws, one_each(batch_size=1).draws)


def test_settle_decides_from_the_probe_times():
    """The decision alone, on made-up times (seconds per draw for each batch size)."""
    _choose.forget()

    def probe(per_draw, per_device=4, compile_time=2.0, remaining=990, count=10, elapsed=0):
        built = []

        def time(width):
            built.append(width)
            return count * per_draw[width]

        one = count * per_draw[1]
        probe = _choose.Probe(one, count, remaining, compile_time, per_device, time, elapsed)
        return probe, built

    # 1000 draws x 1 ms: a 1 s run; a vmap adds 1.75 x 2 s of compile, over 10 %: stays 1
    p, built = probe({1: 1e-3, None: 1e-4})
    choice = _choose.settle(("a",), p)
    assert (choice.batch_size, built) == (1, [])
    assert "over 10% of it" in choice.reason
    p, built = probe({1: 1e-3, None: 1e-4}, elapsed=40.0)  # 41 s so far: 3.5 s is under
    assert _choose.settle(("a2",), p).batch_size is None and built == [None]
    p, built = probe({1: 0.1, None: 0.05})  # 100 s: probed, the vmap is faster
    choice = _choose.settle(("b",), p)
    assert (choice.batch_size, built) == (None, [None])
    assert choice.reason == (
        "auto: all, one vmap (10 probe draws: 0.5 s, against 1 s with batch_size=1)"
    )
    assert _choose._CHOICES.lookup(("b",)) == (True, (None, choice.reason))
    again = _choose.settle(("b",), p)  # cached: no timing
    assert again.batch_size is None and "earlier run" in again.reason and built == [None]
    p, built = probe({1: 0.1, None: 0.2})  # probed, 1 faster
    choice = _choose.settle(("c",), p)
    assert (choice.batch_size, built) == (1, [None])
    assert "against 2 s with batch_size=None" in choice.reason
    # many chains per device: vmaps of 8 first; one vmap of all too if both compiles fit
    # in 10 % of the run (100 s with 1, against 2 x 1.75 x 2 s)
    p, built = probe({1: 0.1, None: 0.2, 8: 0.05}, per_device=100)
    assert _choose.settle(("d",), p).batch_size == 8 and built == [8, None]
    p, built = probe({1: 0.1, None: 0.01, 8: 0.05}, per_device=100)
    assert _choose.settle(("e",), p).batch_size is None and built == [8, None]
    p, built = probe({1: 0.05, None: 0.01, 8: 0.02}, per_device=100)  # 50 s: one compile
    assert _choose.settle(("f",), p).batch_size == 8 and built == [8]
    _choose.forget()


def test_a_short_run_keeps_one_without_a_probe_and_its_chunks():
    """The draws before the switch already say a vmap's compile does not pay: no probe,
    no extra chunk (the next one dispatched before the held one is collected), the
    draws of ``batch_size=1``; ``until`` checks on the held chunk still stop the run."""
    _choose.forget()
    kw = {"num_warmup": 40, "chunk_size": 10, "keep_warmup": True}
    auto = run(**kw)  # switch at loop draw 20: 2 chunks of 1, then the rest
    assert auto.attrs["batch_size"] == 1, auto.attrs["batch_size_choice"]
    assert "at the pace of its draws so far" in auto.attrs["batch_size_choice"]
    assert "batch_size_probe_time" not in auto.attrs
    one = run(batch_size=1, **kw)
    np.testing.assert_array_equal(auto.warmup_draws, one.warmup_draws)
    np.testing.assert_array_equal(auto.draws, one.draws)
    np.testing.assert_array_equal(auto.final_state.position, one.final_state.position)
    _choose.forget()


def test_the_draws_before_the_switch_can_spare_the_probe():
    """``without_probe``: at the pace of the draws so far, a vmap's compile (1.75 x 2 s)
    over 20 % of the run keeps 1 without a probe (cached); a cached vmap still probes
    (its switch comes after the probe draws); no pace yet: probe."""
    _choose.forget()
    early = _choose.without_probe(("g",), 1e-3, 1000, 5.0, 2.0)  # 6 s: 3.5 s is 58 %
    assert early.batch_size == 1 and "over 20% of it" in early.reason
    assert _choose.without_probe(("g",), 1.0, 1000, 5.0, 2.0).batch_size == 1  # cached
    assert _choose.without_probe(("h",), 0.02, 1000, 5.0, 2.0) is None  # 25 s: 14 %
    assert _choose.without_probe(("h",), None, 1000, 5.0, 2.0) is None
    _choose._CHOICES.put(("i",), (8, "auto: 8"))
    assert _choose.without_probe(("i",), 1e-3, 1000, 5.0, 2.0) is None
    _choose.forget()


def test_accelerators_take_one_vmap_and_ensembles_their_width():
    class Device:
        platform = "gpu"

    class Mesh:
        devices = np.array([Device()])
        shape: typing.ClassVar = {"chain": 1}

    class Plan:
        batch_size = "auto"

    class Kernel:
        ensemble = None

    class Start:
        num_chains, kernel = 64, Kernel()

    assert _choose.choose(Plan(), Start(), Mesh()).batch_size is None
    Plan.batch_size = 3
    assert _choose.choose(Plan(), Start(), Mesh()) == (3, "given", False, False)


def test_a_quiet_run_switches_where_a_watched_one_does(probes):
    """Without a progress bar the chunks are up to 2000 draws, but ``auto`` probes on the
    grid of 250: a run switches at the same draw, with the same draws, either way."""
    quiet = run(num_warmup=600, num_samples=600)  # the middle of the warmup, 300: probe at 500
    # The same call with a bar: the cached choice, at the draw where the probe came
    watched = cr.run(NUTS, jax.random.key(3), X0, 600, num_warmup=600, mesh=cr.chain_mesh(4),
                     progress=True, warn=False)  # fmt: skip
    assert (quiet.attrs["chunk_size"], watched.attrs["chunk_size"]) == (2000, 250)
    assert quiet.attrs["batch_size"] == watched.attrs["batch_size"] == "all"
    assert "earlier run" in watched.attrs["batch_size_choice"]
    np.testing.assert_array_equal(quiet.draws, watched.draws)
    np.testing.assert_array_equal(quiet.stats["energy"], watched.stats["energy"])
