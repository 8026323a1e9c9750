"""Compile each program once: new kernel objects of the same model reuse it, and a second
process loads it from the cache folder (issue 34); never a program of another model.

Fingerprints (``core/_fingerprint.py``) say when two objects compute the same thing;
``programs/_store.py`` keeps compiled programs on disk between processes.
"""

import dataclasses
import functools
import importlib
import json
import os
import shutil
import subprocess
import sys
import types

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import NUTS

import chainrunner as cr
from chainrunner.core._fingerprint import FingerprintCache, fingerprint, stable_digest
from chainrunner.programs import _programs, _store

# ---------------------------------------------------------------- fingerprints


def _scaled(scale):
    return lambda x: -0.5 * jnp.sum((x / scale) ** 2)


OFFSET = np.zeros(3)


def _reads_global(x):
    return -0.5 * jnp.sum((x - OFFSET) ** 2)


def test_fingerprint_is_equal_for_what_computes_the_same():
    assert fingerprint(_scaled(2.0)).key == fingerprint(_scaled(2.0)).key
    a = blackjax.nuts(_scaled(1.0), 0.5, jnp.ones(3))
    b = blackjax.nuts(_scaled(1.0), 0.5, jnp.ones(3))
    assert fingerprint(a).key == fingerprint(b).key and fingerprint(a).stable
    same_code = lambda x: -0.5 * jnp.sum(x**2)  # noqa: E731
    also = lambda x: -0.5 * jnp.sum(x**2)  # noqa: E731  (another line: line numbers don't count)
    assert fingerprint(same_code).key == fingerprint(also).key
    assert (
        fingerprint(functools.partial(_scaled, 2.0)).key
        == fingerprint(functools.partial(_scaled, 2.0)).key
    )


def test_fingerprint_differs_for_any_other_computation():
    """Another closure constant, array value, code, default, setting or global value."""
    keys = [
        fingerprint(_scaled(2.0)).key,
        fingerprint(_scaled(3.0)).key,
        fingerprint(_scaled(np.float32(2.0))).key,  # another dtype
        fingerprint(lambda x: -0.5 * jnp.sum(x**3)).key,
        fingerprint(lambda x, s=1.0: x * s).key,
        fingerprint(lambda x, s=2.0: x * s).key,
        fingerprint(blackjax.nuts(_scaled(1.0), 0.5, jnp.ones(3))).key,
        fingerprint(blackjax.nuts(_scaled(1.0), 0.5, jnp.full(3, 2.0))).key,
        fingerprint(blackjax.nuts(_scaled(1.0), 0.4, jnp.ones(3))).key,
        fingerprint(0.0).key,
        fingerprint(-0.0).key,
        fingerprint(True).key,
        fingerprint(1).key,
    ]
    assert len(set(keys)) == len(keys)
    before = fingerprint(_reads_global).key
    global OFFSET
    OFFSET = np.ones(3)
    try:
        assert fingerprint(_reads_global).key != before  # the data it reads changed
    finally:
        OFFSET = np.zeros(3)


def test_unknown_objects_count_by_identity_and_are_not_stable():
    class Holder:
        __slots__ = ("value",)

    thing = Holder()
    found = fingerprint(lambda x: x + 0 * id(thing))
    assert not found.stable and thing in found.keep
    assert stable_digest(lambda x: x) is not None and stable_digest(thing) is None
    cyclic = []
    cyclic.append(cyclic)
    assert fingerprint(cyclic).stable  # a cycle is walked once


class _Target:
    def __init__(self, mu):
        self.mu = mu

    def logdensity(self, x):
        return -0.5 * jnp.sum((x - self.mu) ** 2)


class _Prior:
    mu = 0.0


@dataclasses.dataclass
class _Config:
    mu: float = 0.0


