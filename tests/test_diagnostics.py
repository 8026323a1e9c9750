"""Diagnostics: each check fires on a run built to trigger it and stays quiet on a healthy one.

Compile time matters here: one parametrised HMC kernel (step size and the target's mode
separation are ``params``, so every setting reuses one compiled program) covers the
healthy, divergent, low-ESS and bimodal runs; a random walk with a huge step and an
unadjusted Langevin kernel cover the stuck and non-finite cases.
"""

import re
import warnings

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from blackjax.mcmc import hmc

import chainrunner as cr
from chainrunner.core._kernel import default_extract
from chainrunner.output import _diagnostics
from chainrunner.output._diagnostics import (
    ChainrunnerWarning,
    Diagnostics,
    diagnose,
    warn_if_needed,
)

KEY = jax.random.key(0)
CHAINS = 8


def mixture(x, separation):
    """Equal mixture of N(-separation, 1) and N(separation, 1); N(0, 1) at separation 0."""
    a = -0.5 * jnp.sum((x - separation) ** 2)
    b = -0.5 * jnp.sum((x + separation) ** 2)
    return jnp.logaddexp(a, b)


_hmc_step = hmc.build_kernel()

# params = (step_size, separation): new values reuse the compiled program.
HMC = cr.Kernel(
    init=lambda position, rng_key, p: hmc.init(position, lambda x: mixture(x, p[1])),
    step=lambda rng_key, state, p: _hmc_step(
        rng_key, state, lambda x: mixture(x, p[1]), p[0], jnp.ones(1), 4
    ),
    extract=lambda state, info, p: default_extract(state, info),
    logdensity=lambda state, p: state.logdensity,
    params=(jnp.float32(0.4), jnp.float32(0.0)),  # 4 x 0.4 ~ pi/2: near-iid draws
)


def with_params(step_size, separation=0.0):
    return HMC._replace(params=(jnp.float32(step_size), jnp.float32(separation)))


def spread(num_chains=CHAINS, scale=1.0):
    return jnp.asarray(np.linspace(-scale, scale, num_chains)[:, None], jnp.float32)


def run(kernel, position, num_samples, **options):
    """``cr.run``, returning the trace and the ChainrunnerWarnings it issued."""
    options = {"progress": False, "chunk_size": 50, **options}  # one chunk program for all
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace = cr.run(kernel, KEY, position, num_samples, **options)
    ours = [w for w in caught if issubclass(w.category, ChainrunnerWarning)]
    return trace, [str(w.message) for w in ours]


def check_reported(trace, warned, *fragments):
    """Exactly one warning, which is the report, and it names every fragment."""
    d = trace.diagnostics
    assert isinstance(d, Diagnostics)
    assert not d.ok
    assert warned == [str(d)], warned
    for fragment in fragments:
        assert any(fragment in m for m in d.messages), (fragment, d.messages)


def test_healthy_run_is_quiet():
    trace, warned = run(HMC, spread(), 400)
    d = trace.diagnostics
    assert warned == [], warned
    assert d.ok and d.messages == [], d.messages
    assert trace.diagnostics is d  # cached
    assert set(d.rhat) == set(d.ess_bulk) == set(d.ess_tail) == {"x"}
    assert d.rhat["x"] < 1.01
    assert d.ess_threshold == 100 * CHAINS
    assert min(d.ess_bulk["x"], d.ess_tail["x"]) > d.ess_threshold
    np.testing.assert_array_equal(d.divergences, np.zeros(CHAINS))
    assert d.stuck_chains == [] and d.nonfinite == {}
    assert "no problems found" in str(d)


def test_divergences_are_counted_per_chain():
    trace, warned = run(with_params(3.0), spread(), 100, warn=True)
    check_reported(trace, warned, "divergent transition")
    d = trace.diagnostics
    np.testing.assert_array_equal(d.divergences, trace.stats["diverging"].sum(axis=1))
    assert d.divergences.sum() > 0
    # warn=False: the same run, no warning (and no recompile).
    quiet, warned = run(with_params(3.0), spread(), 100, warn=False)
    assert warned == []
    np.testing.assert_array_equal(quiet.diagnostics.divergences, d.divergences)


