"""ArviZ output under both generations: arviz<1 InferenceData, arviz>=1 DataTree."""

import arviz as az
import blackjax
import jax
import jax.numpy as jnp
import numpy as np

import chainrunner as cr

MAJOR = int(az.__version__.split(".")[0])


def logdensity(p):
    return -0.5 * (jnp.sum(p["theta"] ** 2) + p["mu"] ** 2)


NUTS = blackjax.nuts(logdensity, 0.8, jnp.ones(4))
START = {"theta": jnp.zeros((4, 3)), "mu": jnp.zeros(4)}


def test_type_groups_and_names():
    trace = cr.run(NUTS, jax.random.key(0), START, 30, num_warmup=10, keep_warmup=True,
                   progress=False)  # fmt: skip
    data = trace.to_arviz(coords={"school": ["a", "b", "c"]}, dims={"theta": ["school"]})
    if MAJOR >= 1:
        import xarray as xr

        assert isinstance(data, xr.DataTree)
        groups = set(data.children)
    else:
        assert isinstance(data, az.InferenceData)
        groups = set(data.groups())
    assert {"posterior", "sample_stats", "warmup_posterior", "warmup_sample_stats"} <= groups
    post = data.posterior
    assert post["theta"].dims == ("chain", "draw", "school")
    assert list(post["school"].values) == ["a", "b", "c"]
    assert post["mu"].shape == (4, 30)
    np.testing.assert_array_equal(post["theta"].values, trace.draws["theta"])
    stats = data.sample_stats
    for name in ["diverging", "lp", "acceptance_rate", "energy", "n_steps", "tree_depth"]:
        assert stats[name].shape == (4, 30)
    assert data.warmup_posterior["mu"].shape == (4, 10)
    attrs = post.attrs
    assert attrs["num_chains"] == 4 and attrs["jax_version"] == jax.__version__
    assert "sampling_time" in attrs and "compile_time" in attrs
    az.summary(data)  # ArviZ can work with it


def test_sample_is_run_then_to_arviz():
    data = cr.sample(NUTS, jax.random.key(1), START, 20, progress=False)
    trace = cr.run(NUTS, jax.random.key(1), START, 20, progress=False)
    np.testing.assert_array_equal(data.posterior["mu"].values, trace.draws["mu"])
    assert "warmup_posterior" not in (data.children if MAJOR >= 1 else data.groups())


def test_array_position_named_x():
    nuts = blackjax.nuts(lambda x: -0.5 * jnp.sum(x**2), 0.8, jnp.ones(2))
    data = cr.sample(nuts, jax.random.key(2), jnp.zeros((2, 2)), 5, progress=False)
    assert list(data.posterior.data_vars) == ["x"]