def test_state_that_the_code_reads_is_in_the_fingerprint(tmp_path, monkeypatch):
    """An attribute of an instance, of a class, of a dataclass, of a namespace or of a
    module of the user's code, changed in place, changes the fingerprint (it keeps being
    stable: the same in a new process)."""
    target, config, space = _Target(0.0), _Config(), types.SimpleNamespace(mu=0.0)
    (tmp_path / "usercfg.py").write_text("MU = 0.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    usercfg = importlib.import_module("usercfg")
    sources = {
        "method": lambda: target.logdensity,
        "class": lambda: lambda x: x - _Prior.mu,
        "dataclass": lambda: lambda x: x - config.mu,
        "namespace": lambda: lambda x: x - space.mu,
        "module": lambda: lambda x: x - usercfg.MU,
    }
    before = {name: fingerprint(make()) for name, make in sources.items()}
    assert all(found.stable for found in before.values())
    target.mu, config.mu, space.mu, usercfg.MU = 1.0, 1.0, 1.0, 1.0
    monkeypatch.setattr(_Prior, "mu", 1.0)
    for name, make in sources.items():
        assert fingerprint(make()).key != before[name].key, name


def test_what_goes_by_identity_is_reused_for_that_object_only():
    """An object whose state is not read (``__slots__``) may change unseen: what was
    built for a source holding it is not given to another source, however alike."""

    class Opaque:
        __slots__ = ("mu",)

    thing = Opaque()
    cache = FingerprintCache(4)
    first = lambda x: x - thing.mu  # noqa: E731
    assert cache.get(first, lambda: "built") == "built"
    assert cache.get(first, lambda: "again") == "built"  # the same object
    alike = lambda x: x - thing.mu  # noqa: E731
    assert fingerprint(alike).key == fingerprint(first).key
    assert cache.get(alike, lambda: "for alike") == "for alike"


def test_an_installed_librarys_function_is_named_with_its_version():
    key = fingerprint(jnp.sum).key
    assert key[0] == "global" and key[1:3] == ("jax.numpy", "sum") and "jax" in key[3]
    assert fingerprint(float("nan")).key != fingerprint(-float("nan")).key


def test_a_package_is_pinned_by_the_distributions_that_install_it():
    """The shortcut by the package's own name names what ``packages_distributions`` (which
    reads every distribution's file list) names, for every installed top-level package:
    the keys of stored programs stay."""
    from importlib import metadata

    from chainrunner.core import _fingerprint
    from chainrunner.core._fingerprint import _owners

    _fingerprint._distributions.cache_clear()  # (sys.path may have changed since)
    everything = metadata.packages_distributions()
    assert {"jax", "numpyro", "blackjax"} <= set(everything)
    # (A package twice on sys.path, as setuptools' vendored packaging once it is
    # imported, is named twice there: the version string names it once.)
    differ = {top: (_owners(top), names) for top, names in everything.items()
              if sorted(set(_owners(top))) != sorted(set(names))}  # fmt: skip
    assert not differ


def test_a_same_named_distribution_that_installs_nothing_is_not_taken(monkeypatch):
    """A leftover ``sklearn``-like distribution (same name, no files of the package) does
    not pin the package: the distributions that install it do."""
    from importlib import metadata

    from chainrunner.core import _fingerprint

    class Placeholder:
        files = ()

        @property
        def metadata(self):
            return {"Name": "jax"}

        def read_text(self, name):
            return None

    monkeypatch.setattr(metadata, "distribution", lambda name: Placeholder())
    monkeypatch.setattr(_fingerprint, "_distributions", lambda: {"jax": ["jax-real"]})
    assert _fingerprint._owners("jax") == ["jax-real"]


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


def test_cache_rebuilds_when_an_earlier_source_changed():
    """A cached value whose source no longer computes what it did is built anew."""
    cache = FingerprintCache(4)
    namespace = {"jnp": jnp}
    exec("f = lambda x: jnp.sum(x)", namespace)
    first = cache.get(("k", namespace["f"]), lambda: "first")
    namespace.clear()  # as doctest clears a test's globals: the old f cannot run now
    again = {"jnp": jnp}
    exec("f = lambda x: jnp.sum(x)", again)
    assert cache.get(("k", again["f"]), lambda: "second") == "second" != first


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
    before = dict(_programs.trace_counts)
    again = cr.run(cr.from_numpyro(NUTS(eight_schools), model_args=DATA, model_kwargs=Y),
                   jax.random.key(0), None, 50, **KW)  # fmt: skip
    assert _programs.trace_counts == before
    assert np.array_equal(first.draws["mu"], again.draws["mu"])
    # blackjax: a new algorithm object from the same log density and parameters
    nuts = lambda: blackjax.nuts(_scaled(1.0), 0.5, jnp.ones(3))  # noqa: E731
    cr.run(nuts(), jax.random.key(0), jnp.zeros((2, 3)), 20, progress=False, warn=False)
    before = dict(_programs.trace_counts)
    cr.run(nuts(), jax.random.key(1), jnp.zeros((2, 3)), 20, progress=False, warn=False)
    assert _programs.trace_counts == before


def test_another_setting_or_closure_constant_never_reuses_a_program():
    run = functools.partial(cr.run, rng_key=jax.random.key(0), initial_position=jnp.zeros((2, 3)),
                            num_samples=20, progress=False, warn=False)  # fmt: skip
    one = run(blackjax.nuts(_scaled(1.0), 0.5, jnp.ones(3)))
    before = dict(_programs.trace_counts)
    other = run(blackjax.nuts(_scaled(5.0), 0.5, jnp.ones(3)))
    assert _programs.trace_counts["chunk"] == before["chunk"] + 1
    assert not np.array_equal(one.draws, other.draws)
    before = dict(_programs.trace_counts)
    cr.run(cr.from_numpyro(NUTS(eight_schools, target_accept_prob=0.9), model_args=DATA,
                           model_kwargs=Y), jax.random.key(0), None, 50, **KW)  # fmt: skip
    assert _programs.trace_counts["chunk"] == before["chunk"] + 1


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
from chainrunner.programs import _programs

scale = float(sys.argv[1])

def model(n):
    with numpyro.plate("n", n):
        numpyro.sample("x", dist.Normal(0.0, scale))

checkpoint = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] != "-" else None
how = sys.argv[3] if len(sys.argv) > 3 else None
if how == "opaque":  # a log density holding an object chainrunner cannot look into
    import blackjax

    class Scale:
        __slots__ = ("value",)  # no __dict__: its state is not read, it goes by identity

    holder = Scale()
    holder.value = scale
    kernel = cr.from_blackjax(blackjax.nuts, adaptation="fisher",
                              logdensity_fn=lambda x: -0.5 * jnp.sum((x / holder.value) ** 2))
    start = jnp.zeros((2, 3))
