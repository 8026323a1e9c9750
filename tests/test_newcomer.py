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


def test_a_wrong_event_size_says_what_one_chain_got():
    nuts = blackjax.nuts(logdensity, 0.5, jnp.ones(3))  # a 3-d mass matrix
    with pytest.raises(TypeError, match="incompatible shapes") as caught:
        cr.run(nuts, jax.random.key(0), jnp.zeros((8, 4)), 20, **KW)  # 4-d positions
    said = notes(caught.value)
    assert "initial_position without its leading chain axis (8 chains)" in said
    assert "shapes (4,)" in said and "mass matrix" in said


def test_a_missing_chain_axis_says_what_one_chain_got():
    nuts = blackjax.nuts(logdensity, 0.5, jnp.ones(3))
    with pytest.raises((TypeError, ValueError)) as caught:
        cr.run(nuts, jax.random.key(0), jnp.zeros(3), 20, **KW)  # one position, no chain axis
    said = notes(caught.value)
    assert "(3 chains), shapes ()" in said and "leading chain axis" in said


def test_chainrunners_own_errors_get_no_note():
    nuts = blackjax.nuts(lambda p: -0.5 * jnp.sum(p["a"] ** 2), 0.8, jnp.ones(2))
    with pytest.raises(ValueError, match="keep names") as caught:
        cr.run(nuts, jax.random.key(0), {"a": jnp.zeros((3, 2))}, 10, keep="b", **KW)
    assert "chainrunner: the kernel got" not in notes(caught.value)


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
