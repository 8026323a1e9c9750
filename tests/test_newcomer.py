"""What a new user hit (issue 35): shape mistakes, missing data, a silent no-op, a long repr.

Each case is written as the user wrote it, and each failed before the fix: a JAX error from
deep inside the kernel with no word of ``initial_position``, numpyro's "missing 1 required
positional argument", sampling at step size 1.0, a ``repr`` of 10,884 characters.
"""

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import NUTS

import chainrunner as cr
from chainrunner.programs import _programs

KW = {"progress": False, "warn": False}


def logdensity(x):
    return -0.5 * jnp.sum(x**2)


def notes(error):
    return "\n".join(getattr(error, "__notes__", []))


def test_a_mass_matrix_of_another_size_says_so_and_not_the_chain_axis():
    nuts = blackjax.nuts(logdensity, 0.5, jnp.ones(3))  # a 3-d mass matrix
    with pytest.raises(ValueError, match=r"inverse_mass_matrix \(it needs 4 entries") as caught:
        cr.run(nuts, jax.random.key(0), jnp.zeros((8, 4)), 20, **KW)  # 4-d positions
    assert "shapes (4,)" in str(caught.value)
    assert "chain axis" not in str(caught.value) + notes(caught.value)


def test_a_missing_chain_axis_is_named_where_it_is_missing():
    nuts = blackjax.nuts(logdensity, 0.5, jnp.ones(3))
    with pytest.raises(ValueError, match=r"initial_position has no leading chain axis.*\(3,\)"):
        cr.run(nuts, jax.random.key(0), jnp.zeros(3), 20, **KW)  # one position, no chain axis


def test_a_log_density_of_a_vector_says_it_must_be_a_scalar():
    nuts = blackjax.nuts(lambda x: -0.5 * x**2, 0.5, jnp.ones(3))  # no sum
    with pytest.raises(ValueError, match=r"log density's value is not a scalar.*jnp\.sum") as e:
        cr.run(nuts, jax.random.key(0), jnp.zeros((4, 3)), 20, **KW)
    assert "chain axis" not in str(e.value) + notes(e.value)


def test_float32_positions_for_a_float64_kernel_name_both_dtypes():
    """A kernel built under x64 (a float64 mass matrix), run on float32 positions: a
    TypeError naming both precisions and what to do, not the chain axis."""
    with jax.enable_x64(True):
        nuts = blackjax.nuts(logdensity, 0.5, jnp.ones(3))
        start = jnp.zeros((4, 3), jnp.float32)
        with pytest.raises(TypeError, match=r"mixes float32 and float64.*is float32") as e:
            cr.run(nuts, jax.random.key(0), start, 20, **KW)
    assert "chain axis" not in str(e.value) + notes(e.value)


def test_states_from_the_pmap_recipe_start_the_chains_as_they_are():
    """jax.vmap(nuts.init)(positions) as the start: the same draws as from the positions
    (nuts.init is what run does with them); a vmapped window_adaptation's states too."""
    nuts = blackjax.nuts(logdensity, 0.5, jnp.ones(3))
    positions = jax.random.normal(jax.random.key(1), (5, 3))
    from_positions = cr.run(nuts, jax.random.key(0), positions, 30, **KW)
    from_states = cr.run(nuts, jax.random.key(0), jax.vmap(nuts.init)(positions), 30, **KW)
    np.testing.assert_array_equal(from_states.draws, from_positions.draws)
    warmup = blackjax.window_adaptation(blackjax.nuts, logdensity)
    (states, params), _ = jax.vmap(lambda k, x: warmup.run(k, x, num_steps=50))(
        jax.random.split(jax.random.key(2), 5), positions
    )
    tuned = blackjax.nuts(logdensity, **jax.tree.map(lambda p: p[0], params))
    trace = cr.run(tuned, jax.random.key(0), states, 30, **KW)
    again = cr.run(tuned, jax.random.key(0), states.position, 30, **KW)
    assert trace.draws.shape == (5, 30, 3)
    np.testing.assert_allclose(trace.draws, again.draws, rtol=1e-5, atol=1e-6)


