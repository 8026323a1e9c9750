"""numpyro models with chainrunner's adaptations: ``cr.from_numpyro(..., adaptation=...)``.

The model's log density (numpyro's potential energy, Jacobians included) sampled by
blackjax with nutpie's Fisher adaptation, Stan's window, ChEES or pathfinder; starts,
constrained draws and ArviZ data as numpyro's own kernels give them.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from mcse import mcse, mcse_sd
from numpyro.infer import HMC, NUTS
from numpyro.infer.initialization import init_to_mean
from numpyro.infer.util import initialize_model

import chainrunner as cr

# sigma ~ LogNormal(0, 0.5): a constrained site (its Jacobian in the log density);
# x ~ Normal(1, (1, 2, 3)) in a plate; a deterministic site.
SCALES = np.array([1.0, 2.0, 3.0])


def model(scales):
    sigma = numpyro.sample("sigma", dist.LogNormal(0.0, 0.5))
    with numpyro.plate("k", 3):
        x = numpyro.sample("x", dist.Normal(1.0, scales))
    numpyro.deterministic("total", x.sum() + sigma)


def _within(draws, mean, sd, k=5.0):
    """Mean and sd of ``draws`` ``(chain, draw)`` within ``k`` Monte-Carlo errors."""
    draws = np.asarray(draws, dtype=np.float64)
    assert abs(draws.mean() - mean) <= k * mcse(draws), (draws.mean(), mean, mcse(draws))
    assert abs(draws.std(ddof=1) - sd) <= k * mcse_sd(draws), (draws.std(ddof=1), sd)


LOGNORMAL = (np.exp(0.125), np.sqrt((np.exp(0.25) - 1) * np.exp(0.25)))


@pytest.mark.parametrize(
    "adaptation, devices",
    [("fisher_low_rank", 1), ("fisher_low_rank", 2), ("fisher", 8), ("window", 2),
     ("chees", 2), ("pathfinder", 8)],
)  # fmt: skip
def test_known_moments_on_any_mesh(adaptation, devices):
    """5 chains (padding on 2 and 8 devices): moments within 5 MCSE, constrained draws."""
    kernel = cr.from_numpyro(NUTS(model), model_args=(SCALES,), adaptation=adaptation)
    trace = cr.run(kernel, jax.random.key(1), None, 600, num_warmup=400, num_chains=5,
                   mesh=cr.chain_mesh(devices), progress=False, warn=False)  # fmt: skip
    assert set(trace.draws) == {"sigma", "x", "total"}
    assert trace.draws["x"].shape == (5, 600, 3)
    assert (trace.draws["sigma"] > 0).all()
    _within(trace.draws["sigma"], *LOGNORMAL)
    for j in range(3):
        _within(trace.draws["x"][..., j], 1.0, SCALES[j])
    np.testing.assert_allclose(
        trace.draws["total"], trace.draws["x"].sum(-1) + trace.draws["sigma"], rtol=1e-5
    )
    assert trace.attrs["modeling_interface"] == "numpyro"


def test_log_density_is_numpyros_potential():
    """The sampled log density is minus numpyro's own potential (Jacobian included)."""
    adapter = cr.from_numpyro(model, model_args=(SCALES,), adaptation="fisher_low_rank")
    info = initialize_model(jax.random.key(0), model, model_args=(SCALES,))
    for seed in range(3):
        z = {
            "sigma": jax.random.normal(jax.random.key(seed), ()),
            "x": jax.random.normal(jax.random.key(seed + 10), (3,)),
        }
        np.testing.assert_allclose(
            adapter.logdensity_fn(z), -info.potential_fn(z), rtol=1e-6, atol=1e-6
        )


def test_starts_follow_numpyros_init_strategy_and_given_values():
    """The kernel's init strategy starts the chains; given constrained values win."""
    adapter = cr.from_numpyro(
        NUTS(model, init_strategy=init_to_mean), model_args=(SCALES,),
        adaptation="fisher_low_rank",
    )  # fmt: skip
    z = adapter.start(None, jax.random.key(3))
    np.testing.assert_allclose(z["x"], 1.0, rtol=1e-6)  # the prior mean
    z = adapter.start({"sigma": jnp.asarray(2.0)}, jax.random.key(3))
    np.testing.assert_allclose(z["sigma"], np.log(2.0), rtol=1e-6)  # unconstrained
    with pytest.raises(ValueError, match="not latent sample sites"):
        adapter.start({"nope": jnp.asarray(1.0)}, jax.random.key(3))


