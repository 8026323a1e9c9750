"""Every blackjax adaptation through ``cr.from_blackjax(..., adaptation=...)``.

Known answers (moments of a Gaussian within Monte-Carlo error) on 1, 2 and 8 devices with
padding; blackjax's own ``run`` of each chain with the documented key gives the same
parameters; wrong factories and options are errors at ``from_blackjax`` time.
"""

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from mcse import mcse, mcse_sd

import chainrunner as cr
from chainrunner.programs._programs import chain_key_pair

SCALES = jnp.array([1.0, 2.0, 3.0])


def logdensity(x):
    return -0.5 * jnp.sum((x / SCALES) ** 2)


X0 = jnp.full((5, 3), 0.3)  # 5 chains: padded on 2 and 8 devices

# (adaptation, factory, options, devices): every adaptation on one of 1, 2, 8 devices.
CASES = [
    ("window_low_rank", blackjax.nuts, {}, 2),
    (blackjax.window_adaptation_low_rank, blackjax.nuts, {"max_rank": 2}, 8),
    ("staged", blackjax.nuts, {"metric": "fisher_diag"}, 1),
    ("pathfinder", blackjax.nuts, {}, 8),
    ("mclmc", blackjax.mclmc, {}, 2),
    ("adjusted_mclmc", blackjax.adjusted_mclmc_dynamic, {}, 1),
    (blackjax.window_adaptation(blackjax.nuts, logdensity), blackjax.nuts, {}, 8),
]


def _label(case):
    a = case[0]
    return a if isinstance(a, str) else getattr(a, "__name__", "built")


def _run(adaptation, factory, options, devices, n=1000, warmup=300, **kw):
    kernel = cr.from_blackjax(factory, logdensity_fn=logdensity, adaptation=adaptation, **options)
    return cr.run(kernel, jax.random.key(1), X0, n, num_warmup=warmup, progress=False,
                  mesh=cr.chain_mesh(devices), **kw)  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=_label)
def test_samples_a_gaussian(case):
    trace = _run(*case)
    draws = np.asarray(trace.draws)
    assert draws.shape == (5, 1000, 3)
    for j, scale in enumerate(np.asarray(SCALES)):
        x = draws[..., j]
        assert abs(x.mean()) < 5 * mcse(x) + 1e-3, (j, x.mean())
        assert abs(x.std() - scale) < 5 * mcse_sd(x) + 1e-3, (j, x.std())
    params = cr.adapted_parameters(trace)
    assert np.shape(params["step_size"]) == (5,)  # one per chain
    assert trace.attrs["adaptation"] in ("window_low_rank", "staged", "pathfinder", "mclmc",
                                         "adjusted_mclmc", "built")  # fmt: skip


def _own_run(chain, adaptation):
    """blackjax's own run of one chain with the key chainrunner documents."""
    key = jax.random.fold_in(chain_key_pair(jax.random.key(1), jnp.uint32(chain))[0], 0)
    return jax.jit(lambda k, x: adaptation.run(k, x, 300))(key, X0[chain])


@pytest.mark.parametrize("devices", [2, 8])
def test_matches_blackjax_own_run_per_chain(devices):
    steps = {"num_integration_steps": 5}  # a fixed path: see the test below
    trace = _run("window_low_rank", blackjax.hmc, steps, devices, n=5)
    params = cr.adapted_parameters(trace)
    own = blackjax.window_adaptation_low_rank(blackjax.hmc, logdensity, **steps)
    for chain in (0, 4):
        (_, expected), _ = _own_run(chain, own)
        np.testing.assert_allclose(params["step_size"][chain], expected["step_size"], rtol=1e-4)
        np.testing.assert_allclose(
            params["inverse_mass_matrix"].sigma[chain],
            expected["inverse_mass_matrix"].sigma, rtol=1e-4,
        )  # fmt: skip


