"""PyMC models through cr.from_pymc: posteriors, initial points and ArviZ data as pm.sample's.

Posterior means are checked against posteriordb's reference (eight schools) or against
``pm.sample(nuts_sampler="numpyro")`` on the same model, with tolerances from the
Monte-Carlo standard errors of both. Runs on both PyMC generations (PyMC 5 with arviz 0.x,
PyMC 6 with arviz 1.x).
"""

import json
import os
import subprocess
import sys
import warnings

import arviz as az
import blackjax
import jax
import jax.numpy as jnp
import numpy as np
import pymc as pm  # nox -s tests installs chainrunner[pymc]: never skipped
import pytest
from mcse import mcse

import chainrunner as cr

HERE = os.path.dirname(__file__)
DB = os.path.join(HERE, "..", "data", "posteriordb")
Y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
SIGMA = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])
SCHOOLS = list("ABCDEFGH")
ARVIZ_1 = int(az.__version__.split(".")[0]) >= 1


@pytest.fixture(autouse=True)
def _x64_as_before():
    """Every test leaves the process's jax_enable_x64 as it found it: chainrunner runs a
    PyMC model under JAX's scoped setting (PyTensor's import turns it on: put back)."""
    before = jax.config.jax_enable_x64
    yield
    assert jax.config.jax_enable_x64 == before


FLOAT32_BUILD = """
import blackjax, jax, jax.numpy as jnp, numpy as np
import chainrunner as cr
nuts = blackjax.nuts(lambda x: -0.5 * jnp.sum((x - 1.0) ** 2), 0.5, jnp.ones(3))
"""
FLOAT32_RUN = """
trace = cr.run(nuts, jax.random.key(3), jnp.zeros((2, 3)), 30, progress=False, warn=False)
"""


def test_a_pymc_run_leaves_a_float32_kernel_as_in_a_fresh_process(tmp_path):
    """64 bits for the PyMC model's calls only: a float32 blackjax kernel run before and
    after them (the same kernel object, built before) gives the draws of a process that
    never imported PyMC, in float32."""
    out = tmp_path / "fresh.npy"
    script = FLOAT32_BUILD + FLOAT32_RUN + f"np.save({str(out)!r}, trace.draws)"
    subprocess.run([sys.executable, "-c", script], check=True,
                   env={**os.environ, "JAX_NUM_CPU_DEVICES": "2"})  # fmt: skip
    fresh, names = np.load(out), {}
    exec(FLOAT32_BUILD + FLOAT32_RUN, names)
    before = names["trace"].draws
    with pm.Model() as model:
        pm.Normal("x", 0.0, 1.0)
    kernel = cr.from_pymc(model)
    assert not jax.config.jax_enable_x64 and kernel.x64
    trace = cr.run(kernel, jax.random.key(0), None, 20, num_warmup=20, num_chains=2,
                   progress=False, warn=False)  # fmt: skip
    assert trace.draws["x"].dtype == np.float64 and not jax.config.jax_enable_x64
    with pytest.raises(TypeError, match=r"must be a pymc\.Model"):
        cr.from_pymc("not a model")
    assert not jax.config.jax_enable_x64
    exec(FLOAT32_RUN, names)
    after = names["trace"].draws
    assert before.dtype == after.dtype == np.float32
    assert np.array_equal(before, fresh) and np.array_equal(after, fresh)


def eight_schools():
    """posteriordb's eight_schools_noncentered, with coords and the sigmas as pm.Data."""
    with pm.Model(coords={"school": SCHOOLS}) as model:
        sigma = pm.Data("sigma", SIGMA, dims="school")
        mu = pm.Normal("mu", 0.0, 5.0)
        tau = pm.HalfCauchy("tau", 5.0)
        theta_trans = pm.Normal("theta_trans", 0.0, 1.0, dims="school")
        theta = pm.Deterministic("theta", mu + tau * theta_trans, dims="school")
        pm.Normal("obs", theta, sigma=sigma, observed=Y, dims="school")
    return model


