"""``core/_threefry.py``: JAX's threefry ``fold_in``, ``split`` and ``uniform``, bit for bit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from chainrunner.core import _threefry


@pytest.fixture(params=[True, False], ids=["partitionable", "original"])
def partitionable(request):
    before = jax.config.jax_threefry_partitionable
    jax.config.update("jax_threefry_partitionable", request.param)
    yield request.param
    jax.config.update("jax_threefry_partitionable", before)


def test_the_same_bits_as_jax_random(partitionable):
    keys = jax.random.split(jax.random.key(11), 300)
    data = jnp.asarray(np.random.default_rng(0).integers(0, 2**31, 300))
    kd = jax.random.key_data(keys)
    folded = jax.vmap(jax.random.fold_in)(keys, data)
    np.testing.assert_array_equal(_threefry.fold_in(kd, data), jax.random.key_data(folded))
    for num in (1, 2, 3, 5):
        ref = jax.vmap(lambda k, n=num: jax.random.key_data(jax.random.split(k, n)))(keys)
        np.testing.assert_array_equal(_threefry.split(kd, num), ref)
    np.testing.assert_array_equal(_threefry.uniform(kd), jax.vmap(jax.random.uniform)(keys))
    np.testing.assert_array_equal(_threefry.uniform(kd) < 0.5, jax.vmap(jax.random.bernoulli)(keys))
    for num in (1, 4, 7):
        ref = jax.vmap(lambda k, n=num: jax.random.normal(k, (n,)))(keys)
        # the same bits into erf_inv, whose result XLA may round 1 ulp apart elsewhere
        np.testing.assert_allclose(_threefry.normal(kd, num), ref, rtol=1e-6, atol=1e-6)
    assert _threefry.is_threefry(keys)
    assert not _threefry.is_threefry(jax.random.key(0, impl="rbg"))
