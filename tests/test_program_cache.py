"""A compiled program is served only to the computation it was compiled for (issue 53).

Programs are found by what they compute (``programs/_compile.py``: the lowered program's
text with its constants, its trees, devices and versions): whatever a model reads while
it is traced is in the key. A new kernel object of the same computation (a notebook cell
run again) and a second process compile nothing; anything else compiles anew.
``programs/_store.py`` keeps compiled programs on disk between processes.
"""

import functools
import importlib
import json
import os
import shutil
import subprocess
import sys

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import NUTS

import chainrunner as cr
from chainrunner.programs import _compile, _store

KW1 = {"progress": False, "warn": False}
X0 = jnp.zeros((2, 3))


def _scaled(scale):
    return lambda x: -0.5 * jnp.sum((x / scale) ** 2)


def _mean_and_compiles(logdensity, **kw):
    """A new blackjax kernel of ``logdensity`` (a notebook cell run again): its posterior
    mean and how many programs XLA compiled for it."""
    before = sum(_compile.compile_counts.values())
    nuts = blackjax.nuts(logdensity, 0.5, jnp.ones(3))
    trace = cr.run(nuts, jax.random.key(0), X0, 100, **{**KW1, **kw})
    return float(np.mean(trace.draws)), sum(_compile.compile_counts.values()) - before


def _reads_environment(x):
    return -0.5 * jnp.sum((x - float(os.environ["CR_TEST_MU"])) ** 2)


def test_a_value_read_from_the_environment_at_trace_time(monkeypatch):
    monkeypatch.setenv("CR_TEST_MU", "0")
    zero, _ = _mean_and_compiles(_reads_environment)
    monkeypatch.setenv("CR_TEST_MU", "10")
    ten, again = _mean_and_compiles(_reads_environment)
    assert abs(zero) < 2 and abs(ten - 10) < 2 and again >= 1
    monkeypatch.setenv("CR_TEST_MU", "0")
    back, none = _mean_and_compiles(_reads_environment)
    assert back == zero and none == 0  # the first program, found by what it computes


def test_a_value_read_from_a_file_at_trace_time(tmp_path):
    config = tmp_path / "mu.json"

    def logdensity(x):
        with open(config) as f:
            mu = json.load(f)["mu"]
        return -0.5 * jnp.sum((x - mu) ** 2)

    config.write_text('{"mu": 0.0}')
    zero, _ = _mean_and_compiles(logdensity)
    config.write_text('{"mu": -4.0}')
    four, compiled = _mean_and_compiles(logdensity)
    assert abs(zero) < 2 and abs(four + 4) < 2 and compiled >= 1


def test_a_random_draw_at_trace_time_is_a_new_program_each_time():
    def logdensity(x):
        mu = np.random.default_rng().normal(0.0, 5.0, 3)  # a new constant at each trace
        mu = mu.astype(np.float32)  # (float32 even where another test left x64 on)
        return -0.5 * jnp.sum((x - mu) ** 2)

    # (Each trace draws anew, so init and step may disagree and the chains not move: the
    # means say nothing here. What matters: no program is served again.)
    _, first = _mean_and_compiles(logdensity)
    _, second = _mean_and_compiles(logdensity)
    assert first >= 1 and second >= 1


def test_a_constant_passed_as_an_argument_is_in_the_lowered_key():
    """JAX 0.12 lowers a constant over 1 KiB to an argument of the executable, so two
    programs that differ only in its values have the same text: each gets its own."""
    c = np.zeros(3000, np.float32)

    def program():  # a new jit each time: found by its key only
        return jax.jit(lambda x: x + jnp.asarray(c)[1500:1503])

    x = jnp.zeros(3)
    np.testing.assert_array_equal(_compile.compiled("test", program(), (x,))[0](x), 0.0)
    c[1500:1503] = 5.0  # in place, after its program was kept
    np.testing.assert_array_equal(_compile.compiled("test", program(), (x,))[0](x), 5.0)
    c = np.zeros(3000, np.float32)  # a new array of the first values: not the kept
    np.testing.assert_array_equal(_compile.compiled("test", program(), (x,))[0](x), 0.0)