def hierarchical_linear():
    """Varying intercepts, a common slope; predictor and group index as pm.Data."""
    rng = np.random.default_rng(1)
    n, groups = 40, ["north", "south", "east", "west"]
    idx = rng.integers(0, len(groups), n)
    x = rng.normal(size=n)
    y = np.array([1.0, -0.5, 0.3, 2.0])[idx] + 0.7 * x + rng.normal(0.0, 0.5, n)
    with pm.Model(coords={"group": groups, "obs_id": range(n)}) as model:
        x_data = pm.Data("x", x, dims="obs_id")
        group_idx = pm.Data("group_idx", idx, dims="obs_id")
        mu_a = pm.Normal("mu_a", 0.0, 5.0)
        sigma_a = pm.HalfNormal("sigma_a", 2.0)
        z = pm.Normal("z", 0.0, 1.0, dims="group")
        a = pm.Deterministic("a", mu_a + sigma_a * z, dims="group")
        b = pm.Normal("b", 0.0, 2.0)
        sigma = pm.HalfNormal("sigma", 2.0)
        mu = pm.Deterministic("mu", a[group_idx] + b * x_data, dims="obs_id")
        pm.Normal("y", mu, sigma, observed=y, dims="obs_id")
    return model


def bounded_and_simplex():
    """A Beta, a Uniform and a Dirichlet variable (logit, interval and simplex transforms)."""
    with pm.Model(coords={"category": ["a", "b", "c"]}) as model:
        p = pm.Beta("p", 2.0, 2.0)
        s = pm.Uniform("s", 0.0, 10.0)
        w = pm.Dirichlet("w", np.ones(3), dims="category")
        pm.Binomial("k", n=20, p=p, observed=7)
        pm.Normal("y", 1.0, s, observed=np.array([0.2, 2.5, 1.1, -0.8, 3.0]))
        pm.Multinomial("counts", n=30, p=w, observed=np.array([5, 10, 15]), dims="category")
    return model


def reference(model, draws=500, chains=4, seed=1, **kwargs):
    """``pm.sample(nuts_sampler="numpyro")``: the reference ArviZ data (with x64 on, as
    PyTensor's import would have left it: chainrunner put the process's setting back)."""
    with warnings.catch_warnings(), jax.enable_x64(True):
        # PyMC 6 deprecates idata_kwargs={"log_likelihood": True} for compute_log_likelihood.
        warnings.simplefilter("ignore", FutureWarning)
        return pm.sample(
            draws=draws,
            tune=draws,
            chains=chains,
            nuts_sampler="numpyro",
            model=model,
            random_seed=seed,
            progressbar=False,
            compute_convergence_checks=False,
            **kwargs,
        )


def group(data, name):
    return data[name] if ARVIZ_1 else getattr(data, name)


def groups(data):
    return set(data.children if ARVIZ_1 else data.groups())


def flat(values):
    """``{label: (chain, draw) array}`` for each scalar component of each variable."""
    out = {}
    for name, x in values.items():
        x = np.asarray(x, dtype=np.float64)
        parts = x.reshape((*x.shape[:2], -1))
        for j in range(parts.shape[-1]):
            out[name if x.ndim == 2 else f"{name}[{j + 1}]"] = parts[..., j]
    return out


def mean_mismatches(ours, theirs, k=4.5):
    """Components whose means differ by more than ``k`` joint Monte-Carlo standard errors."""
    bad = []
    for label, x in flat(ours).items():
        y = theirs[label]
        tol = k * np.hypot(mcse(x), mcse(y))
        if abs(x.mean() - y.mean()) > tol:
            bad.append(f"{label}: {x.mean():.4g} vs {y.mean():.4g} (tol {tol:.3g})")
    return bad


def run(model, seed=0, draws=500, chains=8, **options):
    kernel = cr.from_pymc(model, **options)
    return cr.run(kernel, jax.random.key(seed), None, draws, num_warmup=draws,
                  num_chains=chains, progress=False, warn=False)  # fmt: skip