def test_numpyro_settings_carry_over_or_are_refused():
    """target_accept_prob, max_tree_depth and dense_mass (window) carry over; others fail."""
    a = cr.from_numpyro(
        NUTS(model, target_accept_prob=0.9, max_tree_depth=8), model_args=(SCALES,),
        adaptation="fisher_low_rank",
    )  # fmt: skip
    assert a.sampler.options["target_acceptance_rate"] == 0.9
    assert a.sampler.options["max_num_doublings"] == 8
    w = cr.from_numpyro(NUTS(model, dense_mass=True), model_args=(SCALES,), adaptation="window")
    assert w.sampler.options["is_mass_matrix_diagonal"] is False
    with pytest.raises(ValueError, match=r"NUTS\(step_size=...\) does not apply"):
        cr.from_numpyro(NUTS(model, step_size=0.1), model_args=(SCALES,), adaptation="fisher")
    with pytest.raises(ValueError, match=r"dense_mass=True.*'window' only"):
        cr.from_numpyro(NUTS(model, dense_mass=True), model_args=(SCALES,), adaptation="fisher")
    with pytest.raises(TypeError, match=r"applies to numpyro\.infer\.NUTS"):
        cr.from_numpyro(HMC(model), model_args=(SCALES,), adaptation="fisher")
    with pytest.raises(TypeError, match=r"\['max_rank'\] apply only with adaptation="):
        cr.from_numpyro(NUTS(model), model_args=(SCALES,), max_rank=4)
    with pytest.raises(ValueError, match="data='inputs' does not apply"):
        cr.from_numpyro(model, model_args=(SCALES,), adaptation="fisher", data="inputs")
    with pytest.raises(TypeError, match="unknown option"):
        cr.from_numpyro(model, model_args=(SCALES,), adaptation="fisher", max_depth=3)
    with pytest.raises(TypeError, match="cannot be called with no model_args"):
        cr.from_numpyro(NUTS(model), adaptation="fisher")


def test_discrete_latent_sites_are_refused():
    def mixture():
        z = numpyro.sample("z", dist.Bernoulli(0.3))
        numpyro.sample("x", dist.Normal(z, 1.0))

    with pytest.raises(ValueError, match=r"discrete latent sites \['z'\]"):
        cr.from_numpyro(mixture, adaptation="fisher")


def test_same_model_and_data_reuse_the_programs():
    """A new NUTS object of the same model and data computes the same: no new compile, the
    same draws."""
    a = cr.from_numpyro(NUTS(model), model_args=(SCALES,), adaptation="fisher")
    kw = {"num_warmup": 50, "num_chains": 2, "progress": False, "warn": False}
    first = cr.run(a, jax.random.key(0), None, 50, **kw)
    again = cr.run(cr.from_numpyro(NUTS(model), model_args=(SCALES,), adaptation="fisher"),
                   jax.random.key(0), None, 50, **kw)  # fmt: skip
    assert again.attrs["compile_time"] < 0.5 * first.attrs["compile_time"]
    for site in first.draws:
        assert np.array_equal(first.draws[site], again.draws[site])


def test_arviz_groups_are_numpyros():
    """Plates as dims, observed data and the pointwise log likelihood, as numpyro's own."""

    def regression(x, y=None):
        b = numpyro.sample("b", dist.Normal(0.0, 1.0))
        s = numpyro.sample("s", dist.HalfNormal(1.0))
        with numpyro.plate("obs", x.shape[0]):
            numpyro.sample("y", dist.Normal(b * x, s), obs=y)

    x = np.linspace(-1, 1, 7)
    y = 0.5 * x + 0.1
    kernel = cr.from_numpyro(
        NUTS(regression), model_args=(x,), model_kwargs={"y": y}, log_likelihood=True,
        adaptation="fisher_low_rank",
    )  # fmt: skip
    trace = cr.run(kernel, jax.random.key(0), None, 100, num_warmup=100, num_chains=2,
                   progress=False, warn=False)  # fmt: skip
    idata = trace.to_arviz()
    np.testing.assert_array_equal(np.asarray(idata["observed_data"]["y"]), y)
    assert idata["log_likelihood"]["y"].shape == (2, 100, 7)
    assert "obs" in idata["log_likelihood"]["y"].dims


@pytest.mark.parametrize("adaptation", [None, "window"])
def test_a_start_of_the_wrong_shape_is_named(adaptation):
    kernel = cr.from_numpyro(
        NUTS(model), model_args=(SCALES,), **({"adaptation": adaptation} if adaptation else {})
    )
    start = {"x": jnp.zeros((2, 4))}  # 2 chains of 4 values; the site has 3
    with pytest.raises(ValueError, match=r"initial_position\['x'\] has shape \(4,\) per chain"):
        cr.run(kernel, jax.random.key(0), start, 5, num_warmup=5, progress=False)
