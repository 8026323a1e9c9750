"""``batch_size="auto"``: decided once, before the loop, from facts of the call (never a
timing), so the same call gives the same batch size and draws in every process."""

import os
import subprocess
import sys
import textwrap
import types
import typing

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chainrunner as cr
from chainrunner.adapters import as_adapter
from chainrunner.pipeline import _loop
from chainrunner.programs import _choose


def logdensity(x):
    return -0.5 * jnp.sum(x**2)


NUTS = blackjax.nuts(logdensity, 0.9, jnp.ones(3))
X0 = jnp.asarray(np.random.default_rng(0).normal(size=(10, 3)), jnp.float32)


def run(batch_size="auto", num_samples=40, mesh=4, **kw):
    return cr.run(NUTS, jax.random.key(3), X0, num_samples, mesh=cr.chain_mesh(mesh),
                  batch_size=batch_size, progress=False, warn=False, **kw)  # fmt: skip


@pytest.fixture
def long_runs(monkeypatch):
    """Makes every run "long" at the rule's rates: a step costs a second a flop."""
    monkeypatch.setattr(_choose, "FLOPS_PER_S", 1.0)
    monkeypatch.setattr(_choose, "MATRIX_FLOPS", 1.0)


def test_a_short_run_keeps_batch_size_one(monkeypatch):
    """A short run of a small model: ``1``, with the step's cost in the reason; the draws
    are ``batch_size=1``'s, on any device count. The rule has no timing in it."""
    auto = run()
    assert auto.attrs["batch_size"] == 1
    assert auto.attrs["batch_size_choice"].startswith(
        "auto: 1, chains one after another (40 steps x 3 chains per device, "
    )
    np.testing.assert_array_equal(auto.draws, run(batch_size=1).draws)
    np.testing.assert_array_equal(auto.draws, run(mesh=8).draws)  # 1 on 8 devices too
    assert "batch_size_probe_time" not in auto.attrs


def test_compile_options_follow_the_layout_and_the_step(monkeypatch):
    """``1`` on CPU with a step under ``MATRIX_FLOPS`` compiles with less optimisation (a
    fact of the call: the same options in every process, part of the program's key);
    a vmap, matrix work and an unknown step keep XLA's defaults. The draws of ``1`` are
    those of the plain loop still: the same with auto and given."""
    start = types.SimpleNamespace(kernel=as_adapter(NUTS).build_kernel(num_warmup=0),
                                  state=None, position=X0, cross_chain=False)  # fmt: skip
    mesh = cr.chain_mesh(2)
    cheap = _choose.compile_options(start, mesh, 1)
    names = {"xla_cpu_use_fusion_emitters"} if _choose._old_jax() else {
        "xla_backend_optimization_level"}  # fmt: skip
    assert {k for k, _ in cheap} == names
    assert _choose.compile_options(start, mesh, None) == ()
    assert _choose.compile_options(start, mesh, 8) == ()
    monkeypatch.setattr(_choose, "step_flops", lambda start: 2 * _choose.MATRIX_FLOPS)
    assert _choose.compile_options(start, mesh, 1) == ()
    monkeypatch.setattr(_choose, "step_flops", lambda start: None)
    assert _choose.compile_options(start, mesh, 1) == ()
    monkeypatch.undo()
    seen = []
    real = _loop.compile_loop
    monkeypatch.setattr(_loop, "compile_loop", lambda k, plan, placed, *a, **kw: (
        seen.append(placed.options), real(k, plan, placed, *a, **kw))[1])  # fmt: skip
    run(batch_size=1)
    run(batch_size=None)
    assert seen == [cheap, ()]


