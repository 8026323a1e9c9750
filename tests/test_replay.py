"""``programs/_replay.py``: a traced kernel replayed with threefry's key derivations
written out gives the same numbers, bit for bit, and no rolled hash loop on CPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import jaxpr_as_fun

from chainrunner.programs._replay import replay


@pytest.fixture(params=[True, False], ids=["partitionable", "original"])
def partitionable(request):
    before = jax.config.jax_threefry_partitionable
    jax.config.update("jax_threefry_partitionable", request.param)
    yield request.param
    jax.config.update("jax_threefry_partitionable", before)


def _kernel_like(key, x):
    """Keys split and folded at the top, in a jit, a while loop, a cond and a scan."""

    def body(carry):
        i, k, x = carry
        k, sub = jax.random.split(k)
        x = x + jax.random.normal(jax.random.fold_in(sub, i), x.shape)
        return i + 1, k, x

    _, key, x = jax.lax.while_loop(lambda c: c[0] < 5, body, (0, key, x))
    keys = jax.random.split(key, (2, 3))
    x = jax.lax.cond(
        x[0] > 0,
        lambda k: x * jax.random.uniform(jax.random.split(k)[0], x.shape),
        lambda k: x - jax.random.uniform(jax.random.fold_in(k, 7), x.shape),
        keys[1, 2],
    )

    def scanned(x, k):
        return x + jax.random.uniform(jax.random.split(k, 3)[2]), jnp.sum(x)

    x, ys = jax.lax.scan(scanned, x, keys[0])
    return x, ys, jax.random.key_data(jax.jit(lambda k: jax.random.split(k, 4))(key))


def test_the_same_numbers_as_the_traced_kernel(partitionable):
    key, x = jax.random.key(3), jnp.linspace(-1.0, 1.0, 5)
    closed = jax.make_jaxpr(_kernel_like)(key, x)
    keys = jax.random.split(jax.random.key(11), 16)
    xs = jnp.stack([x * (i - 8) for i in range(16)])

    def mapped(f):
        return jax.jit(lambda k, x: jax.lax.map(lambda a: f(*a), (k, x)))(keys, xs)

    for lay in (mapped, lambda f: jax.jit(jax.vmap(f))(keys, xs)):
        want = lay(lambda k, x: jaxpr_as_fun(closed)(k, x))
        got = lay(lambda k, x: replay(closed, k, x))
        for w, g in zip(want, got, strict=True):
            assert np.array_equal(w, g), (w, g)
    direct = _kernel_like(key, x)
    for w, g in zip(direct, replay(closed, key, x), strict=True):
        np.testing.assert_array_equal(w, g)


def test_raw_keys_and_other_generators():
    """``jax.random.PRNGKey`` (raw ``uint32`` keys) is threefry's too; ``rbg`` keys keep
    JAX's primitives."""

    def f(key):
        return jax.random.split(jax.random.fold_in(key, 2), 3)

    raw = jax.random.PRNGKey(5)
    np.testing.assert_array_equal(replay(jax.make_jaxpr(f)(raw), raw)[0], f(raw))
    rbg = jax.random.key(5, impl="rbg")
    got = replay(jax.make_jaxpr(f)(rbg), rbg)[0]
    np.testing.assert_array_equal(jax.random.key_data(got), jax.random.key_data(f(rbg)))


def test_no_rolled_hash_loop_is_left_on_cpu():
    """The point of it: JAX lowers a threefry hash on CPU to a rolled ``while``; replayed,
    the key derivations are straight-line arithmetic."""

    def f(key):
        return jax.random.key_data(jax.random.split(jax.random.fold_in(key, 1), 4))

    closed = jax.make_jaxpr(f)(jax.random.key(0))
    key = jax.random.key(0)
    traced = jax.jit(jaxpr_as_fun(closed)).lower(key).as_text()
    written = jax.jit(lambda k: replay(closed, k)).lower(key).as_text()
    assert "stablehlo.while" in traced
    assert "stablehlo.while" not in written


def test_a_replayed_program_is_still_keyed_by_its_trace():
    """The written-out keys are wrapped again (``random_wrap``, whose ``impl`` JAX shows
    with its functions' addresses): a program holding one, beside a parameter shown by
    address (a ``custom_vmap`` rule), is keyed by its trace all the same; a key
    implementation of one's own is not."""
    from jax.custom_batching import custom_vmap

    from chainrunner.programs import _jaxpr

    @custom_vmap
    def f(x):
        return x

    f.def_vmap(lambda size, batched, x: (x, batched[0]))

    def program(key, x):
        return jax.random.key_data(jax.random.split(key, 2)), f(x)

    closed = jax.make_jaxpr(program)(jax.random.key(0), jnp.ones(2))
    replayed = jax.make_jaxpr(lambda k, x: replay(closed, k, x))(jax.random.key(0), jnp.ones(2))
    assert "random_wrap" in str(replayed) and " at 0x" in str(replayed)
    assert _jaxpr.digest(replayed) is not None

    from jax.extend.random import define_prng_impl

    mine = define_prng_impl(
        key_shape=(2,), seed=lambda s: jnp.zeros(2, jnp.uint32),
        split=lambda k, shape: jnp.zeros((*shape, 2), jnp.uint32),
        random_bits=lambda k, width, shape: jnp.zeros(shape, jnp.uint32),
        fold_in=lambda k, d: k, name="threefry2x32", tag="fry",
    )  # fmt: skip
    other = jax.make_jaxpr(lambda d: (jax.random.wrap_key_data(d, impl=mine), f(d)))(
        jnp.zeros(2, jnp.uint32)
    )
    assert _jaxpr.digest(other) is None
