"""numpyro's ensemble samplers (AIES, ESS) over the mesh: moments, layouts, numpyro's draws."""

import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from mcse import mcse
from numpyro.infer import AIES, ESS, MCMC

import chainrunner as cr

KEY = jax.random.key(0)
COV = np.array([[1.0, 0.8, 0.0], [0.8, 1.0, 0.3], [0.0, 0.3, 2.0]])


def gaussian():
    numpyro.sample("x", dist.MultivariateNormal(jnp.zeros(3), jnp.asarray(COV)))


def steps():
    # A non-differentiable likelihood: three times the weight where a coordinate is
    # positive. Each coordinate: mean phi(0) = 0.39894, second moment 1, variance 1 - phi(0)^2.
    x = numpyro.sample("x", dist.Normal(jnp.zeros(2), 1.0).to_event(1))
    numpyro.factor("step", jnp.sum(jnp.where(x > 0, jnp.log(3.0), 0.0)))


TRUE = {  # (mean, variance) per coordinate
    "gaussian": (np.zeros(3), np.diag(COV)),
    "steps": (np.full(2, 0.3989422804014327), np.full(2, 1 - 0.3989422804014327**2)),
}

# Every move numpyro offers, in mixtures (the defaults are checked on their own below).
MIXES = {
    "aies": lambda m: AIES(m, moves={AIES.DEMove(): 0.5, AIES.StretchMove(): 0.5}),
    "ess": lambda m: ESS(
        m,
        moves={
            ESS.DifferentialMove(): 0.4,
            ESS.GaussianMove(): 0.2,
            ESS.KDEMove(): 0.2,
            ESS.RandomMove(): 0.2,
        },
    ),
}