def test_the_init_program_compiles_with_the_least_optimisation_on_cpu(monkeypatch):
    """The init program runs once a call: on CPU it compiles at LLVM's level 0 without the
    expensive passes (on jax 0.10 only beside the older fusion emitters), with the chunk
    program's other options. The same options in every process: the same call gives the
    same draws."""
    mesh = cr.chain_mesh(2)
    cheap = _choose.INIT_OPTIONS
    assert _choose.init_compile_options((), mesh) == (() if _choose._old_jax() else cheap)
    level_one = (("xla_backend_optimization_level", 1),)
    assert _choose.init_compile_options(level_one, mesh) == cheap
    emitters = (("xla_cpu_use_fusion_emitters", False),)
    assert _choose.init_compile_options(emitters, mesh) == (*emitters, *cheap)
    from chainrunner.pipeline import _init

    seen, chunks = [], []
    real, real_loop = _init.compiled, _loop.compile_loop
    monkeypatch.setattr(_init, "compiled", lambda kind, program, args, hook, options: (
        seen.append((kind, options)), real(kind, program, args, hook, options))[1])  # fmt: skip
    monkeypatch.setattr(_loop, "compile_loop", lambda k, plan, placed, *a, **kw: (
        chunks.append(placed.options), real_loop(k, plan, placed, *a, **kw))[1])  # fmt: skip
    first = run(batch_size=None, num_samples=10)
    run(batch_size=1, num_samples=10)
    assert chunks[0] == () and chunks[1] != ()  # the chunk's own: XLA's defaults, then less
    assert seen == [("init", _choose.init_compile_options(c, mesh)) for c in chunks]
    assert ("xla_backend_optimization_level", 0) in seen[1][1]
    np.testing.assert_array_equal(first.draws, run(batch_size=None, num_samples=10).draws)


def test_a_long_matrix_run_takes_vmaps_decided_before_the_loop(long_runs, monkeypatch):
    """A long run of a step XLA costs as matrix work takes a vmap from its first draw:
    bitwise the run of that fixed ``batch_size``, and the reason names the facts."""
    compiled = []
    real = _loop.compile_loop
    monkeypatch.setattr(_loop, "compile_loop", lambda k, plan, placed, *a, **kw: (
        compiled.append(placed.layout.batch_size), real(k, plan, placed, *a, **kw))[1])  # fmt: skip
    auto = run(num_warmup=20, keep_warmup=True)
    assert auto.attrs["batch_size"] == "all" and set(compiled) == {None}  # no probe of 1
    reason = auto.attrs["batch_size_choice"]
    assert reason.startswith("auto: all, one vmap (60 steps x 3 chains per device, ")
    assert "flops a step" in reason and "more than its 3 s compile" in reason
    fixed = run(batch_size=None, num_warmup=20, keep_warmup=True)
    np.testing.assert_array_equal(auto.draws, fixed.draws)
    np.testing.assert_array_equal(auto.warmup_draws, fixed.warmup_draws)
    wide = cr.run(NUTS, jax.random.key(3), jnp.tile(X0, (4, 1)), 10, mesh=cr.chain_mesh(2),
                  progress=False, warn=False)  # fmt: skip
    assert wide.attrs["batch_size"] == 8 and "vmaps of 8 chains" in wide.attrs["batch_size_choice"]
    assert wide.attrs["chains_per_device"] == 24  # 20 chains each, in 3 vmaps of 8
    assert wide.attrs["padded_chains"] == 8


def test_continuing_and_checkpoints_follow_the_rule(long_runs, tmp_path):
    """A continued trace keeps its batch size; a checkpointed run decides as any other
    (nothing timed, so a resumed run finds the same layout)."""
    first = run(num_samples=20)
    more = cr.run(NUTS, jax.random.key(3), first, 20, mesh=cr.chain_mesh(4), progress=False,
                  warn=False)  # fmt: skip
    assert more.attrs["batch_size"] == first.attrs["batch_size"] == "all"
    assert "as the continued trace" in more.attrs["batch_size_choice"]
    ckpt = run(checkpoint=str(tmp_path / "c"))
    assert ckpt.attrs["batch_size"] == "all"
    again = run(checkpoint=str(tmp_path / "c"))
    np.testing.assert_array_equal(ckpt.draws, again.draws)