def test_eight_schools_matches_posteriordb_reference():
    trace = run(eight_schools(), target_acceptance_rate=0.9)
    with open(os.path.join(DB, "reference", "eight_schools-eight_schools_noncentered.json")) as f:
        ref = json.load(f)["params"]
    failures = []
    for label, x in flat({k: trace.draws[k] for k in ("mu", "tau", "theta")}).items():
        r = ref[label]
        tol = 4.5 * np.hypot(mcse(x), r["mcse_mean"])
        if abs(x.mean() - r["mean"]) > tol:
            failures.append(f"{label}: {x.mean():.4g} vs {r['mean']:.4g} (tol {tol:.3g})")
        if abs(x.std(ddof=1) - r["sd"]) > 0.15 * r["sd"]:
            failures.append(f"{label}: sd {x.std(ddof=1):.4g} vs {r['sd']:.4g}")
    assert not failures, failures
    assert trace.draws["theta"].shape == (8, 500, 8)
    assert "theta_trans_log__" not in trace.draws and trace.draws["tau"].min() > 0


def structure(data):
    """``{group: {variable: (dims, {dim: coordinate values})}}`` of the ArviZ data."""
    out = {}
    for name in groups(data):
        ds = group(data, name)
        out[name] = {
            var: (ds[var].dims, {d: list(np.asarray(ds[d].values)) for d in ds[var].dims})
            for var in ds.data_vars
        }
    return out


def test_arviz_data_matches_pm_sample_numpyro():
    model = eight_schools()
    ours = cr.sample(cr.from_pymc(model, log_likelihood=True), jax.random.key(0), None, 200,
                     num_warmup=200, num_chains=4, progress=False, warn=False)  # fmt: skip
    theirs = reference(model, draws=200, idata_kwargs={"log_likelihood": True})
    a, b = structure(ours), structure(theirs)
    assert set(a) == set(b) == {
        "posterior", "sample_stats", "log_likelihood", "observed_data", "constant_data",
    }  # fmt: skip
    for name in ("posterior", "log_likelihood", "observed_data", "constant_data"):
        assert a[name] == b[name], name
    assert set(a["posterior"]) == {"mu", "tau", "theta_trans", "theta"}
    assert a["posterior"]["theta"][1]["school"] == SCHOOLS
    # pm.sample's stats, in the same ArviZ names (chainrunner has them all).
    assert set(b["sample_stats"]) <= set(a["sample_stats"])
    for name in b["sample_stats"]:
        assert group(ours, "sample_stats")[name].dims == ("chain", "draw"), name
    # The pointwise log likelihood is the normal density of each school's observation.
    theta = np.asarray(group(ours, "posterior")["theta"])
    expected = -0.5 * ((Y - theta) / SIGMA) ** 2 - np.log(SIGMA * np.sqrt(2 * np.pi))
    np.testing.assert_allclose(group(ours, "log_likelihood")["obs"], expected, rtol=1e-10)
    np.testing.assert_array_equal(group(ours, "constant_data")["sigma"], SIGMA)
    # attrs as PyMC writes them: the run's on the draws' groups, with tuning_steps (as
    # pm.sample's posterior); PyMC's library on the model's data (PyMC's own sampler
    # writes "pymc" there), and none of the run's attrs there.
    assert group(theirs, "posterior").attrs["tuning_steps"] == 200
    for name in ("posterior", "sample_stats"):
        attrs = group(ours, name).attrs
        assert attrs["tuning_steps"] == 200 and "compile_time" in attrs
        assert attrs["inference_library"] == "blackjax"
    for name in ("observed_data", "constant_data"):
        attrs = group(ours, name).attrs
        assert attrs["inference_library"] == "pymc"
        assert attrs["inference_library_version"] == pm.__version__
        assert not {"compile_time", "num_chains", "seed"} & set(attrs), name