def test_a_global_of_the_users_own_module(tmp_path, monkeypatch):
    (tmp_path / "cr_usercfg.py").write_text("MU = 0.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    usercfg = importlib.import_module("cr_usercfg")
    logdensity = lambda x: -0.5 * jnp.sum((x - usercfg.MU) ** 2)  # noqa: E731
    zero, _ = _mean_and_compiles(logdensity)
    monkeypatch.setattr(usercfg, "MU", 7.0)  # (another test's programs hold 0 and 10)
    seven, compiled = _mean_and_compiles(logdensity)
    assert abs(zero) < 2 and abs(seven - 7) < 2 and compiled >= 1


def test_a_large_constant_changed_in_its_middle_at_any_depth():
    """A jaxpr's text does not show its constants' values (numpy prints a long array with
    an ellipsis): the in-process key reads them, nested jaxprs' included."""
    c = np.zeros(3000, np.float32)

    def flat(x):
        return -0.5 * jnp.sum((x - jnp.asarray(c)[1500:1503]) ** 2)

    def nested(x):
        mu = jax.lax.cond(x[0] < 1e9, lambda: jnp.asarray(c)[1500:1503], lambda: jnp.zeros(3))
        return -0.5 * jnp.sum((x - mu) ** 2)

    for logdensity in (flat, nested):
        c[:] = 0.0
        zero, _ = _mean_and_compiles(logdensity)
        c[1500:1503] = 5.0  # changed in place, in the middle
        five, compiled = _mean_and_compiles(logdensity)
        assert abs(zero) < 2 and abs(five - 5) < 2 and compiled >= 1


def test_the_jaxpr_digest_sees_values_and_refuses_what_it_cannot_see():
    from chainrunner.programs import _jaxpr

    def digest(f, *args):
        return _jaxpr.digest(jax.jit(f).trace(*args).jaxpr)

    x = jnp.ones(3)
    key = jax.random.key(1)
    assert digest(lambda x: x + 1.0, x) == digest(lambda x: x + 1.0, x)
    assert digest(lambda x: x + 1.0, x) != digest(lambda x: x + 1.0000001, x)
    assert digest(jax.nn.relu, x) is not None  # (its custom_jvp rule: not in the program)
    in_scan = [  # a constant of a loop's body
        digest(lambda x, v=v: jax.lax.scan(lambda c, _: (c + v, None), x, length=2)[0], x)
        for v in (np.arange(3.0, dtype=np.float32), np.arange(3.0, dtype=np.float32) + 1)
    ]
    assert in_scan[0] != in_scan[1]
    keys = [
        digest(lambda x, k=k: x + jax.random.normal(k, (3,)), x) for k in (key, jax.random.key(2))
    ]
    assert keys[0] is not None and keys[0] != keys[1]  # a key closed over: its bits
    assert digest(lambda x: jax.pure_callback(lambda a: a, jax.ShapeDtypeStruct((3,),
                  jnp.float32), x), x) is None  # fmt: skip


def test_another_mesh_or_devices_is_another_program():
    _, _ = _mean_and_compiles(_scaled(1.5), mesh=cr.chain_mesh(2))
    _, same = _mean_and_compiles(_scaled(1.5), mesh=cr.chain_mesh(2))
    _, one = _mean_and_compiles(_scaled(1.5), mesh=cr.chain_mesh(1))
    _, other = _mean_and_compiles(_scaled(1.5), mesh=cr.chain_mesh(devices=jax.devices()[2:4]))
    assert same == 0 and one >= 1 and other >= 1


_SHIFT = [0.0]


def test_a_global_changed_between_two_calls_of_the_same_kernel_object():
    """One call's trace of the step (shared by the rule, the draw's shape and the chunk
    program) is never replayed in the next call: the same ``blackjax.nuts`` object whose
    log density reads a global that changed samples the new target."""

    def logdensity(x):
        return -0.5 * jnp.sum((x - _SHIFT[0]) ** 2)

    nuts = blackjax.nuts(logdensity, 0.5, jnp.ones(3))
    means = []
    for shift in (0.0, 10.0):
        _SHIFT[0] = shift
        trace = cr.run(nuts, jax.random.key(0), jnp.zeros((4, 3)), 300, mesh=cr.chain_mesh(2),
                       progress=False, warn=False)  # fmt: skip
        means.append(float(np.mean(trace.draws)))
    assert abs(means[0]) < 1 and abs(means[1] - 10) < 1, means


def test_compile_options_are_part_of_the_key():
    """The same computation compiled with other XLA options (``_choose.compile_options``)
    is another program, found again by the same options (in the cache folder too)."""
    f = jax.jit(lambda x: jnp.cumsum(jnp.sin(x) * 1.25))
    x = jax.device_put(jnp.arange(5.0))
    version = tuple(int(p) for p in jax.__version__.split(".")[:2])
    name = "xla_cpu_use_fusion_emitters" if version < (0, 11) else "xla_backend_optimization_level"
    cheap = ((name, False if version < (0, 11) else 1),)
    before = _compile.compile_counts["options"]
    plain, _ = _compile.compiled("options", f, (x,))
    again, _ = _compile.compiled("options", f, (x,))
    other, _ = _compile.compiled("options", f, (x,), options=cheap)
    assert _compile.compile_counts["options"] - before == 2 and again is plain
    assert other is not plain and other is _compile.compiled("options", f, (x,), options=cheap)[0]
    np.testing.assert_allclose(np.asarray(other(x)), np.asarray(plain(x)), rtol=1e-6)


def test_programs_that_call_python_are_never_shared():
    """A callback is named in the program's text by a number only: two programs with
    other callbacks can have the same text. Such programs compile every time."""

    def with_callback(shift):
        def logdensity(x):
            mu = jax.pure_callback(lambda: np.full(3, shift, np.float32),
                                   jax.ShapeDtypeStruct((3,), jnp.float32))  # fmt: skip
            return -0.5 * jnp.sum((x - mu) ** 2)

        return logdensity

    zero, _ = _mean_and_compiles(with_callback(0.0))
    ten, compiled = _mean_and_compiles(with_callback(10.0))
    assert abs(zero) < 2 and abs(ten - 10) < 2 and compiled >= 1


def test_chain_map_finds_its_program_for_a_new_function_object():
    x = jnp.arange(12.0).reshape(4, 3)
    cr.chain_map(lambda v: jnp.sum(v**2))(x)
    before = dict(_compile.compile_counts)
    out = cr.chain_map(lambda v: jnp.sum(v**2))(x)  # a re-run cell: a new lambda
    assert _compile.compile_counts == before
    np.testing.assert_allclose(out, jnp.sum(x**2, axis=1))
    other = cr.chain_map(lambda v: jnp.sum(v**3))(x)  # another body: another program
    assert _compile.compile_counts["chain_map"] == before["chain_map"] + 1
    np.testing.assert_allclose(other, jnp.sum(x**3, axis=1))


def _with_constant(x):
    return -0.5 * jnp.sum(x**2) + jnp.asarray(np.float64(0.1))  # float64 under x64


def test_x64_switched_on_in_the_same_process_is_another_program():
    make = lambda: blackjax.nuts(_with_constant, 0.5, np.ones(3, np.float32))  # noqa: E731
    pos = np.zeros((2, 3), np.float32)
    kw = {"progress": False, "warn": False}
    off = cr.run(make(), jax.random.key(0), pos, 10, **kw)
    with jax.enable_x64(True):
        on = cr.run(make(), jax.random.key(0), pos, 10, **kw)
    assert off.stats["lp"].dtype == np.float32 and on.stats["lp"].dtype == np.float64


def test_a_bad_size_bound_is_warned_about(monkeypatch):
    monkeypatch.setenv("CHAINRUNNER_CACHE_MAX_BYTES", "2G")
    with pytest.warns(RuntimeWarning, match="CHAINRUNNER_CACHE_MAX_BYTES='2G'"):
        assert _store.max_bytes() == _store.DEFAULT_MAX_BYTES


# ---------------------------------------------------------------- one process


def eight_schools(J, sigma, y=None):
    mu = numpyro.sample("mu", dist.Normal(0, 5))
    tau = numpyro.sample("tau", dist.HalfCauchy(5))
    with numpyro.plate("J", J):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.sample("obs", dist.Normal(theta, sigma), obs=y)


DATA = (8, np.array([15.0, 10, 16, 11, 9, 11, 10, 18]))
Y = {"y": np.array([28.0, 8, -3, 7, -1, 1, 18, 12])}
KW = {"num_warmup": 50, "num_chains": 2, "progress": False, "warn": False}


def test_a_new_kernel_object_of_the_same_model_compiles_nothing():
    """A notebook cell run again: cr.from_numpyro(NUTS(model), ...) written in it."""
    first = cr.run(cr.from_numpyro(NUTS(eight_schools), model_args=DATA, model_kwargs=Y),
                   jax.random.key(0), None, 50, **KW)  # fmt: skip
    before, lowered = dict(_compile.compile_counts), dict(_compile.lower_counts)
    again = cr.run(cr.from_numpyro(NUTS(eight_schools), model_args=DATA, model_kwargs=Y),
                   jax.random.key(0), None, 50, **KW)  # fmt: skip
    assert _compile.compile_counts == before
    assert _compile.lower_counts == lowered  # the same jaxprs: not even lowered again
    assert np.array_equal(first.draws["mu"], again.draws["mu"])
    # blackjax: a new algorithm object from the same log density and parameters
    _, _ = _mean_and_compiles(_scaled(1.0))
    _, compiled = _mean_and_compiles(_scaled(1.0))
    assert compiled == 0


def test_another_setting_or_closure_constant_never_reuses_a_program():
    run = functools.partial(cr.run, rng_key=jax.random.key(0), initial_position=jnp.zeros((2, 3)),
                            num_samples=20, progress=False, warn=False)  # fmt: skip
    one = run(blackjax.nuts(_scaled(1.0), 0.5, jnp.ones(3)))
    before = dict(_compile.compile_counts)
    other = run(blackjax.nuts(_scaled(5.0), 0.5, jnp.ones(3)))
    assert _compile.compile_counts["chunk"] == before["chunk"] + 1
    assert not np.array_equal(one.draws, other.draws)
    before = dict(_compile.compile_counts)
    cr.run(cr.from_numpyro(NUTS(eight_schools, target_accept_prob=0.9), model_args=DATA,
                           model_kwargs=Y), jax.random.key(0), None, 50, **KW)  # fmt: skip
    assert _compile.compile_counts["chunk"] == before["chunk"] + 1


# ---------------------------------------------------------------- several processes

SCRIPT = r"""
import json, os, sys
import jax
jax.config.update("jax_num_cpu_devices", 2)
hits = []
jax.monitoring.register_event_listener(
    lambda event, **kw: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None
)
import jax.numpy as jnp, numpy as np, numpyro, numpyro.distributions as dist
from numpyro.infer import NUTS
import chainrunner as cr
from chainrunner.programs import _compile

scale = float(sys.argv[1])

def model(n):
    with numpyro.plate("n", n):
        numpyro.sample("x", dist.Normal(float(os.environ.get("CR_TEST_MU", "0")), scale))

checkpoint = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] != "-" else None
how = sys.argv[3] if len(sys.argv) > 3 else None
if how == "usermodule":  # a class of the user's own module (PYTHONPATH), edited between runs
    import blackjax
    from usermod import Target

    kernel = blackjax.nuts(lambda x: Target.logp(x), 0.5, jnp.ones(3))
    start = jnp.zeros((2, 3))
elif how == "window":  # a dense mass matrix: cholesky
    kernel = cr.from_numpyro(NUTS(model), model_args=(3,), adaptation="window",
                             is_mass_matrix_diagonal=False)
    start = None
else:
    options = {"adaptation": how} if how else {}
    kernel, start = cr.from_numpyro(NUTS(model), model_args=(3,), **options), None
trace = cr.run(kernel, jax.random.key(0), start, 100, num_warmup=100, num_chains=2,
               progress=False, warn=False, checkpoint=checkpoint)
draws = trace.draws["x"] if isinstance(trace.draws, dict) else trace.draws
print(json.dumps({"compiled": sum(_compile.compile_counts.values()),
                  "loaded": sum(_compile.load_counts.values()), "x": draws[:, -5:].tolist(),
                  "lowered": sum(_compile.lower_counts.values()),
                  "compile_time": trace.attrs["compile_time"], "jax_cache_hits": len(hits)}))
"""


def _process(folder, *args, off=False, path=None, env=None):
    env = {**os.environ, "CHAINRUNNER_CACHE_DIR": str(folder), "JAX_PLATFORMS": "cpu",
           **(env or {})}  # fmt: skip
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    if off:
        env["CHAINRUNNER_CACHE"] = "off"
    done = subprocess.run([sys.executable, "-c", SCRIPT, *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_the_programs(tmp_path):
    """Same script, second process: nothing compiled, the same draws; a damaged file is
    compiled anew; a checkpoint written with a compiled program resumes with a loaded one."""
    folder = tmp_path / "cache"
    first = _process(folder, 1.0, tmp_path / "ckpt")
    assert first["compiled"] >= 2 and first["loaded"] == 0
    files = sorted((folder / "programs").glob("*.bin"))
    assert len(files) >= 2
    second = _process(folder, 1.0, tmp_path / "ckpt")  # the same run, from the checkpoint
    assert second["compiled"] == 0 and second["loaded"] >= 2
    assert second["x"] == first["x"]
    assert second["compile_time"] < first["compile_time"]
    for f in files:  # damaged (truncated) files: dropped, compiled anew, same draws
        f.write_bytes(f.read_bytes()[:1000])
    again = _process(folder, 1.0)
    assert again["compiled"] >= 1 and again["x"] == first["x"]
    off = _process(tmp_path / "unused", 1.0, off=True)  # CHAINRUNNER_CACHE=off: no folder
    assert off["x"] == first["x"] and not (tmp_path / "unused").exists()


def test_the_environment_of_another_process_is_another_program(tmp_path):
    """The issue's case: a model reading its location from the environment, MU=0 and then
    MU=10 in two processes sharing the cache folder: the second never gets the first's
    program."""
    folder = tmp_path / "cache"
    zero = _process(folder, 1.0, env={"CR_TEST_MU": "0"})
    ten = _process(folder, 1.0, env={"CR_TEST_MU": "10"})
    assert ten["compiled"] >= 1
    assert abs(np.mean(zero["x"])) < 2 and abs(np.mean(ten["x"]) - 10) < 2


def test_a_program_served_by_jaxs_cache_is_not_stored_again(tmp_path):
    """An executable that JAX's persistent cache loaded, serialized again, failed in the
    next process (``Function wrapped_iota not found``): such a compile is left to JAX's
    cache, and every later process runs."""
    folder = tmp_path / "cache"
    first = _process(folder, 1.0)
    shutil.rmtree(folder / "programs")  # (evicted, say): JAX's cache serves the compile
    second = _process(folder, 1.0)
    assert second["jax_cache_hits"] >= 1 and not any((folder / "programs").glob("*.bin"))
    third = _process(folder, 1.0)
    assert first["x"] == second["x"] == third["x"]


@pytest.mark.parametrize("adaptation", ["fisher_low_rank", "window"])
def test_programs_with_lapack_kernels_load_in_a_new_process(tmp_path, adaptation):
    """A program calling LAPACK (the low-rank Fisher adaptation's eigh and qr; the dense
    window's cholesky and triangular solves) crashed a new process when it was loaded
    before its kernels were set up. A second process finds the programs by their traces,
    lowers nothing (the store lowers a small LAPACK program first, which sets them up),
    compiles nothing and draws the same numbers."""
    folder = tmp_path / "cache"
    first = _process(folder, 1.0, "-", adaptation)
    second = _process(folder, 1.0, "-", adaptation)
    assert second["x"] == first["x"]
    assert second["compiled"] == 0 and second["loaded"] >= 2 and second["lowered"] == 0


def test_an_edited_module_of_the_users_code_is_another_program(tmp_path):
    """A class in the user's own module, edited between two processes: the second never
    loads the first's program."""
    folder, code = tmp_path / "cache", tmp_path / "code"
    code.mkdir()
    text = "import jax.numpy as jnp\n\nclass Target:\n    @staticmethod\n    def logp(x):\n"
    (code / "usermod.py").write_text(text + "        return -0.5 * jnp.sum((x - 0.0) ** 2)\n")
    first = _process(folder, 1.0, "-", "usermodule", path=code)
    (code / "usermod.py").write_text(text + "        return -0.5 * jnp.sum((x - 10.0) ** 2)\n")
    second = _process(folder, 1.0, "-", "usermodule", path=code)
    assert second["compiled"] >= 1
    assert np.mean(second["x"]) > np.mean(first["x"]) + 5


def test_jax_settings_are_restored_after_a_run():
    nuts = blackjax.nuts(_scaled(2.0), 0.5, jnp.ones(3))
    before = jax.config.jax_compilation_cache_dir
    cr.run(nuts, jax.random.key(0), jnp.zeros((2, 3)), 10, progress=False, warn=False)
    assert jax.config.jax_compilation_cache_dir == before is None


def test_the_folder_stays_within_its_size_bound(tmp_path):
    where = tmp_path / "programs"
    where.mkdir()
    for i in range(10):
        (where / f"{i}.bin").write_bytes(b"x" * 1000)
        os.utime(where / f"{i}.bin", (i, i))
    _store.prune(str(where), 5000)
    left = sorted(p.name for p in where.glob("*.bin"))
    assert left == ["6.bin", "7.bin", "8.bin", "9.bin"]  # the most recently used


def test_set_cache_arguments(tmp_path):
    try:
        assert cr.set_cache(tmp_path / "c") == str(tmp_path / "c" / "programs")
        assert cr.set_cache(False) is None and _store.folder() is None
        with pytest.raises(TypeError, match="max_bytes must be an int"):
            cr.set_cache(True, max_bytes=1.5)
        with pytest.raises(ValueError, match="max_bytes must be >= 0"):
            cr.set_cache(True, max_bytes=-1)
        (tmp_path / "f").write_text("")
        with pytest.raises(ValueError, match="is a file"):
            cr.set_cache(tmp_path / "f")
    finally:
        cr.set_cache(True)
    assert _store.folder() == os.path.join(os.environ["CHAINRUNNER_CACHE_DIR"], "programs")