def _mclmc_tuner(adaptation, options, num_steps):
    """``(own, steps)``: blackjax's own tuner of one chain, ``(key, position) ->
    parameters``, and chainrunner's form of it in steps (``PerChain``), with the kernel
    chainrunner builds (``_warmup_tuned``)."""
    from blackjax.mcmc import adjusted_mclmc_dynamic as amd
    from blackjax.mcmc import mclmc

    from chainrunner.adapters._blackjax import _warmup_adjusted_mclmc, _warmup_mclmc

    if adaptation == "mclmc":
        kernel, init = mclmc.build_kernel(integrator=mclmc.isokinetic_mclachlan), mclmc.init
        steps = _warmup_mclmc.mclmc_steps(kernel, logdensity, init, options)

        def tune(state, key):
            return blackjax.mclmc_find_L_and_step_size(
                kernel, num_steps, state, key, logdensity_fn=logdensity, **options
            )
    else:
        kernel = amd.build_kernel(integration_steps_fn=amd.make_random_trajectory_length_fn(True),
                                  integrator=amd.integrators.isokinetic_mclachlan)  # fmt: skip
        init, options = amd.init, {"target": 0.9, **options}
        steps = _warmup_adjusted_mclmc.adjusted_steps(kernel, logdensity, init, options)

        def tune(state, key):
            return blackjax.adjusted_mclmc_find_L_and_step_size(
                kernel, logdensity, num_steps, state, key, **options
            )

    def own(key, position):
        init_key, tune_key = jax.random.split(key)
        return tune(init(position, logdensity, init_key), tune_key)[1]

    return own, steps


FACTORIES = {"mclmc": blackjax.mclmc, "adjusted_mclmc": blackjax.adjusted_mclmc_dynamic}


@pytest.mark.parametrize("adaptation, num_steps", [("mclmc", 1000), ("adjusted_mclmc", 1500)])
def test_the_mclmc_tuners_match_blackjaxs_own_per_chain(adaptation, num_steps):
    """The tuners run as steps in chunks (``_warmup_mclmc``, ``_warmup_adjusted_mclmc``);
    each chain's parameters are blackjax's own call's (``num_steps`` for
    ``num_warmup=300``), with the documented keys: within float rounding for MCLMC;
    adjusted MCLMC's accept/reject grows a rounding difference between two programs
    into another path (4% measured on jax 0.12, equal on jax 0.10), so there the
    passes are checked step for step below, in one program."""
    trace = _run(adaptation, FACTORIES[adaptation], {}, 2, n=5, chunk_size=70)
    got = cr.adapted_parameters(trace)
    own = jax.jit(_mclmc_tuner(adaptation, {}, num_steps)[0])
    for chain in (0, 4):
        key = jax.random.fold_in(chain_key_pair(jax.random.key(1), jnp.uint32(chain))[0], 0)
        expected = own(key, X0[chain])
        rtol = 1e-3 if adaptation == "mclmc" else 0.25
        for name in ("L", "step_size", "inverse_mass_matrix"):
            np.testing.assert_allclose(got[name][chain], getattr(expected, name), rtol=rtol)