def test_pymc_md_names_the_stats_of_pymcs_own_nuts_that_chainrunner_has_not():
    """pymc.md's list: PyMC's NUTS stats, in the names its ArviZ conversion gives them,
    less chainrunner's sample_stats."""
    import re

    renamed = {"model_logp": "lp", "mean_tree_accept": "acceptance_rate",
               "depth": "tree_depth", "tree_size": "n_steps"}  # fmt: skip
    pymcs = {renamed.get(k, k) for k in pm.NUTS.stats_dtypes_shapes} - {"warning"}
    model, _ = conjugate()
    ours = cr.run(cr.from_pymc(model), jax.random.key(0), None, 5, num_warmup=5,
                  num_chains=2, progress=False, warn=False).stats  # fmt: skip
    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "pymc.md")) as f:
        page = " ".join(f.read().split())
    said = re.search(r"writes (\d+) more, which chainrunner has not: (.*?)\.", page)
    listed = set(re.findall(r"`(\w+)`", said.group(2)))
    assert listed == pymcs - set(ours) and int(said.group(1)) == len(listed), listed


def test_pymc_md_is_right_about_waic():
    """pymc.md: log_likelihood for az.loo, and az.waic on arviz < 1 only."""
    assert hasattr(az, "loo") and hasattr(az, "waic") == (not ARVIZ_1)


@pytest.mark.parametrize("make", [hierarchical_linear, bounded_and_simplex])
def test_posterior_means_match_pm_sample(make):
    """Posterior means within Monte-Carlo error of ``pm.sample``'s. The varying intercepts
    of four groups make a funnel that diverges at the default acceptance rate (0.8), with
    nutpie too (8 chains x (500 + 500), seeds 0 and 1: 14-135 divergences with its
    diagonal metric, 146-257 with its low-rank one; chainrunner's default 45-308), and
    divergent runs can miss ``sigma_a``'s tail: both sample at 0.95 (chainrunner: 4-28
    divergences), as a PyMC user told of divergences would."""
    model = make()
    accept = {"target_acceptance_rate": 0.95} if make is hierarchical_linear else {}
    trace = run(model, **accept)
    theirs = flat(reference(model, target_accept=0.95 if accept else 0.8).posterior.data_vars)
    assert set(flat(trace.draws)) == set(theirs)
    assert not mean_mismatches(trace.draws, theirs)
    d = trace.draws
    if make is bounded_and_simplex:
        assert 0 < d["p"].min() and d["p"].max() < 1 and 0 < d["s"].min() and d["s"].max() < 10
        np.testing.assert_allclose(d["w"].sum(-1), 1.0, rtol=1e-12)
        return
    data = trace.to_arviz()  # pm.Data as constant_data, with the model's dims and coords
    constant = group(data, "constant_data")
    assert set(constant.data_vars) == {"x", "group_idx"}
    assert constant["x"].dims == ("obs_id",) and constant["group_idx"].dims == ("obs_id",)
    assert group(data, "posterior")["a"].dims == ("chain", "draw", "group")
    assert list(group(data, "posterior")["group"].values) == ["north", "south", "east", "west"]


def test_initial_points_are_pymc_jittered_reproducible_and_retried():
    import pytensor.tensor as pt

    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 1.0)
        pm.HalfNormal("sigma", 1.0)
        # Half of PyMC's jittered starts (mu ~ U(-1, 1)) have log density -inf: retried.
        pm.Potential("wall", pt.switch(mu > 0.0, -np.inf, 0.0))
    keys = jax.random.split(jax.random.key(0), 64)
    with jax.enable_x64(True):  # run's scope for a PyMC kernel, whose functions run here
        retried = jax.vmap(cr.from_pymc(model).compiled.initial_point)(keys)
        once = jax.vmap(cr.from_pymc(model, jitter_max_retries=0).compiled.initial_point)(keys)
        assert float(retried["mu"].max()) <= 0.0 < float(once["mu"].max())
        # support point + U(-1, 1) in the unconstrained space: HalfNormal's is log(1) = 0.
        assert -1 <= float(once["mu"].min()) and float(once["mu"].max()) <= 1
        assert -1 <= float(once["sigma_log__"].min()) and float(once["sigma_log__"].max()) <= 1
        again = jax.vmap(cr.from_pymc(model).compiled.initial_point)(keys)
        np.testing.assert_array_equal(retried["mu"], again["mu"])
        fixed = jax.vmap(cr.from_pymc(model, jitter=False).compiled.initial_point)(keys)
    np.testing.assert_array_equal(fixed["mu"], 0.0)