def test_the_rule_on_its_facts(monkeypatch):
    """The decision alone: the step's flops, the run's length and the chains per device."""
    flops = {"value": 1e6}
    monkeypatch.setattr(_choose, "step_flops", lambda start: flops["value"])

    def choose(num_samples, chains=64, devices=2, warmup=0, machine=None, thinning=1):
        plan = types.SimpleNamespace(batch_size="auto", num_warmup=warmup,
                                     num_samples=num_samples, thinning=thinning)  # fmt: skip
        kernel = types.SimpleNamespace(ensemble=None, machine=machine)
        start = types.SimpleNamespace(num_chains=chains, kernel=kernel, previous_batch_size=None,
                                      cross_chain=False)  # fmt: skip
        return _choose.choose(plan, start, cr.chain_mesh(devices))

    # 32 chains per device x 2000 steps of 1e6 flops: about 54 s with 1; a vmap at 1.2x
    # would save 9 s, more than its 3 s compile: vmaps of 8
    assert choose(1000, warmup=1000).batch_size == 8
    assert choose(1000, warmup=1000, chains=8, devices=8).batch_size == 1  # 1.7 s: too short
    assert choose(40000, chains=8, devices=8).batch_size is None  # 34 s: a vmap of one
    assert "less than its 3 s compile" in choose(20000, chains=8, devices=8).reason  # 17 s
    flops["value"] = 1e3  # a small model: a vmap is not faster on jax >= 0.11
    monkeypatch.setattr(_choose, "_old_jax", lambda: False)
    assert "a vmap is not faster" in choose(100000).reason
    monkeypatch.setattr(_choose, "_old_jax", lambda: True)  # on jax 0.10 it is, if long
    assert choose(100000).batch_size is None  # one vmap of all: per-op overhead
    assert choose(100000, chains=8).batch_size == 1  # 4 chains per device
    # 11000 steps x 32 chains per device: about 9.1 s with 1. A plain vmap at 1.4x would
    # save 2.6 s, less than its compile; NUTS as the state machine, at 1.6x, 3.4 s: more.
    assert choose(11000).batch_size == 1
    as_machine = choose(11000, machine=lambda extract, length: None)
    assert as_machine.batch_size is None and "1.6x (NUTS as the state machine)" in as_machine.reason
    # with thinning a vmap runs the plain loop (chunk_loop): priced as one
    assert choose(11000, machine=lambda extract, length: None, thinning=2).batch_size == 1
    monkeypatch.setattr(_choose, "_old_jax", lambda: False)  # jax 0.12: 1 (the machine 0.37-0.71x)
    assert choose(11000, machine=lambda extract, length: None).batch_size == 1
    monkeypatch.setattr(_choose, "_old_jax", lambda: True)
    flops["value"] = None
    assert "unknown" in choose(100000).reason


def test_step_flops_are_read_from_the_one_trace_of_the_step(monkeypatch):
    """``step_flops``: the arithmetic of one chain's step, read from the jaxpr of the trace
    the run makes anyway (``kernel_step``, also the draw's shape): one trace per kernel
    and shapes, nothing lowered; it grows with the model."""
    X = np.random.default_rng(0).normal(size=(2000, 20)).astype(np.float32)

    def logistic(b):
        return -jnp.sum(jnp.logaddexp(0.0, X @ b)) - 0.5 * jnp.sum(b**2)

    def start_of(algorithm, d):
        kernel = as_adapter(algorithm).build_kernel(num_warmup=0)
        return types.SimpleNamespace(kernel=kernel, state=None, position=jnp.zeros((4, d)))

    small = _choose.step_flops(start_of(NUTS, 3))
    big = _choose.step_flops(start_of(blackjax.nuts(logistic, 0.1, jnp.ones(20)), 20))
    assert 0 < small < 1e4 and big > 2 * 2000 * 20  # the matrix-vector product, at least
    assert big > _choose.MATRIX_FLOPS > small

    monkeypatch.setattr(jax.stages.Lowered, "cost_analysis", None)  # XLA is not asked
    assert _choose.step_flops(start_of(blackjax.nuts(logistic, 0.2, jnp.ones(20)), 20)) == big


