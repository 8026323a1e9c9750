"""Property-based tests (hypothesis) over layouts, and fuzzed bad arguments.

Layouts: 1 to 40 chains, meshes of 1, 2, 4 or 8 devices, ``batch_size`` None or 1 to 7,
``chunk_size`` and ``thinning``. The kernel is a hand-written AR(1) chain whose
coefficient is a kernel ``param`` (new values reuse the compiled program), so every
example costs at most one small compile. Its draws are checked against a reference
built from the documented key recipe (docs/reproducibility.md): chain ``i`` uses
``split(fold_in(rng_key, i))`` -> ``(init_key, step_key)`` and step ``t`` uses
``fold_in(step_key, t)``.

Examples are few and derandomised so that CI time stays small and results repeat.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import chainrunner as cr
from chainrunner.programs import _compile, _programs

SETTINGS = dict(
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
KEY = jax.random.key(7)
DIM = 2
MESHES = {d: cr.chain_mesh(d) for d in (1, 2, 4, 8)}

chains = st.integers(1, 40)
devices = st.sampled_from([1, 2, 4, 8])
batch_sizes = st.one_of(st.none(), st.integers(1, 7))


def ar1_step(rng_key, x, phi):
    return phi * x + jnp.sqrt(1.0 - phi**2) * jax.random.normal(rng_key, x.shape), {}


AR1 = cr.Kernel(
    init=lambda position, rng_key, phi: position,
    step=ar1_step,
    extract=lambda state, info, phi: (state, info),
    logdensity=None,
    params=jnp.float32(0.5),
)


def x0(num_chains, offset=0.0):
    i = np.arange(num_chains, dtype=np.float32)[:, None]
    return jnp.asarray(np.concatenate([0.1 * i + offset, -0.1 * i - offset], axis=1))


@functools.cache
def reference(num_steps=24, num_chains=40, phi=0.5):
    """States after steps 1..num_steps of every chain, ``(chain, step, DIM)``, from the docs."""

    def chain(i, x):
        _, step_key = jax.random.split(jax.random.fold_in(KEY, i))

        def body(x, t):
            x, _ = ar1_step(jax.random.fold_in(step_key, t), x, jnp.float32(phi))
            return x, x

        return jax.lax.scan(body, x, jnp.arange(num_steps, dtype=jnp.int32))[1]

    out = jax.jit(jax.vmap(chain))(jnp.arange(num_chains, dtype=jnp.uint32), x0(num_chains))
    return np.asarray(out)


def run(n, d, b, num_samples, **options):
    options = {"mesh": MESHES[d], "batch_size": b, "progress": False, "warn": False, **options}
    return cr.run(AR1, KEY, x0(n), num_samples, **options)


@settings(max_examples=10, **SETTINGS)
@given(
    n=chains,
    d=devices,
    b=batch_sizes,
    thinning=st.integers(1, 3),
    warmup=st.integers(0, 2),
    k=st.integers(1, 5),
    chunk=st.one_of(st.none(), st.integers(1, 6)),
)
def test_layout_shapes_and_draws(n, d, b, thinning, warmup, k, chunk):
    trace = run(n, d, b, k * thinning, num_warmup=warmup * thinning, thinning=thinning,
                chunk_size=chunk)  # fmt: skip
    assert trace.draws.shape == (n, k, DIM)
    assert trace.final_state.shape == (n, DIM)
    assert trace.num_steps == (warmup + k) * thinning
    assert trace.attrs["num_chains"] == n and trace.attrs["num_devices"] == d
    per_device = trace.attrs["chains_per_device"]
    assert per_device * d == n + trace.attrs["padded_chains"] and per_device >= -(-n // d)
    if b is not None and b < -(-n // d):
        assert per_device % b == 0
    # The kept draws are steps warmup*thinning + thinning - 1, + thinning, ... of each chain.
    steps = (warmup + 1 + np.arange(k)) * thinning - 1
    np.testing.assert_allclose(trace.draws, reference()[:n, steps], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(trace.final_state, reference()[:n, steps[-1]], rtol=1e-6, atol=1e-6)


@settings(max_examples=5, **SETTINGS)
@given(
    n=chains,
    d=devices,
    b=batch_sizes,
    k=st.integers(2, 8),
    chunks=st.lists(st.integers(1, 8), min_size=2, max_size=2, unique=True),
)
def test_draws_equal_across_chunk_sizes(n, d, b, k, chunks):
    one, two = (run(n, d, b, k, chunk_size=c) for c in chunks)
    np.testing.assert_array_equal(one.draws, two.draws)
    np.testing.assert_array_equal(np.asarray(one.final_state), np.asarray(two.final_state))


@settings(max_examples=5, **SETTINGS)
@given(
    n=chains,
    d=devices,
    b=batch_sizes,
    chunk=st.integers(1, 4),
    seed=st.integers(0, 2**31 - 1),
    more=st.integers(1, 3),
    warmup=st.integers(0, 5),
    phi=st.floats(-0.875, 0.875, width=32),
)
def test_same_shapes_never_recompile(n, d, b, chunk, seed, more, warmup, phi):
    run(n, d, b, chunk, chunk_size=chunk)  # compiles (or finds) this layout's programs
    before = dict(_compile.compile_counts)
    kernel = AR1._replace(params=jnp.float32(phi))  # new parameter values, same shapes
    again = cr.run(kernel, jax.random.key(seed), x0(n, offset=1.5), more * chunk + 1,
                   num_warmup=warmup, mesh=MESHES[d], batch_size=b, chunk_size=chunk,
                   progress=False, warn=False)  # fmt: skip
    assert _compile.compile_counts == before
    assert again.draws.shape == (n, more * chunk + 1, DIM)


def per_chain(x, y):
    """A per-chain function with a pytree in and out, a reduction and a matmul."""
    return {"a": jnp.sin(x) * y["s"], "b": x @ y["m"], "c": jnp.sum(x**2)}


@settings(max_examples=12, **SETTINGS)
@given(n=chains, d=devices, b=batch_sizes, seed=st.integers(0, 1000))
def test_chain_map_equals_vmap(n, d, b, seed):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(n, 3)), jnp.float32)
    y = {"s": jnp.asarray(rng.normal(size=(n,)), jnp.float32),
         "m": jnp.asarray(rng.normal(size=(n, 3, 2)), jnp.float32)}  # fmt: skip
    out = cr.chain_map(per_chain, mesh=MESHES[d], batch_size=b)(x, y)
    expected = jax.vmap(per_chain)(x, y)
    assert jax.tree.structure(out) == jax.tree.structure(expected)
    for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(expected), strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        if n % d == 0:
            want = NamedSharding(MESHES[d], P("chain"))  # P() is the same on one device
            assert got.sharding.is_equivalent_to(want, got.ndim), got.sharding


# -- fuzzed bad arguments ---------------------------------------------------------------

X0 = jnp.zeros((4, DIM))
not_int = st.one_of(
    st.floats(allow_nan=True), st.text(max_size=3), st.booleans(), st.just([1]), st.just(2.0)
)
not_bool = st.one_of(st.integers(), st.text(max_size=3), st.none(), st.floats())
bad_positions = st.sampled_from(
    [
        jnp.zeros(()),
        jnp.zeros((0, DIM)),
        {"a": jnp.zeros((4, 2)), "b": jnp.zeros((3, 2))},
        {},
        [],
        (jnp.float32(1.0),),
    ]
)
bad_keys = st.one_of(
    st.integers(),
    st.floats(),
    st.just(np.zeros(3, np.uint32)),
    st.just(np.zeros(2, np.float32)),
    st.just(jax.random.split(KEY, 2)),
    st.none(),
)
other_mesh = Mesh(np.asarray(jax.devices()[:2]), ("x",))
bad_run_arguments = st.one_of(
    st.tuples(st.just("kernel"), st.one_of(st.integers(), st.text(max_size=3), st.none())),
    st.tuples(st.just("rng_key"), bad_keys),
    st.tuples(st.just("initial_position"), bad_positions),
    st.tuples(st.just("num_samples"), st.one_of(st.integers(max_value=0), not_int, st.none())),
    st.tuples(st.just("num_warmup"), st.one_of(st.integers(max_value=-1), not_int)),
    st.tuples(st.just("thinning"), st.one_of(st.integers(max_value=0), st.just(3), not_int)),
    st.tuples(
        st.just("num_chains"), st.one_of(st.integers(max_value=3), st.integers(5, 99), not_int)
    ),
    st.tuples(st.just("batch_size"), st.one_of(st.integers(max_value=0), not_int)),
    st.tuples(st.just("chunk_size"), st.one_of(st.integers(max_value=0), not_int)),
    st.tuples(st.just("mesh"), st.one_of(st.integers(), st.text(max_size=3), st.just(other_mesh))),
    st.tuples(st.just("progress"), st.one_of(st.integers(), st.text(max_size=3))),
    st.tuples(st.sampled_from(["warn", "keep_warmup", "monitor"]), not_bool),
    st.tuples(st.just("on_bad_init"), st.one_of(st.text(max_size=8), st.integers())),
    st.tuples(
        st.just("init_jitter"),
        st.one_of(st.floats(max_value=0.0), st.just(float("inf")), st.text(max_size=3)),
    ),
    st.tuples(st.just("keep"), st.one_of(st.integers(), st.just([]), st.just([1, 2]))),
)
POSITIONAL = ("kernel", "rng_key", "initial_position", "num_samples")


@settings(max_examples=60, **SETTINGS)
@given(bad=bad_run_arguments)
def test_run_rejects_bad_arguments(bad):
    name, value = bad
    if name == "num_chains" and value == 4:
        value = 5
    if name == "on_bad_init" and value in ("raise", "warn", "reinit"):
        value = "never"
    args = dict(zip(POSITIONAL, (AR1, KEY, X0, 10), strict=True))
    options = {"progress": False}
    (args if name in POSITIONAL else options)[name] = value
    before = dict(_programs.trace_counts)
    with pytest.raises((ValueError, TypeError)):
        cr.run(*args.values(), **options)
    assert _programs.trace_counts == before  # refused before anything was traced


@settings(max_examples=30, **SETTINGS)
@given(
    bad=st.one_of(
        st.tuples(st.just("fn"), st.one_of(st.integers(), st.text(max_size=3), st.none())),
        st.tuples(st.just("mesh"), st.one_of(st.integers(), st.text(max_size=3))),
        st.tuples(st.just("mesh"), st.just(other_mesh)),
        st.tuples(st.just("batch_size"), st.one_of(st.integers(max_value=0), not_int)),
        st.tuples(st.just("args"), st.sampled_from([(), (jnp.zeros(()),), (jnp.zeros((0, 2)),)])),
        st.tuples(st.just("args"), st.just((jnp.zeros((3, 2)), jnp.zeros((4,))))),
    )
)
def test_chain_map_rejects_bad_arguments(bad):
    name, value = bad
    fn, options, args = (lambda *a: a), {}, (jnp.zeros((4, 2)),)
    if name == "fn":
        fn = value
    elif name == "args":
        args = value
    else:
        options[name] = value
    with pytest.raises((ValueError, TypeError)):
        cr.chain_map(fn, **options)(*args)


@settings(max_examples=25, **SETTINGS)
@given(
    num_devices=st.one_of(
        st.integers(max_value=0), st.integers(9, 10**6), not_int, st.just(np.int64(9))
    )
)
def test_chain_mesh_rejects_bad_device_counts(num_devices):
    with pytest.raises((ValueError, TypeError)):
        cr.chain_mesh(num_devices)


def test_chain_mesh_rejects_both_or_no_devices():
    with pytest.raises(ValueError, match="not both"):
        cr.chain_mesh(2, devices=jax.devices()[:2])
    with pytest.raises(ValueError, match="empty"):
        cr.chain_mesh(devices=[])


@pytest.mark.parametrize("devices", [[1, 2], "ab", [jax.devices()[0]] * 2])
def test_chain_mesh_rejects_non_devices(devices):
    with pytest.raises((ValueError, TypeError)):
        cr.chain_mesh(devices=devices)