@pytest.mark.parametrize(
    "adaptation, options",
    [
        ("mclmc", {"diagonal_preconditioning": False, "frac_tune3": 0.2}),
        ("mclmc", {"frac_tune3": 0.0, "desired_energy_var": 1e-3}),
        ("adjusted_mclmc", {"frac_tune3": 0.1, "num_windows": 2, "max": "max"}),
        ("adjusted_mclmc", {"diagonal_preconditioning": False, "frac_tune2": 0.0}),
    ],
)
def test_the_mclmc_tuners_steps_are_blackjaxs_passes(adaptation, options):
    """The step form, in two chunks, against blackjax's own call in one program: the
    same parameters for each option's path through the passes, within float rounding
    (MCLMC's grows over 600 steps: 5e-4 measured)."""
    own, steps = _mclmc_tuner(adaptation, options, 600)

    @jax.jit
    def mine(key, position):
        chain = steps(key, position, 600)
        n = chain.keys.shape[0]
        numbers = jnp.arange(n, dtype=jnp.int32)
        c, _ = jax.lax.scan(chain.step, chain.carry, (numbers[: n // 3], chain.keys[: n // 3]))
        c, _ = jax.lax.scan(chain.step, c, (numbers[n // 3 :], chain.keys[n // 3 :]))
        return chain.finish(c, n)

    key = jax.random.key(5)
    (_, got), expected = mine(key, X0[1]), jax.jit(own)(key, X0[1])
    for name in ("L", "step_size", "inverse_mass_matrix"):
        np.testing.assert_allclose(got[name], getattr(expected, name), rtol=2e-3)


def test_staged_matches_blackjax_and_is_reproducible():
    one = _run("staged", blackjax.nuts, {"metric": "fisher_diag"}, 1, n=50)
    again = _run("staged", blackjax.nuts, {"metric": "fisher_diag"}, 1, n=50)
    assert np.array_equal(np.asarray(one.draws), np.asarray(again.draws))  # same layout
    # One chain per device against blackjax's own run: HMC with a fixed path (XLA's
    # rounding differs between programs, and NUTS's U-turn decisions during warmup can
    # grow a rounding difference into another trajectory: measured 14% in a step size).
    hmc = {"metric": "fisher_diag", "num_integration_steps": 5}
    eight = _run("staged", blackjax.hmc, hmc, 8, n=50)
    own = blackjax.staged_adaptation(blackjax.hmc, logdensity, **hmc)
    got = cr.adapted_parameters(eight)
    for chain in (0, 3):
        (_, expected), _ = _own_run(chain, own)
        np.testing.assert_allclose(got["inverse_mass_matrix"][chain],
                                   expected["inverse_mass_matrix"], rtol=1e-4)  # fmt: skip
        # The step size is not compared: under jax 0.12 it differs from blackjax's own run
        # by up to 8% while the metric agrees to 1e-4 (jax 0.10: both agree); open, see
        # the closing note of issue 33. window_low_rank's step size agrees on both.
        assert abs(got["step_size"][chain] / expected["step_size"] - 1) < 0.25


def test_keep_warmup_and_continue():
    trace = _run("window_low_rank", blackjax.nuts, {}, 2, n=20, warmup=60, keep_warmup=True)
    assert np.asarray(trace.warmup_draws).shape == (5, 60, 3)
    assert np.asarray(trace.warmup_stats["n_steps"]).shape == (5, 60)
    more = cr.run(cr.from_blackjax(blackjax.nuts, logdensity_fn=logdensity,
                                   adaptation="window_low_rank"),
                  jax.random.key(1), trace, 10, progress=False)  # fmt: skip
    assert np.asarray(more.draws).shape == (5, 10, 3)
    np.testing.assert_array_equal(
        cr.adapted_parameters(more)["step_size"], cr.adapted_parameters(trace)["step_size"]
    )
    with pytest.raises(ValueError, match="keep_warmup=True, but adaptation='mclmc'"):
        _run("mclmc", blackjax.mclmc, {}, 1, n=5, warmup=20, keep_warmup=True)


@pytest.mark.parametrize(
    "factory, adaptation, options, error, match",
    [
        (blackjax.nuts, "window", {"is_mass_matrix_diagonal": "dense"}, ValueError,
         "is_mass_matrix_diagonal must be True"),
        (blackjax.mclmc, "window", {}, TypeError, r"needs \['L'\].*adaptation='mclmc'"),
        (blackjax.nuts, "mclmc", {}, TypeError, "samples with blackjax.mclmc"),
        (blackjax.nuts, "window_low_rank", {"max_rnk": 3}, TypeError,
         r"unknown option\(s\) \['max_rnk'\]"),
        (blackjax.nuts, blackjax.staged_adaptation, {"num_steps": 10}, TypeError,
         "set by cr.run"),
        (blackjax.mala, "pathfinder", {}, TypeError, "takes no inverse_mass_matrix"),
        (blackjax.hmc, "window_low_rank", {}, TypeError, "num_integration_steps"),
        (blackjax.nuts, "windw", {}, ValueError, "adaptation must be None, one of"),
        (blackjax.nuts, len, {}, TypeError, "adaptation must be None, a name"),
        (blackjax.nuts, blackjax.window_adaptation(blackjax.nuts, logdensity),
         {"target_acceptance_rate": 0.9}, TypeError, "carries its own"),
        (blackjax.nuts, blackjax.window_adaptation, {"imm_shrinkage_to_previous": 1.0},
         TypeError, "pass the built adaptation"),
    ],
)  # fmt: skip
def test_errors_at_from_blackjax(factory, adaptation, options, error, match):
    with pytest.raises(error, match=match):
        cr.from_blackjax(factory, logdensity_fn=logdensity, adaptation=adaptation, **options)


def test_hmc_with_its_steps_and_the_same_object():
    a = cr.from_blackjax(blackjax.hmc, logdensity_fn=logdensity, adaptation="window_low_rank",
                         num_integration_steps=8)  # fmt: skip
    trace = cr.run(a, jax.random.key(0), X0, 20, num_warmup=40, progress=False)
    assert np.isfinite(np.asarray(trace.draws)).all()
    with pytest.raises(ValueError, match=r"num_warmup=0.*adaptation='window_low_rank'"):
        cr.run(a, jax.random.key(0), X0, 20, progress=False)