def test_a_run_traces_its_kernels_step_once(monkeypatch):
    """The rule's cost of the step, the draw's shape and the chunk program all read one
    trace of the kernel's step (``kernel_step``), and the init program replays the init
    that trace started from: a run that costs its step traces the kernel's Python once
    each, and a second call once again (what they read may have changed since); its
    draws are the same."""
    traced, inits = [], []

    def init(position, rng_key=None):
        inits.append(1)
        return NUTS.init(position, rng_key)

    def step(rng_key, state):
        traced.append(1)
        return NUTS.step(rng_key, state)

    kernel = cr.Kernel(init=init, step=step)
    first = cr.run(kernel, jax.random.key(4), X0, 30, mesh=cr.chain_mesh(2), progress=False,
                   warn=False, keep=lambda state, info: state.position[:2])  # fmt: skip
    assert len(traced) == 1 and len(inits) == 1 and first.attrs["batch_size"] == 1
    again = cr.run(kernel, jax.random.key(4), X0, 30, mesh=cr.chain_mesh(2), progress=False,
                   warn=False, keep=lambda state, info: state.position[:2])  # fmt: skip
    assert len(traced) == 2 and len(inits) == 2
    np.testing.assert_array_equal(first.draws, again.draws)
    plain = cr.run(NUTS, jax.random.key(4), X0, 30, mesh=cr.chain_mesh(2), progress=False,
                   warn=False)  # fmt: skip
    np.testing.assert_array_equal(first.draws, plain.draws[..., :2])


_SAME_CALL = textwrap.dedent(
    """
    import sys
    import jax
    jax.config.update("jax_num_cpu_devices", 2)
    import blackjax, jax.numpy as jnp, numpy as np
    import chainrunner as cr
    from chainrunner.programs import _choose

    # Rates that make this short run "long" and its step matrix work: the rule picks a vmap
    _choose.FLOPS_PER_S, _choose.MATRIX_FLOPS = 1e5, 1e3
    rng = np.random.default_rng(0)
    A = rng.normal(size=(50, 50)).astype(np.float32)
    P = jnp.asarray(A @ A.T / 50 + np.eye(50, dtype=np.float32))  # a correlated Gaussian

    def logdensity(x):
        return -0.5 * x @ P @ x

    nuts = blackjax.nuts(logdensity, 0.05, jnp.ones(50))
    x0 = jnp.asarray(rng.normal(size=(40, 50)), jnp.float32)
    trace = cr.run(nuts, jax.random.key(0), x0, 150, progress=False, warn=False)
    np.save(sys.argv[1], trace.draws)
    if len(sys.argv) > 2:  # batch_size=1's draws, to show that the width matters here
        one = cr.run(nuts, jax.random.key(0), x0, 150, batch_size=1, progress=False, warn=False)
        np.save(sys.argv[2], one.draws)
    print(trace.attrs["batch_size"], "|", trace.attrs["batch_size_choice"])
    """
)


@pytest.mark.slow
def test_the_same_call_in_two_processes_gives_the_same_draws(tmp_path):
    """Two fresh processes, the second while another program takes a core: the same
    batch size, and bitwise the same draws, on a model whose draws depend on the width."""
    script = tmp_path / "same_call.py"
    script.write_text(_SAME_CALL)
    env = {k: v for k, v in os.environ.items() if k != "JAX_NUM_CPU_DEVICES"}
    outs, draws = [], []
    for i in range(2):
        hog = None
        if i == 1:  # a busy core, as another program would take it
            hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            args = [str(tmp_path / f"{i}.npy"), *([str(tmp_path / "one.npy")] if i == 0 else [])]
            done = subprocess.run([sys.executable, str(script), *args], capture_output=True,
                                  text=True, env=env, timeout=300)  # fmt: skip
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
        assert done.returncode == 0, done.stderr[-2000:]
        outs.append(done.stdout.strip().splitlines()[-1])
        draws.append(np.load(tmp_path / f"{i}.npy"))
    assert len(set(outs)) == 1, outs
    assert outs[0].startswith("8 | auto: 8, vmaps of 8 chains"), outs[0]
    for other in draws[1:]:
        assert np.array_equal(draws[0], other)
    # the draws do depend on the width here: batch_size=1 gives others (float rounding)
    one = np.load(tmp_path / "one.npy")
    assert not np.array_equal(draws[0], one) and np.allclose(draws[0][:, :5], one[:, :5], atol=1e-3)


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
    assert _choose.choose(Plan(), Start(), Mesh()) == (3, "given")
