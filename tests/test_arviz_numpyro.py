"""ArviZ data of numpyro models as ArviZ's own numpyro converter makes it: plates are dims."""

import arviz as az
import jax
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC, NUTS, Predictive

import chainrunner as cr

Y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
SIGMA = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])
SCHOOLS = list("ABCDEFGH")


def eight_schools(J, sigma, y=None):
    mu = numpyro.sample("mu", dist.Normal(0, 5))
    tau = numpyro.sample("tau", dist.HalfCauchy(5))
    with numpyro.plate("school", J):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.deterministic("theta_shift", theta - mu)
        numpyro.sample("obs", dist.Normal(theta, sigma), obs=y)


def _groups(data):
    names = data.children if az.__version__.split(".")[0] >= "1" else data.groups()
    return {g for g in names if not g.startswith("warmup")}


def _group(data, name):
    return data[name] if az.__version__.split(".")[0] >= "1" else getattr(data, name)


@pytest.fixture(scope="module")
def both():
    args = (8, SIGMA, Y)
    mcmc = MCMC(NUTS(eight_schools), num_warmup=100, num_samples=100, num_chains=2,
                chain_method="vectorized", progress_bar=False)  # fmt: skip
    mcmc.run(jax.random.PRNGKey(0), *args)
    theirs = az.from_numpyro(mcmc, coords={"school": SCHOOLS}, log_likelihood=False)
    kernel = cr.from_numpyro(NUTS(eight_schools), model_args=args)
    trace = cr.run(kernel, jax.random.key(0), None, 100, num_warmup=100, num_chains=2,
                   progress=False, warn=False)  # fmt: skip
    return trace, trace.to_arviz(coords={"school": SCHOOLS}), theirs


def test_groups_dims_and_coords_equal_arviz_from_numpyro(both):
    trace, ours, theirs = both
    assert trace.dims == {"theta": ["school"], "theta_shift": ["school"], "obs": ["school"]}
    assert _groups(ours) == _groups(theirs)
    for group in ("posterior", "observed_data"):
        a, b = _group(ours, group), _group(theirs, group)
        assert set(a.data_vars) == set(b.data_vars), group
        for name in b.data_vars:
            assert a[name].dims == b[name].dims, (group, name)
        assert list(a["school"].values) == list(b["school"].values) == SCHOOLS
    stats = set(_group(ours, "sample_stats").data_vars)
    assert set(_group(theirs, "sample_stats").data_vars) <= stats | {"lp"}
    assert "reached_max_tree_depth" in stats and trace.stats["reached_max_tree_depth"].dtype == bool
    post, obs = _group(ours, "posterior"), _group(ours, "observed_data")
    assert (post["theta"] - obs["obs"]).shape == (2, 100, 8)  # one axis, not an outer product
    attrs = post.attrs
    assert attrs["inference_library"] == "numpyro"
    assert attrs["inference_library_version"] == numpyro.__version__


def test_predictive_and_user_groups(both):
    trace, _, _ = both
    predictive = Predictive(eight_schools, posterior_samples=trace.draws, batch_ndims=2)
    ppc = predictive(jax.random.PRNGKey(1), 8, SIGMA)
    data = trace.to_arviz(
        coords={"school": SCHOOLS},
        posterior_predictive={"obs": ppc["obs"]},
        constant_data={"sigma": SIGMA},
        dims={"sigma": ["school"]},
    )
    pp = _group(data, "posterior_predictive")
    assert pp["obs"].dims == ("chain", "draw", "school")
    assert _group(data, "constant_data")["sigma"].dims == ("school",)
    with pytest.raises(TypeError, match="posterior_predictive must be a dict"):
        trace.to_arviz(posterior_predictive=[1, 2])
