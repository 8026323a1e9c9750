"""The blackjax multiple-chains pmap recipe and chain_map give the same draws."""

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chainrunner as cr


def logdensity(x):
    return -0.5 * jnp.sum(x**2) - 0.1 * jnp.sum(x**4)


def inference_loop(rng_key, kernel, initial_state, num_samples):
    """The loop from the blackjax docs' multiple-chains recipe."""

    @jax.jit
    def one_step(state, rng_key):
        state, _ = kernel(rng_key, state)
        return state, state

    keys = jax.random.split(rng_key, num_samples)
    _, states = jax.lax.scan(one_step, initial_state, keys)
    return states


@pytest.mark.parametrize("batch_size", [None, 1])
def test_pmap_recipe_equals_chain_map(batch_size):
    num_chains, num_samples = 8, 50
    nuts = blackjax.nuts(logdensity, 0.7, jnp.ones(2))
    positions = jax.random.normal(jax.random.key(0), (num_chains, 2))
    states = jax.vmap(nuts.init)(positions)
    keys = jax.random.split(jax.random.key(1), num_chains)

    # The recipe: one chain per device, kernel and length as static broadcast args.
    pmapped = jax.pmap(
        inference_loop, in_axes=(0, None, 0, None), static_broadcasted_argnums=(1, 3)
    )
    expected = pmapped(keys, nuts.step, states, num_samples)

    # chain_map: the kernel and length are closed over; any chain count works.
    loop = cr.chain_map(
        lambda key, state: inference_loop(key, nuts.step, state, num_samples),
        mesh=cr.chain_mesh(8),
        batch_size=batch_size,
    )
    got = loop(keys, states)
    np.testing.assert_allclose(got.position, expected.position, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got.position[:, 0], expected.position[:, 0])
