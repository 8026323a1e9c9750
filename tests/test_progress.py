"""The progress bar says what the run is doing, from its first call to its end (issues
34 and 35): compiling, warmup of any kind moving it from its start, sampling, diagnostics;
an interrupted run clears its bar (the notice says how far it got)."""

import blackjax
import jax
import jax.numpy as jnp
import pytest
from interrupting import Recorder

import chainrunner as cr
from chainrunner.pipeline import _run


def logdensity(x):
    return -0.5 * jnp.sum(x**2)


@pytest.fixture
def bars(monkeypatch):
    made = []

    def make(*args):
        made.append(Recorder(*args))
        return made[-1]

    monkeypatch.setattr(_run, "progress_bar", make)
    return made


def test_the_bar_shows_compiling_warmup_sampling_then_diagnostics(bars):
    nuts = cr.from_blackjax(blackjax.nuts, logdensity_fn=logdensity, adaptation="window")
    cr.run(nuts, jax.random.key(0), jnp.zeros((4, 2)), 100, num_warmup=100, chunk_size=50)
    (bar,) = bars
    names = [name for name, _ in bar.shown]
    assert names[0] == "compiling" and names[-1] == "diagnostics"
    assert names.index("warmup") < names.index("sampling")
    assert bar.n == bar.total == 200 and bar.closed and bar.leave


def test_a_cross_chain_warmup_moves_the_bar_from_its_start(bars):
    chees = cr.from_blackjax(blackjax.dynamic_hmc, logdensity_fn=logdensity, adaptation="chees")
    cr.run(chees, jax.random.key(0), jnp.zeros((4, 2)), 100, num_warmup=50, warn=False)
    (bar,) = bars
    shown = dict(bar.shown)
    assert bar.shown[0] == ("compiling", 0)
    assert shown["warmup (across chains)"] == 0  # shown before it runs, from the start
    assert shown["sampling"] == 50  # moved past it when it was done
    assert bar.n == bar.total == 150


def test_an_interrupted_run_clears_its_bar(bars, monkeypatch):
    from chainrunner.pipeline import _loop

    real = _loop.run_chunks

    def interrupted(*args, **kwargs):
        real(*args, **kwargs)
        return _loop.LoopResult(0.0, True)

    monkeypatch.setattr(_run._loop, "run_chunks", interrupted)
    nuts = blackjax.nuts(logdensity, 0.5, jnp.ones(2))
    with pytest.warns(cr.ChainrunnerWarning, match="interrupted"):
        cr.run(nuts, jax.random.key(0), jnp.zeros((2, 2)), 20)
    assert bars[0].leave is False


def test_a_terminal_sees_compiling(capsys):
    nuts = blackjax.nuts(logdensity, 0.5, jnp.ones(2))
    cr.run(nuts, jax.random.key(0), jnp.zeros((2, 2)), 10, progress=True, warn=False)
    assert "compiling" in capsys.readouterr().err


BAR_RUN = """
import blackjax, jax, jax.numpy as jnp
import chainrunner as cr
nuts = cr.from_blackjax(blackjax.nuts, logdensity_fn=lambda x: -0.5 * jnp.sum(x**2),
                        adaptation="window")
trace = cr.run(nuts, jax.random.key(0), jnp.zeros((2, 100)), 400, num_warmup=400,
               chunk_size=100, warn=False)
print("TIMES", trace.attrs["compile_time"], trace.attrs["sampling_time"])
"""


def on_a_terminal(script, env):
    """``script``'s output on a pseudo-terminal (120 columns), as a user's terminal sees it."""
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import sys
    import termios

    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=child, stdout=child,
                            stderr=child, env=env, close_fds=True)  # fmt: skip
    os.close(child)
    out = b""
    while True:
        try:
            data = os.read(main, 4096)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        out += data
    proc.wait(timeout=600)
    os.close(main)
    return out.decode(errors="replace")


def test_a_terminal_bar_runs_its_clock_while_compiling_and_rates_the_steps_only(tmp_path):
    """On a pseudo-terminal: the bar redraws while compiling (its elapsed time runs),
    says warmup, says which chunk runs, and its first rate after the compile counts the
    steps' time only, warmup chunks included."""
    import os
    import re

    env = {**os.environ, "CHAINRUNNER_CACHE_DIR": str(tmp_path), "JAX_NUM_CPU_DEVICES": "2"}
    env.pop("TQDM_DISABLE", None)
    out = on_a_terminal(BAR_RUN, env)
    compile_time, sampling_time = map(float, re.search(r"TIMES (\S+) (\S+)", out).groups())
    frames = re.split(r"[\r\n]", out)
    compiling = [f for f in frames if f.startswith("compiling")]
    assert len(compiling) >= 2, out[-3000:]  # redrawn with no update
    if compile_time > 1.5:
        assert len({re.search(r"\[(\d\d:\d\d)", f).group(1) for f in compiling}) >= 2, out
    assert any(f.startswith("warmup") for f in frames), out[-3000:]
    # Between two moves the bar says which chunk runs, of how many (100 draws each).
    assert any(re.search(r"0/800.*chunk=1/8", f) for f in frames), out[-3000:]
    assert any(re.search(r"400/800.*chunk=5/8", f) for f in frames), out[-3000:]
    moved = [f for f in frames if re.match(r"(warmup|sampling):\s+\d+%.*\d+/800", f)
             and not re.search(r"\b(0|800)/800", f)]  # fmt: skip
    # The rates count from the loop's first step, not the compile (far too low), and
    # from warmup chunks finished, not dispatched (far too high: warmup draws that are
    # not kept are never copied, yet the bar waits for their chunk).
    mean = 800 / sampling_time
    for frame in moved:
        rate = float(re.search(r"([\d.]+)step/s", frame).group(1))
        assert 0.2 < rate / mean < 4, (frame, compile_time, sampling_time)