def test_same_seed_same_draws_and_initial_position_in_value_space():
    model = bounded_and_simplex()
    kernel = cr.from_pymc(model)
    first = cr.run(kernel, jax.random.key(3), None, 20, num_warmup=20, num_chains=4,
                   progress=False, warn=False)  # fmt: skip
    again = cr.run(model, jax.random.key(3), None, 20, num_warmup=20, num_chains=4,
                   progress=False, warn=False)  # fmt: skip
    np.testing.assert_array_equal(first.draws["w"], again.draws["w"])
    start = {"p_logodds__": jnp.zeros(4), "s_interval__": jnp.zeros(4),
             "w_simplex__": jnp.zeros((4, 2))}  # fmt: skip
    trace = cr.run(kernel, jax.random.key(3), start, 20, num_warmup=20, progress=False, warn=False)
    assert sorted(trace.draws) == ["p", "s", "w"]
    with pytest.raises(ValueError, match=r"value variable.*p_logodds__"):
        cr.run(kernel, jax.random.key(3), {"p": jnp.full(4, 0.5)}, 20, num_warmup=20)


def test_a_new_model_of_the_same_model_compiles_nothing():
    """A notebook cell that builds the pm.Model again and samples it: no program compiled
    again, the same draws (programs are found by what they compute); other data, coords
    or priors: other programs."""
    from chainrunner.programs import _compile

    kw = {"num_warmup": 20, "num_chains": 2, "progress": False, "warn": False}
    one = cr.run(cr.from_pymc(eight_schools()), jax.random.key(0), None, 20, **kw)
    before = dict(_compile.compile_counts)
    two = cr.run(cr.from_pymc(eight_schools()), jax.random.key(0), None, 20, **kw)
    assert _compile.compile_counts == before
    np.testing.assert_array_equal(one.draws["mu"], two.draws["mu"])
    with pm.Model(coords={"school": SCHOOLS}) as other_prior:
        sigma = pm.Data("sigma", SIGMA, dims="school")
        mu = pm.Normal("mu", 0.0, 4.0)
        tau = pm.HalfCauchy("tau", 5.0)
        theta_trans = pm.Normal("theta_trans", 0.0, 1.0, dims="school")
        theta = pm.Deterministic("theta", mu + tau * theta_trans, dims="school")
        pm.Normal("obs", theta, sigma=sigma, observed=Y, dims="school")
    three = cr.run(cr.from_pymc(other_prior), jax.random.key(0), None, 20, **kw)
    assert _compile.compile_counts["chunk"] > before["chunk"]
    assert not np.array_equal(one.draws["mu"], three.draws["mu"])


def test_pytensors_blas_flag_is_not_probed_and_stays_unset(monkeypatch):
    """PyTensor finds ``blas__ldflags``'s default by compiling C test programs (0.3 s):
    ``from_pymc`` and a run (initial points, constrained draws) never ask for it, and leave
    it unset for PyTensor's C backend; a flag already set is read as it is."""
    import pytensor

    from chainrunner.adapters import _pymc

    param = pytensor.config._config_var_dict["blas__ldflags"]
    if hasattr(param, "val"):  # read in this process before: unset it for the test
        monkeypatch.delattr(param, "val")
    probes = []
    real = param._default
    monkeypatch.setattr(param, "_default", lambda: (probes.append(1), real())[1])
    model, _ = conjugate()
    cr.sample(cr.from_pymc(model), jax.random.key(0), None, 5, num_warmup=5, num_chains=2,
              progress=False, warn=False)  # fmt: skip
    assert probes == [] and not hasattr(param, "val")
    param.val = "-lblas"  # the user's (or PyTensor's, found before)
    try:
        with _pymc._no_blas_probe():
            assert pytensor.config.blas__ldflags == "-lblas"
        assert param.val == "-lblas" and probes == []
    finally:
        del param.val


