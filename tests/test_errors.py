"""Bad input meets a clear error before any compilation."""

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chainrunner as cr
from chainrunner.programs import _programs

NUTS = blackjax.nuts(lambda x: -0.5 * jnp.sum(x**2), 0.8, jnp.ones(2))
KEY = jax.random.key(0)
X0 = jnp.zeros((4, 2))


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((NUTS, KEY, X0, 0), {}, ValueError, "num_samples must be >= 1, got 0"),
        ((NUTS, KEY, X0, 10.0), {}, TypeError, "num_samples must be an int"),
        ((NUTS, KEY, X0, True), {}, TypeError, "num_samples must be an int"),
        ((NUTS, KEY, X0, 10), {"num_warmup": -1}, ValueError, "num_warmup must be >= 0"),
        ((NUTS, KEY, X0, 10), {"thinning": 0}, ValueError, "thinning must be >= 1"),
        ((NUTS, KEY, X0, 10), {"thinning": 3}, ValueError, "num_samples=10 is not a multiple"),
        ((NUTS, KEY, X0, 9), {"thinning": 3, "num_warmup": 4}, ValueError, "num_warmup=4"),
        ((NUTS, KEY, X0, 10), {"num_chains": 0}, ValueError, "num_chains must be >= 1"),
        ((NUTS, KEY, X0, 10), {"num_chains": 3}, ValueError, "num_chains=3 but initial_posit"),
        ((NUTS, KEY, X0, 10), {"batch_size": 0}, ValueError, "batch_size must be >= 1"),
        ((NUTS, KEY, X0, 10), {"batch_size": "auto?"}, TypeError, "batch_size must be an int"),
        ((NUTS, KEY, X0, 10), {"chunk_size": -5}, ValueError, "chunk_size must be >= 1, got -5"),
        ((NUTS, KEY, X0, 10), {"mesh": 8}, TypeError, "mesh must be a jax.sharding.Mesh"),
        ((NUTS, KEY, X0, 10), {"progress": "yes"}, TypeError, "progress must be None, True"),
        ((NUTS, 0, X0, 10), {}, TypeError, "rng_key must be a JAX PRNG key"),
        ((NUTS, np.zeros(3), X0, 10), {}, TypeError, "rng_key must be a JAX PRNG key"),
        ((NUTS, jax.random.split(KEY, 2), X0, 10), {}, ValueError, "single key"),
        ((object(), KEY, X0, 10), {}, TypeError, "kernel must be a blackjax SamplingAlgorithm"),
        ((NUTS, KEY, None, 10), {}, ValueError, "initial_position is None"),
        ((NUTS, KEY, jnp.zeros(()), 10), {}, ValueError, "is a scalar"),
        ((NUTS, KEY, jnp.zeros((0, 2)), 10), {}, ValueError, "has 0 chains"),
    ],
)
def test_bad_arguments(args, kwargs, error, match):
    before = dict(_programs.trace_counts)
    with pytest.raises(error, match=match):
        cr.run(*args, **{"progress": False, **kwargs})
    assert _programs.trace_counts == before  # nothing was traced or compiled


def test_leaves_disagree_on_chains():
    nuts = blackjax.nuts(lambda p: -0.5 * (jnp.sum(p["a"] ** 2) + p["b"] ** 2), 0.8, jnp.ones(3))
    with pytest.raises(ValueError, match=r"initial_position\['b'\] has 3"):
        cr.run(nuts, KEY, {"a": jnp.zeros((4, 2)), "b": jnp.zeros(3)}, 10, progress=False)


def test_mesh_without_chain_axis():
    mesh = jax.make_mesh((2,), ("data",), devices=jax.devices()[:2])
    with pytest.raises(ValueError, match="expected an axis named 'chain'"):
        cr.run(NUTS, KEY, X0, 10, mesh=mesh, progress=False)


def test_from_blackjax_rejects_other_objects():
    with pytest.raises(TypeError, match="from_blackjax: algorithm must be a blackjax"):
        cr.from_blackjax(lambda x: x)


def test_adapted_parameters_of_a_kernel_that_adapts_nothing():
    nuts = blackjax.nuts(lambda x: -0.5 * jnp.sum(x**2), 0.5, jnp.ones(2))
    trace = cr.run(nuts, jax.random.key(0), jnp.zeros((2, 2)), 5, progress=False, warn=False)
    assert trace.adapted_parameters is None
    with pytest.raises(ValueError, match="no adapted parameters"):
        cr.adapted_parameters(trace)
