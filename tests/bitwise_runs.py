"""A fixed set of runs whose draws and stats are recorded bit for bit.

``tests/test_bitwise.py`` runs them and compares with ``tests/fixtures/bitwise-jax<version>.npz``,
recorded before the pipeline redesign of ``run`` (issue 15): refactoring must not change a
single bit. One deliberate change since: ``blackjax_b_none_2dev`` (a vmapped
``blackjax.nuts``) runs as the NUTS state machine (issue 37), which rounds differently
(5e-7 at most on its draws, the same random numbers); its arrays were recorded again.
So, on jax 0.12, were ``window_warmup``'s: window-adapted NUTS runs as the machine too, and
its dual averaging rounds 1 ulp apart there, which the warmup grows into other draws
(on jax 0.10 the machine gives its recorded bits).
XLA tunes its CPU code to the host CPU, and on another CPU model two of these
runs differ in the last bits; so a machine's own fixture, ``bitwise-jax<version>-<cpu
class>.npz``, is compared bit for bit where there is one, and otherwise the first one
within float32 rounding. (On a CPU without AVX-512, AMD family 25 model 1, jax 0.12's
last bits differ in four runs and grow until the window warmup's chains part
altogether: that class has fixtures of its own.) Record a fixture for a new jax version
(numerics may legitimately differ between jax releases) or CPU class with, on 8 simulated
CPU devices::

    JAX_NUM_CPU_DEVICES=8 python tests/bitwise_runs.py --write

Not a test module (no ``test_`` prefix): importing it runs nothing.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from unittest import mock

import numpy as np
from interrupting import InterruptingBar

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def cpu_class() -> str:
    """The host CPU as XLA compiles for it: vendor, family and model, and AVX-512.

    XLA's CPU code is tuned to the host: on another CPU model some runs (the window and
    MEADS warmups) differ in the last bits of float32 (seen: up to 5e-6 on draws of order 1).
    """
    import platform

    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.machine() or "unknown"
    parts = [info.get(k, "?").replace(" ", "_") for k in ("vendor_id", "cpu family", "model")]
    avx512 = ["avx512"] if "avx512f" in info.get("flags", "").split() else []
    return "-".join([platform.machine(), *parts, *avx512])


def fixture_path(cpu: str | None = "") -> str:
    """This jax's fixture for ``cpu`` (default: this machine's ``cpu_class``), or with
    ``cpu=None`` the one recorded first, on a CPU whose class was not noted."""
    import jax

    if cpu == "":
        cpu = cpu_class()
    suffix = "" if cpu is None else f"-{cpu}"
    return os.path.join(FIXTURES, f"bitwise-jax{jax.__version__}{suffix}.npz")


def _flat(prefix: str, trace) -> dict[str, np.ndarray]:
    import jax

    out = {}
    for name, tree in (("draws", trace.draws), ("stats", trace.stats)):
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            out[f"{prefix}/{name}{jax.tree_util.keystr(path)}"] = np.asarray(leaf)
    if trace.warmup_draws is not None:
        for name, tree in (
            ("warmup_draws", trace.warmup_draws),
            ("warmup_stats", trace.warmup_stats),
        ):
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
                out[f"{prefix}/{name}{jax.tree_util.keystr(path)}"] = np.asarray(leaf)
    return out


def runs() -> dict[str, Callable[[], dict[str, np.ndarray]]]:
    """name -> a function that runs it and returns its arrays by name."""
    import warnings

    import blackjax
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    import chainrunner as cr

    def logdensity(x):
        return -0.5 * jnp.sum((x - jnp.arange(3.0)) ** 2 / jnp.array([1.0, 4.0, 0.25]))

    nuts = blackjax.nuts(logdensity, 0.7, jnp.ones(3))
    x0 = jnp.asarray(np.random.default_rng(0).normal(size=(7, 3)), jnp.float32)
    kw = {"progress": False, "warn": False}

    def eight_schools(J, sigma, y=None):
        mu = numpyro.sample("mu", dist.Normal(0, 5))
        tau = numpyro.sample("tau", dist.HalfCauchy(5))
        with numpyro.plate("J", J):
            eta = numpyro.sample("eta", dist.Normal(0, 1))
            theta = numpyro.deterministic("theta", mu + tau * eta)
            numpyro.sample("obs", dist.Normal(theta, sigma), obs=y)

    y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
    sigma = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])
    schools = cr.from_numpyro(numpyro.infer.NUTS(eight_schools), model_args=(8, sigma, y))

    def blackjax_batch(b, devices):
        def go():
            t = cr.run(nuts, jax.random.key(1), x0, 24, num_warmup=6, batch_size=b,
                       mesh=cr.chain_mesh(devices), **kw)  # fmt: skip
            return _flat("run", t)

        return go

    def thinned():
        t = cr.run(nuts, jax.random.key(2), x0, 24, num_warmup=6, thinning=3, chunk_size=3,
                   keep_warmup=True, mesh=cr.chain_mesh(2), **kw)  # fmt: skip
        return _flat("run", t)

    def continued():
        first = cr.run(nuts, jax.random.key(3), x0, 12, mesh=cr.chain_mesh(4), chunk_size=5, **kw)
        more = cr.run(nuts, jax.random.key(3), first, 9, chunk_size=5, **kw)
        return {**_flat("first", first), **_flat("more", more)}

    def resumed():
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "ckpt")
            args = (nuts, jax.random.key(4), x0, 20)
            opts = dict(chunk_size=4, checkpoint=path, mesh=cr.chain_mesh(2), **kw)
            with mock.patch("tqdm.auto.tqdm", InterruptingBar), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cr.run(*args, **opts)
            t = cr.run(*args, **opts)
            assert t.attrs["resumed_from_draw"] > 0, t.attrs
            return _flat("resumed", t)

    def window():
        k = cr.from_blackjax(blackjax.nuts, logdensity_fn=logdensity, adaptation="window")
        t = cr.run(k, jax.random.key(5), x0, 15, num_warmup=40, keep_warmup=True,
                   mesh=cr.chain_mesh(4), batch_size=2, **kw)  # fmt: skip
        return _flat("window", t)

    def chees():
        k = cr.from_blackjax(blackjax.dynamic_hmc, logdensity_fn=logdensity, adaptation="chees",
                             layout="replicated")  # fmt: skip
        t = cr.run(k, jax.random.key(6), x0, 10, num_warmup=20, keep_warmup=True,
                   mesh=cr.chain_mesh(2), **kw)  # fmt: skip
        more = cr.run(k, jax.random.key(6), t, 5, **kw)
        return {**_flat("chees", t), **_flat("chees_more", more)}

    def meads():
        k = cr.from_blackjax(blackjax.ghmc, logdensity_fn=logdensity, adaptation="meads",
                             layout="replicated")  # fmt: skip
        t = cr.run(k, jax.random.key(7), jnp.tile(x0, (2, 1)), 10, num_warmup=20,
                   mesh=cr.chain_mesh(4), **kw)  # fmt: skip
        return _flat("meads", t)

    def numpyro_batch(b):
        def go():
            t = cr.run(schools, jax.random.key(8), None, 15, num_warmup=15, num_chains=5,
                       batch_size=b, mesh=cr.chain_mesh(2), keep_warmup=True, **kw)  # fmt: skip
            return _flat("numpyro", t)

        return go

    def numpyro_keep():
        t = cr.run(schools, jax.random.key(9), None, 10, num_warmup=10, num_chains=3,
                   keep=["mu", "theta"], thinning=2, mesh=cr.chain_mesh(2), **kw)  # fmt: skip
        return _flat("keep", t)

    return {
        "blackjax_b_none_2dev": blackjax_batch(None, 2),
        "blackjax_b1_2dev": blackjax_batch(1, 2),
        "blackjax_b2_4dev": blackjax_batch(2, 4),
        "blackjax_thinning": thinned,
        "blackjax_continue": continued,
        "blackjax_checkpoint_resume": resumed,
        "window_warmup": window,
        "chees_warmup": chees,
        "meads_warmup": meads,
        "numpyro_b_none": numpyro_batch(None),
        "numpyro_b1": numpyro_batch(1),
        "numpyro_keep_thinning": numpyro_keep,
    }


def record() -> dict[str, np.ndarray]:
    out = {}
    for name, go in runs().items():
        for key, value in go().items():
            out[f"{name}:{key}"] = value
    return out


if __name__ == "__main__":
    if "--write" not in sys.argv:
        sys.exit(__doc__)
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    os.makedirs(FIXTURES, exist_ok=True)
    arrays = record()
    np.savez_compressed(fixture_path(), **arrays)
    print(f"wrote {len(arrays)} arrays to {fixture_path()}")
