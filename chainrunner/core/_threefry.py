"""JAX's threefry ``fold_in``, ``split`` and ``uniform``, written out: the same bits, and
a small compile for many keys at once.

On CPU, XLA compiles each of JAX's Threefry-2x32 hashes as a rolled loop, about half a
second to a second each whatever the shape: drawing a chunk's random numbers for the NUTS
state machine (``adapters/_blackjax/_nuts_fsm.py``: per draw, per doubling, a fold, a
split and two uniforms) took 4.7 s to compile that way, and 0.2 s as the plain
arithmetic below (Salmon et al. 2011, Threefry-2x32 with 20 rounds). The functions take
and give key *data* (``uint32``, last axis 2) and follow ``jax_threefry_partitionable``
as ``jax.random`` does; ``tests/test_threefry.py`` checks them bit for bit against it.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["fold_in", "is_threefry", "is_threefry_impl", "normal", "split", "uniform"]

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


def is_threefry(keys: jax.Array) -> bool:
    """Whether ``keys`` (typed keys) are JAX's default ``threefry2x32``."""
    return is_threefry_impl(jax.random.key_impl(keys))


def is_threefry_impl(impl: Any) -> bool:
    """Whether ``impl`` (``jax.random.key_impl``'s) is JAX's default ``threefry2x32``."""
    return str(impl) == "threefry2x32"


def _rotl(x: jax.Array, r: int) -> jax.Array:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _hash2x32(key: jax.Array, x1: Any, x2: Any) -> tuple[jax.Array, jax.Array]:
    """The Threefry-2x32 hash of the counters ``(x1, x2)`` under ``key`` (data, ``(..., 2)``)."""
    k1, k2 = key[..., 0], key[..., 1]
    ks = (k1, k2, k1 ^ k2 ^ _PARITY)
    x1 = jnp.asarray(x1, jnp.uint32) + ks[0]
    x2 = jnp.asarray(x2, jnp.uint32) + ks[1]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x1 = x1 + x2
            x2 = x1 ^ _rotl(x2, r)
        x1 = x1 + ks[(i + 1) % 3]
        x2 = x2 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x1, x2


hash2x32 = jax.jit(_hash2x32, inline=True)
"""``_hash2x32``, traced once per shapes and inlined where it is called: its hundred-odd
operations are recorded once a process, not on every trace of a program that draws."""


def fold_in(key: jax.Array, data: Any) -> jax.Array:
    """``jax.random.fold_in`` on key data; ``data`` broadcasts against ``key[..., 0]``.

    Examples:
        >>> import jax, numpy as np
        >>> key = jax.random.key(3)
        >>> mine = fold_in(jax.random.key_data(key), 7)
        >>> bool(np.array_equal(mine, jax.random.key_data(jax.random.fold_in(key, 7))))
        True
    """
    data = jnp.asarray(data).astype(jnp.uint32)
    y1, y2 = hash2x32(key, jnp.zeros_like(data), data)
    return jnp.stack([y1, y2], axis=-1)


def split(key: jax.Array, num: int) -> jax.Array:
    """``jax.random.split(key, num)`` on key data: shape ``(..., num, 2)``."""
    key = key[..., None, :]
    if jax.config.jax_threefry_partitionable:
        counts = np.arange(num, dtype=np.uint32)
        y1, y2 = hash2x32(key, np.zeros(num, np.uint32), counts)
        return jnp.stack([y1, y2], axis=-1)
    y1, y2 = hash2x32(key, np.arange(num, dtype=np.uint32),
                      np.arange(num, 2 * num, dtype=np.uint32))  # fmt: skip
    words = jnp.concatenate([y1, y2], axis=-1)
    return words.reshape((*words.shape[:-1], num, 2))


def _bits(key: jax.Array, num: int) -> jax.Array:
    """``num`` random 32-bit words per key (``jax.random.bits(key, (num,))``): ``(..., num)``."""
    key = key[..., None, :]
    if jax.config.jax_threefry_partitionable:
        a, b = hash2x32(key, np.zeros(num, np.uint32), np.arange(num, dtype=np.uint32))
        return a ^ b
    half = -(-num // 2)
    counts = np.arange(2 * half, dtype=np.uint32)
    counts[num:] = 0  # an odd count is padded with a zero
    a, b = hash2x32(key, counts[:half], counts[half:])
    return jnp.concatenate([a, b], axis=-1)[..., :num]


def _floats(bits: jax.Array) -> jax.Array:
    """Floats in ``[0, 1)`` from random words, as ``jax.random.uniform`` makes them."""
    one = np.float32(1.0).view(np.uint32)
    return jax.lax.bitcast_convert_type((bits >> np.uint32(9)) | one, jnp.float32) - 1.0


def uniform(key: jax.Array, minval: float = 0.0, maxval: float = 1.0) -> jax.Array:
    """``jax.random.uniform(key, (), float32, minval, maxval)`` (one float per key) on key
    data."""
    lo, hi = np.float32(minval), np.float32(maxval)
    return jnp.maximum(lo, _floats(_bits(key, 1)[..., 0]) * (hi - lo) + lo)


def normal(key: jax.Array, num: int) -> jax.Array:
    """``jax.random.normal(key, (num,))`` (float32) on key data: ``(..., num)``: the same
    uniform bits, whose ``erf_inv`` XLA may round 1 ulp apart in another fusion."""
    lo = np.nextafter(np.float32(-1.0), np.float32(0.0))
    u = jnp.maximum(lo, _floats(_bits(key, num)) * (np.float32(1.0) - lo) + lo)
    return np.float32(np.sqrt(2)) * jax.lax.erf_inv(u)