def test_bimodal_target_has_high_rhat():
    # Half the chains start in each mode, five standard deviations from the middle.
    start = jnp.where(jnp.arange(CHAINS)[:, None] % 2 == 0, -5.0, 5.0)
    trace, warned = run(with_params(0.4, separation=5.0), start, 400)
    check_reported(trace, warned, "R-hat > 1.01 for x")
    assert trace.diagnostics.rhat["x"] > 1.5


def test_small_steps_give_low_ess():
    trace, warned = run(with_params(0.02), spread(), 200)
    check_reported(trace, warned, "ESS below 800 (100 per chain) for x")
    d = trace.diagnostics
    assert d.ess_bulk["x"] < d.ess_threshold
    assert d.divergences.sum() == 0 and d.stuck_chains == []


RMH_HUGE = blackjax.rmh(
    lambda x: -0.5 * jnp.sum(x**2), lambda k, x: x + 1e4 * jax.random.normal(k, x.shape)
)


def test_huge_random_walk_steps_are_stuck():
    trace, warned = run(RMH_HUGE, spread(4), 50)
    check_reported(trace, warned, "stuck chain(s) 0, 1, 2, 3")
    assert trace.diagnostics.stuck_chains == [0, 1, 2, 3]


def _ula_step(rng_key, x, step_size):
    """Unadjusted Langevin on N(0, 1), but NaN for x > 2 (its gradient too)."""

    def logdensity(x):
        return jnp.sum(-0.5 * x**2 + 0.0 * jnp.sqrt(2.0 - x))

    grad = jax.grad(logdensity)(x)
    x = x + step_size * grad + jnp.sqrt(2 * step_size) * jax.random.normal(rng_key, x.shape)
    return x, {"acceptance_rate": jnp.float32(1.0)}


ULA = cr.Kernel(
    init=lambda position, rng_key, p: position,
    step=_ula_step,
    extract=lambda state, info, p: (state, info),
    logdensity=None,
    params=jnp.float32(0.05),
)


def test_nan_region_reports_chains_and_first_bad_draw():
    # Chains 0-3 start next to the NaN region and soon step into it; 4-7 start far away.
    start = jnp.concatenate([jnp.full((4, 1), 1.9), jnp.full((4, 1), -3.0)])
    trace, warned = run(ULA, start, 60, warn=True)
    d = trace.diagnostics
    check_reported(trace, warned, "non-finite values in")
    x = trace.draws[..., 0]
    for chain in range(CHAINS):
        bad = np.flatnonzero(~np.isfinite(x[chain]))
        if bad.size:
            assert d.nonfinite[chain] == bad[0]
            assert np.all(~np.isfinite(x[chain, bad[0] :]))  # NaN sticks
        else:
            assert chain not in d.nonfinite
    assert 0 < len(d.nonfinite) < CHAINS, d.nonfinite
    assert f"{next(iter(d.nonfinite))} at draw {next(iter(d.nonfinite.values()))}" in str(d)
    # The finite chains alone enter R-hat and ESS.
    assert d.ess_threshold == 100 * (CHAINS - len(d.nonfinite))


# -- diagnose on hand-made traces (no compilation) ------------------------------------------


def trace_of(draws, stats=None):
    return cr.Trace(draws=draws, stats=stats or {}, final_state=None)


def test_one_chain_skips_rhat():
    d = diagnose(trace_of(np.random.default_rng(0).normal(size=(1, 500, 2))))
    assert d.rhat == {} and d.ess_threshold == 100
    assert d.ess_bulk["x"] > 100 and d.ok


def test_short_runs_skip_rhat_and_ess():
    d = diagnose(trace_of(np.random.default_rng(0).normal(size=(4, 3))))
    assert d.rhat == {} and d.ess_bulk == {} and d.ess_tail == {} and d.ok


def test_integer_bool_and_pytree_draws():
    rng = np.random.default_rng(1)
    draws = {
        "n": rng.poisson(3.0, size=(4, 400)),
        "flag": rng.random((4, 400)) < 0.5,
        "z": {"w": rng.normal(size=(4, 400, 3)).astype(np.float32)},
    }
    d = diagnose(trace_of(draws))
    assert set(d.rhat) == {"n", "flag", "z.w"}
    assert d.ok, d.messages
    assert max(d.rhat.values()) < 1.01


