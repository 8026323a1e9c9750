"""The progress bar says what the run is doing, from its first call to its end (issues
34 and 35): compiling, warmup of any kind moving it from its start, sampling, diagnostics;
an interrupted run clears its bar (the notice says how far it got)."""

import blackjax
import jax
import jax.numpy as jnp
import pytest

import chainrunner as cr
from chainrunner.pipeline import _run


def logdensity(x):
    return -0.5 * jnp.sum(x**2)


class Recorder:
    """A tqdm stand-in that records what the run shows, in order."""

    def __init__(self, progress, total, desc):
        self.total, self.n, self.leave = total, 0, True
        self.shown = [(desc, 0)]

    def set_description(self, desc, refresh=True):
        self.shown.append((desc, self.n))

    def update(self, n=1):
        self.n += n

    def reset(self, total=None):
        self.total, self.n = total, 0

    def set_postfix(self, *a, **k):
        pass

    def refresh(self):
        pass

    def close(self):
        self.closed = True


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