def test_a_run_runs_pytensors_log_density_python_once_per_context(monkeypatch):
    """The log density's Python (PyTensor's generated JAX code) runs once per context of a
    run (outside the mesh, inside it), not once per place that calls it (init, the
    step-size search, the step: 11 times before); the draws are the same bits."""
    from chainrunner.adapters._pymc import _import_jax_helpers

    _import_jax_helpers()  # (its import turns x64 on: put back)
    import pymc.sampling.jax as pymc_jax

    made, calls = pymc_jax.get_jaxified_logp, []

    def counted(model, **kw):
        logp = made(model, **kw)
        return lambda *a, **k: calls.append(1) or logp(*a, **k)

    kw = {"num_warmup": 20, "num_chains": 2, "progress": False, "warn": False}
    monkeypatch.setattr(pymc_jax, "get_jaxified_logp", counted)
    trace = cr.run(cr.from_pymc(eight_schools()), jax.random.key(5), None, 20, **kw)
    assert 1 <= len(calls) <= 2, len(calls)
    monkeypatch.setattr(pymc_jax, "get_jaxified_logp", made)
    assert np.isfinite(trace.draws["mu"]).all()


def test_a_kernel_reused_after_set_data_is_an_error():
    """The compiled program holds the data: a kernel run after ``pm.set_data`` would sample
    the old data. It raises, naming the container, before anything compiles; the kernel
    ``from_pymc`` gives for the new data runs; data set back make the old kernel good."""
    from chainrunner.programs import _programs

    model = eight_schools()
    kernel = cr.from_pymc(model)
    kw = {"num_warmup": 10, "num_chains": 2, "progress": False, "warn": False}
    with model:
        pm.set_data({"sigma": SIGMA * 2})
    before = dict(_programs.trace_counts)
    with pytest.raises(ValueError, match=r"data \['sigma'\] changed since cr.from_pymc"):
        cr.run(kernel, jax.random.key(0), None, 10, **kw)
    assert _programs.trace_counts == before
    fresh = cr.from_pymc(model)
    assert fresh is not kernel
    assert cr.run(fresh, jax.random.key(0), None, 10, **kw).draws["mu"].shape == (2, 10)
    with model:  # a container added since (for predictions) is not in the program
        pm.Data("x_new", np.zeros(3))
    assert cr.run(fresh, jax.random.key(0), None, 10, **kw).draws["mu"].shape == (2, 10)
    with model:
        pm.set_data({"sigma": SIGMA})
    assert cr.run(kernel, jax.random.key(0), None, 10, **kw).draws["mu"].shape == (2, 10)
    again = eight_schools()  # the cell run again: a kernel of its own, watching its model
    fresh_again = cr.from_pymc(again)
    with again:
        pm.set_data({"sigma": SIGMA * 3})
    with pytest.raises(ValueError, match=r"pm\.set_data"):
        cr.run(fresh_again, jax.random.key(0), None, 10, **kw)
    resized = eight_schools()
    resized_kernel = cr.from_pymc(resized)
    resized.set_dim("school", 9, coord_values=[*SCHOOLS, "j"])  # new shapes, same data
    with pytest.raises(ValueError, match=r"'dim school'.* changed since"):
        cr.run(resized_kernel, jax.random.key(0), None, 10, **kw)


def conjugate():
    """p | k ~ Beta(2 + 7, 2 + 13); mu | y ~ Normal(sum(y) / (n + 1/100), ...) (exact)."""
    y = np.array([0.3, 1.9, 1.2, 0.4, 1.1, 0.7])
    with pm.Model() as model:
        p = pm.Beta("p", 2.0, 2.0)
        pm.Binomial("k", n=20, p=p, observed=7)
        mu = pm.Normal("mu", 0.0, 10.0)
        pm.Normal("y", mu, 1.0, observed=y)
    return model, {"p": 9 / 24, "mu": y.sum() / (len(y) + 0.01)}