elif how == "usermodule":  # a class of the user's own module (PYTHONPATH), edited between runs
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
print(json.dumps({"traced": dict(_programs.trace_counts), "x": draws[:, -5:].tolist(),
                  "compile_time": trace.attrs["compile_time"], "jax_cache_hits": len(hits)}))
"""


def _process(folder, *args, off=False, path=None):
    env = {**os.environ, "CHAINRUNNER_CACHE_DIR": str(folder), "JAX_PLATFORMS": "cpu"}
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    if off:
        env["CHAINRUNNER_CACHE"] = "off"
    done = subprocess.run([sys.executable, "-c", SCRIPT, *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_the_programs_without_tracing(tmp_path):
    """Same script, second process: nothing traced, the same draws; another model constant
    in a third: traced and compiled (never the first model's program); a damaged file is
    compiled anew; a checkpoint written with a compiled program resumes with a loaded one."""
    folder = tmp_path / "cache"
    first = _process(folder, 1.0, tmp_path / "ckpt")
    assert first["traced"]["init"] == 1 and first["traced"]["chunk"] == 1
    files = sorted((folder / "programs").glob("*.bin"))
    assert len(files) == 2
    second = _process(folder, 1.0, tmp_path / "ckpt")  # the same run, from the checkpoint
    assert second["traced"] == {"init": 0, "chunk": 0}
    assert second["x"] == first["x"]
    other = _process(folder, 3.0)
    assert other["traced"]["chunk"] == 1 and other["x"] != first["x"]
    for f in files:  # damaged (truncated) files: dropped, compiled anew, same draws
        f.write_bytes(f.read_bytes()[:1000])
    again = _process(folder, 1.0)
    assert again["traced"]["chunk"] == 1 and again["x"] == first["x"]
    off = _process(tmp_path / "unused", 1.0, off=True)  # CHAINRUNNER_CACHE=off: no folder
    assert off["x"] == first["x"] and not (tmp_path / "unused").exists()


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
    window's cholesky and triangular solves) loaded in a new process crashed it before
    its kernels were set up: a second process now loads it, traces nothing, and draws
    the same numbers."""
    folder = tmp_path / "cache"
    dense = "window" if adaptation == "window" else adaptation
    first = _process(folder, 1.0, "-", dense)
    second = _process(folder, 1.0, "-", dense)
    assert second["x"] == first["x"]
    assert second["traced"] == {"init": 0, "chunk": 0}


def test_an_edited_module_of_the_users_code_is_another_program(tmp_path):
    """A class in the user's own module is fingerprinted by what it defines, not by its
    name: edited between two processes, the second never loads the first's program."""
    folder, code = tmp_path / "cache", tmp_path / "code"
    code.mkdir()
    text = "import jax.numpy as jnp\n\nclass Target:\n    @staticmethod\n    def logp(x):\n"
    (code / "usermod.py").write_text(text + "        return -0.5 * jnp.sum((x - 0.0) ** 2)\n")
    first = _process(folder, 1.0, "-", "usermodule", path=code)
    (code / "usermod.py").write_text(text + "        return -0.5 * jnp.sum((x - 10.0) ** 2)\n")
    second = _process(folder, 1.0, "-", "usermodule", path=code)
    assert second["traced"]["chunk"] == 1
    assert np.mean(second["x"]) > np.mean(first["x"]) + 5


def test_a_pymc_like_kernel_comes_from_jaxs_cache(tmp_path):
    """A kernel without a fingerprint (an object compared by identity in its log density)
    is traced in every process; its compiled code comes from JAX's persistent cache in
    chainrunner's folder (JAX's own settings back as they were after the run)."""
    folder = tmp_path / "cache"
    first = _process(folder, 1.0, "-", "opaque")
    second = _process(folder, 1.0, "-", "opaque")
    assert second["x"] == first["x"]
    assert second["traced"]["chunk"] == 1 and second["jax_cache_hits"] >= 1
    assert any((folder / "jax").iterdir())


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