def test_constant_variable_is_not_flagged():
    rng = np.random.default_rng(2)
    draws = {"mu": rng.normal(size=(4, 500)), "c": np.ones((4, 500))}
    d = diagnose(trace_of(draws))
    assert d.ok, d.messages
    assert np.isnan(d.rhat["c"])


def test_nonfinite_and_stuck_by_hand():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(5, 400))
    x[1, 17:] = np.nan
    x[3, 250] = np.inf
    x[4] = 0.25  # never moves
    stats = {"acceptance_rate": np.full((5, 400), 0.8), "lp": -0.5 * x**2}
    stats["acceptance_rate"][2] = 0.001  # moves, but almost never accepts
    d = diagnose(trace_of(x, stats))
    assert d.nonfinite == {1: 17, 3: 250}
    assert d.stuck_chains == [2, 4]
    assert d.divergences is None
    assert not d.ok and len(d.messages) >= 2
    assert d.ess_threshold == 300  # chains 0, 2 and 4


def test_warn_if_needed_warns_once_with_the_report():
    bad = trace_of(np.zeros((3, 20)))
    with pytest.warns(ChainrunnerWarning) as record:
        warn_if_needed(bad)
    assert len(record) == 1
    assert str(record[0].message) == str(diagnose(bad))
    assert "stuck chain(s) 0, 1, 2" in str(record[0].message)
    good = trace_of(np.random.default_rng(0).normal(size=(2, 400)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_needed(good)


def test_thresholds_are_documented_constants():
    assert _diagnostics.RHAT_MAX == 1.01
    assert _diagnostics.ESS_PER_CHAIN == 100
    assert issubclass(ChainrunnerWarning, RuntimeWarning)


# -- non-finite initial positions (on_bad_init) --------------------------------------------

HALF = blackjax.rmh(
    lambda x: jnp.where(x[0] > 0, -0.5 * jnp.sum(x**2), -jnp.inf),
    lambda k, x: x + 0.5 * jax.random.normal(k, x.shape),
)


def test_on_bad_init_raise_names_chains():
    start = jnp.asarray([[1.0], [-1.0], [2.0], [-3.0]])
    with pytest.raises(ValueError, match=r"chain\(s\) \[1, 3\]"):
        cr.run(HALF, KEY, start, 10, progress=False, warn=False)


def test_on_bad_init_warn_names_chains():
    start = jnp.asarray([[1.0], [-1.0], [2.0], [-3.0]])
    with pytest.warns(ChainrunnerWarning, match=r"chain\(s\) \[1, 3\]"):
        trace = cr.run(HALF, KEY, start, 10, progress=False, warn=False, on_bad_init="warn")
    assert trace.draws.shape == (4, 10, 1)


def test_on_bad_init_reinit_restarts_those_chains():
    start = jnp.asarray([[1.0], [-0.1], [2.0], [-0.2]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace = cr.run(HALF, KEY, start, 10, progress=False, warn=False, on_bad_init="reinit")
    said = [str(w.message) for w in caught if "re-initialis" in str(w.message)]
    assert len(said) == 1, said  # one warning for every try, with the counts
    assert re.search(r"re-initialised chain\(s\) \[1, 3\], 4 time\(s\) in all \(3, 1 per", said[0])
    assert trace.attrs["reinitialised_chains"] == [1, 3]
    assert np.all(np.isfinite(trace.stats["lp"]))
    assert np.all(trace.draws > 0)  # the chains only move inside the support
    again = cr.run(HALF, KEY, start, 10, progress=False, warn=False, on_bad_init="reinit")
    np.testing.assert_array_equal(again.draws, trace.draws)  # new starts come from the key


def test_on_bad_init_reinit_never_finite_is_one_error_without_a_warning_per_try():
    """A start outside the support whatever the jitter: the error after the last try,
    which counts them, and no warning for each try before it."""
    start = jnp.asarray([[1.0], [-50.0]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match=r"chain\(s\) \[1\].*after 10 re-init"):
            cr.run(HALF, KEY, start, 10, progress=False, warn=False, on_bad_init="reinit")
    assert not [w for w in caught if "re-initialis" in str(w.message)]


PRELOAD = """
import sys, jax, jax.numpy as jnp, numpy as np, blackjax
import chainrunner as cr
from chainrunner.output import _diagnostics
nuts = blackjax.nuts(lambda x: -0.5 * jnp.sum(x**2), 0.8, jnp.ones(2))
x0 = np.zeros((2, 2), np.float32)
cr.run(nuts, jax.random.key(0), x0, 20, progress=False, warn=False)
assert "arviz" not in sys.modules and not _diagnostics._preload
if sys.argv[1] == "run":  # diagnostics and the monitor need no ArviZ
    trace = cr.run(nuts, jax.random.key(0), x0, 20, progress=False, monitor=True)
    assert trace.diagnostics.rhat
    assert "arviz" not in sys.modules and not _diagnostics._preload
else:  # sample converts to ArviZ data, whatever warn says
    data = cr.sample(nuts, jax.random.key(0), x0, 20, progress=False, warn=False)
    assert data.posterior["x"].shape == (2, 20, 2)
    assert [t.name for t in _diagnostics._preload] == ["chainrunner-import-arviz"]
    assert "arviz" in sys.modules
print("ok")
"""


@pytest.mark.parametrize("call", ["run", "sample"])
def test_arviz_is_imported_in_the_background_only_when_needed(call):
    """``run`` never imports ArviZ (2 s of a first call): its diagnostics are chainrunner's
    vectorised ones; ``sample`` imports it while the programs compile."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", PRELOAD, call], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_rhat_and_ess_are_arvizs():
    """The report's R-hat and bulk/tail ESS equal ArviZ's own (to round-off), per variable:
    the worst element, integer draws as floats, a constant variable undefined (nan)."""
    import arviz as az

    rng = np.random.default_rng(3)
    walk = rng.normal(size=(4, 300, 3)).cumsum(axis=1) * 0.2 + rng.normal(size=(4, 300, 3))
    draws = {"w": walk, "k": rng.integers(0, 5, size=(4, 300)), "c": np.ones((4, 300))}
    d = diagnose(cr.Trace(draws=draws, stats={}, final_state=None))
    as_float = {k: np.asarray(v, float) for k, v in draws.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = {
            "rhat": (az.rhat(as_float, method="rank"), np.nanmax),
            "ess_bulk": (az.ess(as_float, method="bulk"), np.nanmin),
            "ess_tail": (az.ess(as_float, method="tail"), np.nanmin),
        }
    for field, (ds, worst) in expected.items():
        for name in ("w", "k"):
            want = float(worst(np.asarray(ds[name].values, float)))
            np.testing.assert_allclose(getattr(d, field)[name], want, rtol=1e-9)
    assert np.isnan(d.rhat["c"])


def test_an_ess_just_under_the_threshold_never_reads_as_the_threshold():
    from chainrunner.output._diagnostics import _messages

    (message,) = _messages(
        {"R-hat > 1.01": {"x": 1.0}}, {"x": 799.6}, {"x": 900.0}, 800.0, None, [], {}
    )
    assert "ESS below 800 (100 per chain) for x (799)" in message


def test_an_rhat_just_over_its_limit_never_reads_as_the_limit():
    from chainrunner.output._diagnostics import _messages
    from chainrunner.stopping._until import Converged, Status

    (message,) = _messages(
        {"R-hat > 1.01": {"x": 1.0104}}, {"x": 900.0}, {"x": 900.0}, 800.0, None, [], {}
    )
    assert "R-hat > 1.01 for x (1.011)" in message
    status = Status(draws=200, rhat=1.0104, ess_bulk=799.6, ess_tail=900.0, nested_rhat=None,
                    met=False)  # fmt: skip
    assert status.postfix(Converged(rhat=1.01, ess_bulk=800, ess_tail=800)) == {
        "rhat": "1.011/1.01", "ess": "799/800",
    }  # fmt: skip