def test_another_kernels_states_say_to_pass_their_positions():
    nuts = blackjax.nuts(logdensity, 0.5, jnp.ones(3))
    states = jax.vmap(nuts.init)(jnp.zeros((4, 3)))
    adapted = cr.from_blackjax(blackjax.nuts, logdensity_fn=logdensity, adaptation="window")
    with pytest.raises(ValueError, match=r"initial_position is a HMCState.*states\.position"):
        cr.run(adapted, jax.random.key(0), states, 20, num_warmup=20, **KW)
    trace = cr.run(adapted, jax.random.key(0), states.position, 20, num_warmup=20, **KW)
    assert trace.draws.shape == (4, 20, 3)


def test_chainrunners_own_errors_get_no_note():
    nuts = blackjax.nuts(lambda p: -0.5 * jnp.sum(p["a"] ** 2), 0.8, jnp.ones(2))
    with pytest.raises(ValueError, match="keep names") as caught:
        cr.run(nuts, jax.random.key(0), {"a": jnp.zeros((3, 2))}, 10, keep="b", **KW)
    assert "chainrunner: the kernel ran" not in notes(caught.value)


def model(y, sigma=1.0):
    mu = numpyro.sample("mu", dist.Normal())
    numpyro.sample("y", dist.Normal(mu, sigma), obs=y)


def test_a_numpyro_model_without_its_data_points_at_model_args():
    before = dict(_programs.trace_counts)
    with pytest.raises(TypeError, match=r"model\(y, sigma=1.0\).*missing a required argument: 'y'"):
        cr.run(NUTS(model), jax.random.key(0), None, 20, num_chains=2, num_warmup=20, **KW)
    with pytest.raises(TypeError, match=r"cr.from_numpyro\(NUTS\(model\), model_args="):
        cr.from_numpyro(NUTS(model), model_kwargs={"sigma": 2.0})
    assert _programs.trace_counts == before  # before anything was traced
    kernel = cr.from_numpyro(NUTS(model), model_args=(np.ones(3),))
    trace = cr.run(kernel, jax.random.key(0), None, 20, num_chains=2, num_warmup=20, **KW)
    assert trace.draws["mu"].shape == (2, 20)


def test_window_adaptation_without_warmup_is_an_error_not_step_size_one():
    nuts = cr.from_blackjax(blackjax.nuts, logdensity_fn=logdensity, adaptation="window")
    with pytest.raises(ValueError, match=r"num_warmup=0, but this kernel adapts .* num_warmup > 0"):
        cr.run(nuts, jax.random.key(0), jnp.zeros((4, 2)), 20, **KW)
    trace = cr.run(nuts, jax.random.key(0), jnp.zeros((4, 2)), 20, num_warmup=30, **KW)
    more = cr.run(nuts, jax.random.key(0), trace, 10, **KW)  # continuing needs no warmup
    assert more.num_steps == 60


def test_repr_is_a_few_lines():
    nuts = blackjax.nuts(logdensity, 0.5, jnp.ones(10))
    trace = cr.run(nuts, jax.random.key(0), jnp.zeros((8, 10)), 1000, **KW)
    text = repr(trace)
    assert len(text) < 600 and text.count("\n") < 10, text
    assert text.startswith("Trace: 8 chains x 1000 draws (1000 steps per chain)")
    assert "x (10,)" in text and "diverging" in text and "batch_size=" in text


def test_chain_map_takes_one_device_per_chain_up_to_all():
    out = cr.chain_map(lambda x: x.sum())(jnp.ones((4, 3)))
    assert len(out.sharding.device_set) == 4  # 4 chains on 8 devices: none padded
    many = cr.chain_map(lambda x: x.sum())(jnp.ones((20, 3)))
    assert many.shape == (20,) and len(many.sharding.device_set) == 8  # all 8 devices


def test_numpyros_mcmc_with_chain_map_as_its_chain_method():
    mcmc = numpyro.infer.MCMC(
        NUTS(model), num_warmup=50, num_samples=50, num_chains=4,
        chain_method=cr.chain_map, progress_bar=False,
    )  # fmt: skip
    mcmc.run(jax.random.key(0), np.ones(3))
    mu = mcmc.get_samples(group_by_chain=True)["mu"]
    assert mu.shape == (4, 50) and len(mu.sharding.device_set) == 4
    assert np.isfinite(np.asarray(mu)).all() and np.asarray(mu).std() > 0