def _run(kernel, walkers=22, draws=600, warmup=200, **kw):
    kw.setdefault("progress", False)
    kw.setdefault("warn", False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # numpyro: "n_chains >= 2 * n_params"
        return cr.run(kernel, KEY, None, draws, num_warmup=warmup, num_chains=walkers, **kw)


def _check_moments(x, mean, var):
    """Per coordinate, the mean and second moment within 4.5 MCSEs.

    Walkers are not independent chains, so the MCSE comes from the ensemble mean over
    walkers at each step, as one chain (emcee's advice: its autocorrelation is what
    sets the error of an ensemble average).
    """
    second = var + mean**2
    for j in range(x.shape[-1]):
        for value, target in ((x[..., j], mean[j]), (x[..., j] ** 2, second[j])):
            series = value.mean(axis=0)[None, :]
            err = mcse(series)
            assert abs(series.mean() - target) < 4.5 * err, (j, series.mean(), target, err)


@pytest.mark.parametrize("name", sorted(MIXES))
def test_moments_and_the_same_draws_on_1_2_and_8_devices(name):
    """22 walkers: padded on 2 and 8 devices; the padding never enters a move."""
    runs = [_run(MIXES[name](gaussian), mesh=cr.chain_mesh(d)) for d in (1, 2, 8)]
    assert [t.attrs["padded_chains"] for t in runs] == [0, 2, 10]  # batches of 2
    _check_moments(runs[0].draws["x"], *TRUE["gaussian"])
    for t in runs[1:]:
        np.testing.assert_array_equal(t.draws["x"], runs[0].draws["x"])
        for stat in runs[0].stats:
            np.testing.assert_array_equal(t.stats[stat], runs[0].stats[stat])


@pytest.mark.parametrize("kernel", [AIES, ESS], ids=["aies", "ess"])
def test_moments_of_a_non_differentiable_likelihood(kernel):
    trace = _run(kernel(steps), walkers=14, draws=800, mesh=cr.chain_mesh(3))
    assert trace.attrs["padded_chains"] == 1
    _check_moments(trace.draws["x"], *TRUE["steps"])


def _numpyro_draws(kernel, walkers, draws, warmup):
    mcmc = MCMC(kernel, num_warmup=warmup, num_samples=draws, num_chains=walkers,
                chain_method="vectorized", progress_bar=False)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        mcmc.run(KEY)
    return np.asarray(mcmc.get_samples(group_by_chain=True)["x"])


@pytest.mark.parametrize(
    "make",
    [lambda: AIES(gaussian), lambda: ESS(gaussian, randomize_split=False)],
    ids=["aies", "ess_fixed_split"],
)
def test_numpyro_vectorized_draws(make):
    """With the walkers in fixed halves, numpyro's own draws, walker for walker."""
    ours = _run(make(), walkers=10, draws=40, warmup=20, mesh=cr.chain_mesh(2))
    np.testing.assert_array_equal(ours.draws["x"], _numpyro_draws(make(), 10, 40, 20))


def test_randomized_split_keeps_walkers_in_their_slots():
    """numpyro leaves ESS's shuffled walkers shuffled; chainrunner puts them back. Same
    ensemble after one step, so the same set of positions."""
    ours = _run(ESS(gaussian), walkers=10, draws=1, warmup=0)
    theirs = _numpyro_draws(ESS(gaussian), 10, 1, 0)
    np.testing.assert_array_equal(
        np.sort(ours.draws["x"][:, 0, 0]), np.sort(theirs[:, 0, 0])
    )  # fmt: skip


def test_batch_size_chunks_thinning_and_continuing():
    k = AIES(gaussian)
    one = _run(k, walkers=12, draws=40, warmup=10, mesh=cr.chain_mesh(2))
    assert one.attrs["batch_size"] == 1  # auto: ceil(6 / 8)
    wide = _run(k, walkers=12, draws=40, warmup=10, mesh=cr.chain_mesh(2), batch_size=None)
    np.testing.assert_allclose(wide.draws["x"], one.draws["x"], atol=1e-5)
    chunked = _run(k, walkers=12, draws=40, warmup=10, mesh=cr.chain_mesh(2), chunk_size=7)
    np.testing.assert_array_equal(chunked.draws["x"], one.draws["x"])
    thinned = _run(k, walkers=12, draws=40, warmup=10, mesh=cr.chain_mesh(2), thinning=2)
    np.testing.assert_array_equal(thinned.draws["x"], one.draws["x"][:, 1::2])
    first = _run(k, walkers=12, draws=25, warmup=10, mesh=cr.chain_mesh(2))
    more = cr.run(k, KEY, first, 15, mesh=cr.chain_mesh(2), progress=False, warn=False)
    np.testing.assert_array_equal(
        np.concatenate([first.draws["x"], more.draws["x"]], axis=1), one.draws["x"]
    )


def test_checkpoint_and_keep_warmup(tmp_path):
    k = ESS(gaussian)
    plain = _run(k, walkers=8, draws=20, warmup=6, keep_warmup=True, chunk_size=5)
    folder = os.fspath(tmp_path / "ckpt")
    saved = _run(k, walkers=8, draws=20, warmup=6, keep_warmup=True, checkpoint=folder,
                 chunk_size=5)  # fmt: skip
    again = _run(k, walkers=8, draws=20, warmup=6, keep_warmup=True, checkpoint=folder,
                 chunk_size=5)  # fmt: skip
    assert again.attrs["resumed_from_draw"] == 20  # the posterior's draws
    assert again.attrs["resumed_from_step"] == 26  # the loop's, warmup included
    for t in (saved, again):
        np.testing.assert_array_equal(t.draws["x"], plain.draws["x"])
        np.testing.assert_array_equal(t.warmup_draws["x"], plain.warmup_draws["x"])
    assert plain.warmup_draws["x"].shape == (8, 6, 3)
    assert set(plain.stats) == {"mu"}


def test_initial_positions_potential_fn_and_arviz():
    # A model started from constrained values
    start = {"x": jax.random.normal(jax.random.key(1), (8, 3))}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        t = cr.run(AIES(gaussian), KEY, start, 5, progress=False, warn=False)
        assert t.draws["x"].shape == (8, 5, 3)
        # A potential function, started from unconstrained values
        k = AIES(potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2))
        t = cr.run(k, KEY, start, 5, progress=False, warn=False)
        assert t.draws["x"].shape == (8, 5, 3)
        data = cr.sample(AIES(gaussian), KEY, None, 30, num_chains=8, progress=False)
    assert data.posterior["x"].shape == (8, 30, 3)
    assert "acceptance_rate" in data.sample_stats


def test_bad_input():
    with pytest.raises(ValueError, match="even number of walkers"):
        _run(AIES(gaussian), walkers=7, draws=5)
    with pytest.raises(ValueError, match="superchains"):
        _run(AIES(gaussian), walkers=8, draws=5, superchains=2)
    with pytest.raises(ValueError, match="reinit"):
        _run(AIES(gaussian), walkers=8, draws=5, on_bad_init="reinit")
    with pytest.raises(ValueError, match=r"keep names \['nope'\]"):
        _run(AIES(gaussian), walkers=8, draws=5, keep=["nope"])
    with pytest.raises(ValueError, match="needs initial positions"):
        _run(AIES(potential_fn=lambda z: jnp.sum(z**2)), walkers=8, draws=5)
