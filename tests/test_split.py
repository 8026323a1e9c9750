"""``programs/_split``: a traced call cut around its scan gives the call's own results."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from chainrunner.programs._split import split_scan

DATA = np.linspace(0.5, 2.0, 7).astype(np.float32)  # a constant of the traced call


def call(key, x, n=12):
    """Set-up, a jitted scan (as blackjax writes it) of ``n`` steps with a constant, a key
    per step and a carry that never changes, then finishing that reads the last per-step
    output."""
    keys = jax.random.split(key, 12)[:n]
    start = (x * 2.0, jnp.float32(0.0), jnp.float32(3.0))

    def one(carry, xs):
        i, k = xs
        y, total, fixed = carry
        y = y * 0.9 + jax.random.normal(k, y.shape) * jnp.asarray(DATA)[i % 7] + fixed
        return (y, total + y.sum(), fixed), {"y": y, "i": i}

    scan = jax.jit(functools.partial(jax.lax.scan, one))
    (y, total, _), ys = scan(start, (jnp.arange(n), keys))
    return {"y": y + ys["y"][-1], "total": total, "n": 12, "mean": ys["y"].mean(0)}


def chunked(split, key, x, sizes):
    carry, first = split.start(key, x), 0
    for size in sizes:
        for i in range(first, first + size):
            carry = split.step(carry, i)
        first += size
    return split.finish(carry, first)


def test_the_cut_call_in_chunks_is_the_call():
    key, x = jax.random.key(0), jnp.arange(3.0)
    split = split_scan(call, 12, key, jax.ShapeDtypeStruct((3,), jnp.float32))
    assert split is not None and split.length == 12
    expected, whole = call(key, x), chunked(split, key, x, [12])
    assert set(whole) == set(expected)
    for name in expected:  # (here op by op: XLA rounds the jitted call's steps otherwise)
        np.testing.assert_allclose(whole[name], expected[name], rtol=1e-6)
    for sizes in ([5, 7], [1] * 12):  # the chunks, bit for bit
        jax.tree.map(np.testing.assert_array_equal, chunked(split, key, x, sizes), whole)


def test_under_jit_and_vmap_a_run_time_count_gives_the_call():
    keys, xs = jax.random.split(jax.random.key(1), 4), jnp.arange(12.0).reshape(4, 3)
    split = split_scan(call, 12, keys[0], xs[0])

    @jax.jit
    def run(keys, xs, count):
        def one(key, x):
            carry = split.start(key, x)
            carry = jax.lax.fori_loop(0, count, lambda i, c: split.step(c, i), carry)
            return split.finish(carry, count)

        return jax.vmap(one)(keys, xs)

    got, expected = run(keys, xs, 12), jax.jit(jax.vmap(call))(keys, xs)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), got, expected)


def test_finishing_early_is_the_call_stopped_there():
    """After 5 of 12 steps: the call of 5 steps (its per-step outputs past the fifth read
    as the fifth)."""
    key, x = jax.random.key(2), jnp.ones(3)
    early = chunked(split_scan(call, 12, key, x), key, x, [5])
    five = chunked(split_scan(functools.partial(call, n=5), 5, key, x), key, x, [5])
    np.testing.assert_array_equal(early["y"], five["y"])
    np.testing.assert_array_equal(early["total"], five["total"])


def test_calls_it_cannot_cut_are_none():
    x = jnp.ones(3)

    def no_scan(x):
        return jax.lax.while_loop(lambda c: c[0] < 5, lambda c: (c[0] + 1, c[1] * 2), (0, x))[1]

    def other_length(x):
        return jax.lax.scan(lambda c, _: (c + 1.0, None), x, length=4)[0]

    def reversed_scan(x):
        return jax.lax.scan(lambda c, _: (c + 1.0, None), x, length=12, reverse=True)[0]

    def with_a_callback(x):
        jax.debug.print("{}", x)
        return jax.lax.scan(lambda c, _: (c + 1.0, None), x, length=12)[0]

    for fn in (no_scan, other_length, reversed_scan, with_a_callback):
        assert split_scan(fn, 12, x) is None, fn.__name__


def test_the_carry_holds_only_what_depends_on_the_arguments_and_is_read():
    """The constant the steps read, the step numbers (``arange``) and the per-step output
    nothing reads stay out of the carry: each chain would hold a copy, and checkpoints
    write it."""
    key, x = jax.random.key(0), jnp.arange(3.0)
    carry = split_scan(call, 12, key, x).start(key, x)
    shapes = [(str(c.dtype), tuple(c.shape)) for c in carry]
    assert ("float32", (7,)) not in shapes  # DATA
    assert ("int32", (12,)) not in shapes  # the steps' numbers, and their output "i"
    assert shapes.count(("float32", (12, 3))) == 1  # the per-step "y" the finishing reads
    # the keys; y and total (the scan's carry: JAX makes "fixed", never changed, one of
    # its constants); the buffer
    assert len(carry) == 4
