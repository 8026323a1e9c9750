"""chain_map equals jax.vmap for any chain count, device count and batch size."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import chainrunner as cr


def per_chain(x, y):
    # Two outputs, a pytree input, and a reduction: enough to catch any mix-up of rows.
    return {"a": jnp.sin(x["u"]) * y.sum(), "b": jnp.cumsum(x["v"]) + y[0]}


@pytest.mark.parametrize("num_devices", [8, 4])
@pytest.mark.parametrize("num_chains", [8, 6, 13])
@pytest.mark.parametrize("batch_size", [None, 1, 3])
def test_equals_vmap(num_devices, num_chains, batch_size, rng):
    x = {
        "u": jnp.asarray(rng.normal(size=num_chains), jnp.float32),
        "v": jnp.asarray(rng.normal(size=(num_chains, 4)), jnp.float32),
    }
    y = jnp.asarray(rng.normal(size=(num_chains, 3)), jnp.float32)
    mesh = cr.chain_mesh(num_devices)
    out = cr.chain_map(per_chain, mesh=mesh, batch_size=batch_size)(x, y)
    expected = jax.vmap(per_chain)(x, y)
    for k in expected:
        assert out[k].shape == expected[k].shape
        np.testing.assert_allclose(out[k], expected[k], rtol=1e-6, atol=1e-6)
    if num_chains % num_devices == 0:
        assert out["a"].sharding == NamedSharding(mesh, P("chain"))


def test_outputs_sharded_over_chain_axis():
    mesh = cr.chain_mesh(8)
    out = cr.chain_map(lambda x: 2 * x, mesh=mesh, batch_size=2)(jnp.arange(16.0))
    assert out.sharding == NamedSharding(mesh, P("chain"))
    # Every device holds its own block, not a copy of device 0's.
    blocks = sorted((s.index[0].start, np.asarray(s.data).tolist()) for s in out.addressable_shards)
    assert blocks == [(2 * i, [4.0 * i, 4.0 * i + 2]) for i in range(8)]


def test_default_mesh_uses_all_devices():
    out = cr.chain_map(lambda x: x + 1)(jnp.zeros(8))
    assert len(out.sharding.device_set) == 8


def test_keys_map_like_vmap():
    keys = jax.random.split(jax.random.key(0), 5)
    out = cr.chain_map(lambda k: jax.random.normal(k, (2,)), mesh=cr.chain_mesh(4))(keys)
    np.testing.assert_array_equal(out, jax.vmap(lambda k: jax.random.normal(k, (2,)))(keys))


def test_no_retrace_for_new_values():
    traces = []

    def fn(x):
        traces.append(1)
        return x * 2

    g = cr.chain_map(fn, mesh=cr.chain_mesh(4), batch_size=2)
    g(jnp.arange(12.0))
    g(jnp.arange(12.0) + 1)
    assert len(traces) == 1


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"batch_size": 0}, ValueError, "batch_size must be >= 1, got 0"),
        ({"batch_size": 1.5}, TypeError, "batch_size must be an int"),
        ({"mesh": "cpu"}, TypeError, "mesh must be a jax.sharding.Mesh"),
    ],
)
def test_bad_options(kwargs, error, match):
    with pytest.raises(error, match=match):
        cr.chain_map(lambda x: x, **kwargs)


def test_mesh_without_chain_axis():
    mesh = jax.make_mesh((2,), ("batch",), devices=jax.devices()[:2])
    with pytest.raises(ValueError, match="expected an axis named 'chain'"):
        cr.chain_map(lambda x: x, mesh=mesh)


def test_leaves_disagree():
    g = cr.chain_map(lambda x, y: x + y.sum())
    with pytest.raises(ValueError, match=r"disagree on the number of chains.*args\[0\] has 4"):
        g(jnp.zeros(4), jnp.zeros((5, 2)))
    with pytest.raises(ValueError, match="is a scalar"):
        g(jnp.zeros(4), jnp.float32(1.0))


def test_chain_mesh_errors():
    with pytest.raises(ValueError, match="num_devices=9 but only 8"):
        cr.chain_mesh(9)
    with pytest.raises(ValueError, match="num_devices must be >= 1"):
        cr.chain_mesh(0)
    with pytest.raises(ValueError, match="not both"):
        cr.chain_mesh(2, devices=jax.devices()[:2])
    assert cr.chain_mesh(devices=jax.devices()[2:5]).shape == {"chain": 3}


def test_request_cpu_devices_fails_loudly_once_up():
    cr.request_cpu_devices(8)  # the count already in force: fine
    with pytest.raises(RuntimeError, match="already initialised with 8"):
        cr.request_cpu_devices(4)


def test_keyword_arguments_map_like_vmap():
    x, b = jnp.arange(9.0).reshape(3, 3), jnp.arange(3.0)
    fn = lambda a, b=1.0: a.sum() * b  # noqa: E731
    g = cr.chain_map(fn, mesh=cr.chain_mesh(2))  # 3 chains on 2 devices: padded
    np.testing.assert_allclose(g(x, b=b), jax.vmap(fn)(x, b=b))
    np.testing.assert_allclose(g(x), jax.vmap(fn)(x))  # the same object, no keyword
    np.testing.assert_allclose(g(x, b=2 * b), jax.vmap(fn)(x, b=2 * b))
    with pytest.raises(ValueError, match=r"leaf \['kwargs'\]\['b'\] is a scalar"):
        g(x, b=1.0)