@pytest.mark.parametrize(
    "options",
    [
        {"adaptation": "chees"},
        {"adaptation": "meads"},
        {"adaptation": None, "algorithm": blackjax.mala, "step_size": 0.3},
        {"pooled": True},
    ],
    ids=["chees", "meads", "mala", "pooled"],
)
def test_other_blackjax_algorithms_and_adaptations(options):
    model, exact = conjugate()
    draws = 2000 if options.get("adaptation", "") is None else 400
    trace = cr.run(cr.from_pymc(model, **options), jax.random.key(0), None, draws,
                   num_warmup=400, num_chains=8, progress=False, warn=False,
                   keep_warmup=True)  # fmt: skip
    for name, value in exact.items():
        x = trace.draws[name]
        assert abs(x.mean() - value) < 5 * mcse(x), name
    warm = trace.warmup_draws
    assert sorted(warm) == ["mu", "p"] and 0 < warm["p"].min() and warm["p"].max() < 1


def test_errors():
    with pm.Model() as discrete:
        pm.Poisson("n", 3.0)
    with pytest.raises(ValueError, match="discrete"):
        cr.from_pymc(discrete)
    with pytest.raises(TypeError, match=r"pymc\.Model"):
        cr.from_pymc(lambda: None)
    model, _ = conjugate()
    with pytest.raises(ValueError, match="adaptation"):
        cr.from_pymc(model, adaptation="nuts")
    with pytest.raises(TypeError, match="unknown option"):
        cr.from_pymc(model, adaptation="chees", max_tree_depth=3)


PM_WORDS = {  # pm.sample's keyword: a value a PyMC user passes, chainrunner's word for it
    "draws": (500, "num_samples"),
    "tune": (500, "num_warmup="),
    "chains": (4, "num_chains="),
    "random_seed": (1, "jax.random.key"),
    "target_accept": (0.9, "target_accept= of cr.from_pymc"),
    "initvals": ({"mu": 0.0}, "initvals= of cr.from_pymc"),
    "init": ("jitter+adapt_diag", "adaptation= and jitter="),
    "step": (None, "algorithm="),
    "cores": (2, "mesh="),
    "progressbar": (False, "progress="),
    "discard_tuned_samples": (True, "keep_warmup="),
    "compute_convergence_checks": (True, "warn="),
    "return_inferencedata": (True, "cr.sample returns ArviZ data"),
    "idata_kwargs": ({"log_likelihood": True}, "log_likelihood=True"),
    "var_names": (["mu"], "keep="),
    "nuts_sampler": ("numpyro", "always samples with blackjax"),
    "nuts_sampler_kwargs": ({}, "the adaptation's options"),
}


@pytest.mark.parametrize("word", sorted(PM_WORDS))
def test_pm_sample_words_name_the_function_called_and_chainrunners_word(word):
    """from_pymc takes target_accept and initvals as pm.sample does; every other word of
    pm.sample, in from_pymc or cr.sample, is a TypeError naming the function called (not
    from_blackjax or run) and chainrunner's word, before anything compiles."""
    value, ours = PM_WORDS[word]
    model, _ = conjugate()
    if word in ("target_accept", "initvals"):
        assert cr.from_pymc(model, **{word: value}).x64
    else:
        with pytest.raises(TypeError, match=rf"^from_pymc: '{word}' is pm.sample's") as e:
            cr.from_pymc(model, **{word: value})
        assert ours in str(e.value)
    with pytest.raises(TypeError, match=rf"^sample: '{word}' is pm.sample's") as e:
        cr.sample(lambda: None, jax.random.key(0), None, 10, **{word: value})
    assert ours in str(e.value)


def test_log_likelihood_with_keep_of_some_variables_warns_and_keeps_the_draws():
    kernel = cr.from_pymc(eight_schools(), log_likelihood=True)
    with pytest.warns(cr.ChainrunnerWarning, match="keep= left them out"):
        trace = cr.run(kernel, jax.random.key(2), None, 20, num_warmup=20, num_chains=2,
                       keep=["mu"], progress=False, warn=False)  # fmt: skip
    assert trace.draws["mu"].shape == (2, 20) and "log_likelihood" not in trace.groups


def test_initial_points_pymc_draws_need_initvals_or_a_position():
    """ZeroSumNormal's support point is a draw in PyMC's graph: initvals or a position."""
    with pm.Model() as model:
        a = pm.ZeroSumNormal("a", shape=3)
        pm.Normal("y", a, 1.0, observed=np.array([0.5, -0.2, 0.1]))
    kw = {"num_warmup": 20, "progress": False, "warn": False}
    kernel = cr.from_pymc(model)  # nothing compiled for initial points yet: no error here
    with pytest.raises(NotImplementedError, match="initvals"):
        cr.run(kernel, jax.random.key(0), None, 20, num_chains=2, **kw)
    trace = cr.run(kernel, jax.random.key(0), {"a_zerosum__": np.zeros((2, 2))}, 20, **kw)
    np.testing.assert_allclose(trace.draws["a"].sum(-1), 0.0, atol=1e-12)
    given = cr.from_pymc(model, initvals={"a": np.zeros(3)})
    assert cr.run(given, jax.random.key(0), None, 20, num_chains=2, **kw).draws["a"].shape == (
        2, 20, 3,
    )  # fmt: skip


def test_without_pymc_an_import_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pymc", None)
    with pytest.raises(ImportError, match=r'pip install "chainrunner\[pymc\]"'):
        cr.from_pymc(object())


def test_importing_chainrunner_imports_no_pymc_and_keeps_xla_flags():
    code = (
        "import os, sys\n"
        "import chainrunner as cr\n"
        "from chainrunner.adapters import as_adapter\n"
        "as_adapter(cr.Kernel(init=lambda x, k: x, step=lambda k, x: (x, {})))\n"
        "assert 'pymc' not in sys.modules, 'pymc imported'\n"
        "import pymc as pm\n"
        "with pm.Model() as m:\n"
        "    pm.Normal('x')\n"
        "cr.from_pymc(m)\n"
        "assert os.environ['XLA_FLAGS'] == FLAGS, os.environ['XLA_FLAGS']\n"
    )
    flags = "--xla_force_host_platform_device_count=3"
    env = {**os.environ, "XLA_FLAGS": flags}
    code = f"FLAGS = {flags!r}\n{code}"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-3000:]


def test_target_accept_and_blackjax_adaptations():
    """pm.sample's target_accept, and a per-chain blackjax adaptation on a PyMC model."""
    with pm.Model() as model:
        pm.Normal("x", 0.0, 2.0, shape=2)
    kernel = cr.from_pymc(model, target_accept=0.95)
    assert kernel.sampler.options["target_acceptance_rate"] == 0.95
    with pytest.raises(ValueError, match=r"target_accept must be in \(0, 1\)"):
        cr.from_pymc(model, target_accept=1.5)
    with pytest.raises(ValueError, match="does not apply to adaptation='mclmc'"):
        cr.from_pymc(model, adaptation="mclmc", target_accept=0.9)
    with pytest.raises(TypeError, match="not both"):
        cr.from_pymc(model, target_accept=0.9, target_acceptance_rate=0.8)
    with pytest.raises(ValueError, match="adaptation must be None, one of"):
        cr.from_pymc(model, adaptation="nutpie")
    low_rank = cr.from_pymc(model, adaptation="window_low_rank", target_accept=0.9)
    idata = cr.sample(low_rank, jax.random.key(0), None, 500, num_warmup=300, num_chains=3,
                      progress=False, warn=False)  # fmt: skip
    x = np.asarray(idata.posterior["x"])
    assert x.shape == (3, 500, 2)
    assert abs(x.std() - 2.0) < 0.25
