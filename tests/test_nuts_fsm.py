"""blackjax's NUTS as a state machine (issue 37): blackjax's draws, with no chain waiting.

The machine (``adapters/_blackjax/_nuts_fsm.py``) advances every chain of a batch by one
leapfrog step per tick and draws its random numbers from each transition's key as
blackjax's kernel does: a chunk of it equals ``vmap(scan(blackjax.nuts(...).step))`` with
the same keys, draw for draw, with the same statistics.
"""

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from chainrunner.adapters._blackjax._nuts_fsm import chunk_machine, nuts_spec
from chainrunner.core._kernel import default_extract

D = 6
A = jnp.asarray(np.random.default_rng(0).normal(size=(D, D)), jnp.float32)


def correlated(x):
    return -0.5 * jnp.sum((A @ x) ** 2) / D


def funnel(x):  # a hard target: divergences and long trajectories
    return (
        -0.5 * x[0] ** 2 / 9.0 - 0.5 * jnp.sum(x[1:] ** 2) * jnp.exp(-x[0]) - 0.5 * (D - 1) * x[0]
    )


def sites(x):  # a dict position, as numpyro and PyMC models have them
    return correlated(jnp.concatenate([x["a"], x["b"].ravel()]))


def _blackjax_chunk(nuts, states, keys, start, n, extract=default_extract):
    """``n`` steps of ``nuts.step`` from step ``start``, vmapped: the plain loop's draws."""

    def one(state, key):
        def body(s, t):
            s, info = nuts.step(jax.random.fold_in(key, t), s)
            return s, extract(s, info)

        return jax.lax.scan(body, state, start + jnp.arange(n))

    return jax.jit(jax.vmap(one))(states, keys)


CASES = [
    (correlated, jnp.ones(D), 0.3, 10),
    (correlated, jnp.eye(D) * 0.5 + 0.1, 0.4, 3),  # dense metric, a depth that binds
    (funnel, jnp.ones(D), 0.9, 10),  # divergences
]


@pytest.mark.parametrize("logdensity, imm, step_size, depth", CASES)
def test_a_chunk_is_blackjaxs_draw_for_draw(logdensity, imm, step_size, depth):
    """12 chains, 60 draws from step 5: the draws, steps, doublings, divergences, U-turns,
    acceptance rates and energies of a vmapped ``blackjax.nuts(...).step``; the rows past
    ``n_valid`` stay zeros, and the returned state is the last draw's. The funnel is
    chaotic: XLA's rounding (1e-6 at first) grows along a chain, as between two vmap widths
    (docs/reproducibility.md), so there the first 12 draws are compared."""
    nuts = blackjax.nuts(logdensity, step_size, imm, max_num_doublings=depth)
    starts = jax.vmap(nuts.init)(jax.random.normal(jax.random.key(0), (12, D)))
    keys = jax.random.split(jax.random.key(1), 12)
    loop = jax.jit(chunk_machine(nuts_spec(nuts), default_extract, 64))
    final, (draws, stats) = loop(starts, keys, jnp.int32(5), jnp.int32(60))
    ref_final, (ref, ref_stats) = _blackjax_chunk(nuts, starts, keys, 5, 60)
    n = 12 if logdensity is funnel else 60
    np.testing.assert_allclose(draws[:, :n], ref[:, :n], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(draws[:, 60:], 0)
    if n == 60:
        np.testing.assert_allclose(final.position, ref_final.position, rtol=1e-5, atol=1e-5)
    for name in ("n_steps", "tree_depth", "diverging"):
        np.testing.assert_array_equal(stats[name][:, :n], ref_stats[name][:, :n], err_msg=name)
    for name in ("acceptance_rate", "energy", "lp"):
        np.testing.assert_allclose(stats[name][:, :n], ref_stats[name][:, :n], rtol=1e-3,
                                   atol=1e-3)  # fmt: skip
    if logdensity is funnel:
        assert ref_stats["diverging"][:, :n].sum() > 0  # the divergence path was exercised
    if depth == 3:
        assert (ref_stats["tree_depth"] == depth).sum() > 0  # and the depth limit


def test_a_chains_draws_do_not_depend_on_its_batch():
    """Chain 0 alone, with 3 others, or with 15 others: the same draws and steps (to
    round-off: XLA may round a batch of another width differently)."""
    nuts = blackjax.nuts(correlated, 0.3, jnp.ones(D))
    starts = jax.vmap(nuts.init)(jax.random.normal(jax.random.key(2), (16, D)))
    keys = jax.random.split(jax.random.key(3), 16)
    loop = jax.jit(chunk_machine(nuts_spec(nuts), default_extract, 40))
    out = [loop(jax.tree.map(lambda x, b=b: x[:b], starts), keys[:b], jnp.int32(0),
                jnp.int32(40)) for b in (1, 4, 16)]  # fmt: skip
    for other in out[1:]:
        np.testing.assert_allclose(other[1][0][0], out[0][1][0][0], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(other[1][1]["n_steps"][0], out[0][1][1]["n_steps"][0])


def _with_quorums(monkeypatch, build, *args) -> list:
    """The chunk ``build()`` gives, run with ends processed one at a time, a quarter of the
    batch at a time (the default) and all at once; each quorum is asked for once."""
    from chainrunner.adapters._blackjax import _nuts_fsm

    asked, out = [], []
    for wait_for in (1, 4, 16):

        def quorum(b, w=wait_for):
            asked.append((b, w))
            return w

        monkeypatch.setattr(_nuts_fsm, "quorum", quorum)
        out.append(jax.jit(build())(*args))
    assert asked == [(16, 1), (16, 4), (16, 16)], asked  # the patch reached the loop
    return out


@pytest.mark.parametrize("logdensity", [correlated, funnel, "window"])
def test_the_quorum_changes_when_ends_run_not_the_draws(monkeypatch, logdensity):
    """Ended chains wait, frozen, until a quarter of the batch has ended (``quorum``):
    processing every end at once (1) or only when the whole batch has ended (16) gives
    bitwise the same draws, statistics and final states, with fewer valid draws than the
    chunk holds; with the window adaptation too, its warmup ending inside the chunk (chains
    past it processed with chains still adapting)."""
    from chainrunner.adapters._blackjax import _nuts_fsm

    assert _nuts_fsm.quorum(16) == 4 and _nuts_fsm.quorum(3) == 1
    x = jax.random.normal(jax.random.key(4), (16, D))
    if logdensity == "window":
        kernel = _adapted("window", 12)
        starts = jax.vmap(kernel.init)(x, jax.random.split(jax.random.key(6), 16))

        def build():
            return kernel.machine(kernel.extract, 32)
    else:
        nuts = blackjax.nuts(logdensity, 0.5, jnp.ones(D))
        starts = jax.vmap(nuts.init)(x)

        def build():
            return chunk_machine(nuts_spec(nuts), default_extract, 32)

    keys = jax.random.split(jax.random.key(5), 16)
    out = _with_quorums(monkeypatch, build, starts, keys, jnp.int32(3), jnp.int32(30))
    for other in out[1:]:
        for a, b in zip(jax.tree.leaves(out[0]), jax.tree.leaves(other), strict=True):
            np.testing.assert_array_equal(a, b)


def test_dict_positions_and_an_empty_chunk():
    """A position of several sites is flattened inside and given back as it was; with
    ``n_valid=0`` nothing runs and the states come back unchanged."""
    nuts = blackjax.nuts(sites, 0.3, jnp.ones(D))
    position = {"a": jnp.ones((4, 2)), "b": jnp.zeros((4, 2, 2))}
    starts = jax.vmap(nuts.init)(position)
    keys = jax.random.split(jax.random.key(4), 4)
    loop = jax.jit(chunk_machine(nuts_spec(nuts), default_extract, 10))
    _, (draws, _) = loop(starts, keys, jnp.int32(0), jnp.int32(10))
    _, (ref, _) = _blackjax_chunk(nuts, starts, keys, 0, 10)
    for k in ("a", "b"):
        np.testing.assert_allclose(draws[k], ref[k], rtol=1e-5, atol=1e-5)
    final, (empty, _) = loop(starts, keys, jnp.int32(0), jnp.int32(0))
    np.testing.assert_array_equal(final.position["b"], starts.position["b"])
    np.testing.assert_array_equal(empty["a"], 0)


def test_only_euclidean_nuts_is_recognised():
    logdensity = lambda x: -0.5 * x @ x  # noqa: E731
    assert nuts_spec(blackjax.nuts(logdensity, 0.5, jnp.ones(2))) is not None
    assert nuts_spec(blackjax.hmc(logdensity, 0.5, jnp.ones(2), 3)) is None
    assert nuts_spec(blackjax.mala(logdensity, 0.5)) is None
    assert nuts_spec(object()) is None


# --- through cr.run: chains that share a device run as the machine ---------------------


def _gaussian(scale):
    """A fresh 5-d correlated Gaussian log density (a new function: nothing cached)."""
    cov = np.full((5, 5), 0.5) + 0.5 * np.eye(5)
    prec = jnp.asarray(np.linalg.inv(cov) / scale**2, jnp.float32)
    return (lambda x: -0.5 * x @ prec @ x), cov * scale**2


def _assert_moments(trace, cov):
    """Each coordinate's mean and standard deviation within 4 Monte-Carlo standard errors
    of the Gaussian's (mean 0, covariance ``cov``)."""
    from mcse import mcse, mcse_sd

    draws = np.asarray(trace.draws, np.float64)
    for i in range(draws.shape[-1]):
        x = draws[..., i]
        assert abs(x.mean()) < 4 * mcse(x), (i, x.mean(), mcse(x))
        sd = np.sqrt(cov[i, i])
        assert abs(x.std() - sd) < 4 * mcse_sd(x), (i, x.std(), sd)


def _spy(monkeypatch):
    from chainrunner.programs import _programs

    calls = []
    real = _programs.machine_loop

    def spied(loop, batched):
        calls.append(batched)
        return real(loop, batched)

    monkeypatch.setattr(_programs, "machine_loop", spied)
    return calls


@pytest.mark.parametrize("devices, batch_size", [(4, None), (8, None)])
def test_run_vmaps_the_machine_with_blackjaxs_draws(monkeypatch, devices, batch_size):
    """13 chains (padding), chunks of 30 with a shorter last one: a vmapped run goes
    through the machine, and each chain's draws are those of ``batch_size=1`` (blackjax's
    own step, no vmap) to float32 rounding; thinning keeps the plain loop."""
    import chainrunner as cr

    logdensity, _ = _gaussian(1.0)
    nuts = blackjax.nuts(logdensity, 0.5, jnp.ones(5))
    x0 = jax.random.normal(jax.random.key(0), (13, 5))
    calls = _spy(monkeypatch)
    kw = dict(mesh=cr.chain_mesh(devices), chunk_size=30, progress=False)
    vmapped = cr.run(nuts, jax.random.key(1), x0, 70, batch_size=batch_size, **kw)
    assert calls, "the vmapped run did not use the machine"
    plain = cr.run(nuts, jax.random.key(1), x0, 70, batch_size=1, **kw)
    np.testing.assert_allclose(vmapped.draws, plain.draws, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(vmapped.stats["n_steps"], plain.stats["n_steps"])
    calls.clear()
    thinned = cr.run(nuts, jax.random.key(1), x0, 20, thinning=2, batch_size=None, **kw)
    assert not calls
    np.testing.assert_allclose(thinned.draws, np.asarray(plain.draws)[:, 1:20:2], rtol=1e-4,
                               atol=1e-4)  # fmt: skip


def test_run_with_the_machine_samples_the_target():
    """32 chains x 400 draws on 2 devices, one vmap each: the means and standard
    deviations of a correlated Gaussian within 4 Monte-Carlo standard errors."""
    import chainrunner as cr

    logdensity, cov = _gaussian(2.0)
    nuts = blackjax.nuts(logdensity, 0.9, jnp.full(5, 4.0))
    x0 = jax.random.normal(jax.random.key(2), (32, 5))
    trace = cr.run(nuts, jax.random.key(3), x0, 400, mesh=cr.chain_mesh(2), batch_size=None,
                   progress=False)  # fmt: skip
    _assert_moments(trace, cov)


# --- adapted NUTS: each chain's step size and matrix from its own state ----------------


def _adapted(adaptation, num_warmup, **options):
    """The adapted kernel ``cr.from_blackjax(blackjax.nuts, adaptation=...)`` builds; for
    Fisher's adaptations with the machine forced on (by default the low rank keeps the
    plain loop: ``test_which_adapted_kernels_run_as_the_machine``)."""
    import chainrunner as cr
    from chainrunner.adapters._blackjax import _fisher_options
    from chainrunner.adapters._blackjax._warmup_fisher import fisher_in_loop
    from chainrunner.adapters._blackjax._warmup_window import adaptive_kernel

    if adaptation == "window":
        adapter = cr.from_blackjax(blackjax.nuts, logdensity_fn=correlated,
                                   adaptation=adaptation, **options)  # fmt: skip
        return adapter.build_kernel(num_warmup=num_warmup)
    opts = _fisher_options(adaptation, blackjax.nuts, options, "test")
    spec = fisher_in_loop(correlated, num_warmup, opts, adaptation == "fisher_low_rank")
    return adaptive_kernel(blackjax.nuts, correlated, num_warmup, {}, spec._replace(machine=True))


@pytest.mark.parametrize(
    "adaptation, options",
    [
        ("window", {}),
        ("window", {"is_mass_matrix_diagonal": False}),
        ("fisher", {}),
        ("fisher_low_rank", {"max_rank": 2}),
    ],
)
def test_an_adapted_chunk_is_the_kernels_own_step(adaptation, options):
    """Window- and Fisher-adapted NUTS carry each chain's step size and inverse mass matrix
    in its state: 12 chains, each given its own (diagonal or dense), with no adaptation
    left, run 30 draws of the machine as the kernel's own vmapped step does, draw for
    draw, with the same step sizes (Fisher's jittered ones: the key split as the step
    splits it). Fisher's adaptations have the machine forced on here: it handles their
    jitter and low-rank metric, though by default they keep the plain loop."""
    kernel = _adapted(adaptation, 0, **options)
    assert kernel.machine is not None
    x = jax.random.normal(jax.random.key(0), (12, D))
    starts = jax.vmap(kernel.init)(x, jax.random.split(jax.random.key(5), 12))
    rng = np.random.default_rng(1)
    if adaptation == "fisher_low_rank":
        u = np.linalg.qr(rng.normal(size=(12, D, 2)))[0]
        imm = type(starts.adaptation.inverse_mass_matrix)(
            *(jnp.asarray(x, jnp.float32)
              for x in (rng.uniform(0.5, 1.5, (12, D)), u, rng.uniform(0.3, 3.0, (12, 2))))
        )  # fmt: skip
    elif options:
        b = rng.normal(size=(12, D, D)) * 0.3
        imm = jnp.asarray(np.eye(D) * 0.5 + b @ np.swapaxes(b, 1, 2), jnp.float32)
    else:
        imm = jnp.asarray(rng.uniform(0.3, 2.0, size=(12, D)), jnp.float32)
    adaptation_state = starts.adaptation._replace(
        step_size=jnp.linspace(0.2, 0.6, 12, dtype=jnp.float32), inverse_mass_matrix=imm
    )
    starts = starts._replace(adaptation=adaptation_state)
    keys = jax.random.split(jax.random.key(6), 12)
    final, (draws, stats) = jax.jit(kernel.machine(kernel.extract, 32))(
        starts, keys, jnp.int32(0), jnp.int32(30)
    )
    ref_final, (ref, ref_stats) = _blackjax_chunk(kernel, starts, keys, 0, 30, kernel.extract)
    np.testing.assert_allclose(draws[:, :30], ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(stats["step_size"][:, :30], ref_stats["step_size"], rtol=1e-6)
    np.testing.assert_array_equal(stats["n_steps"][:, :30], ref_stats["n_steps"])
    np.testing.assert_array_equal(final.step, ref_final.step)
    if adaptation != "window":  # the jitter was drawn: step sizes vary along a chain
        assert np.ptp(np.asarray(ref_stats["step_size"][0])) > 0


def test_adaptation_moves_on_at_each_chains_transition_end():
    """Window adaptation during the chunk: each chain's step size adapts after each of its
    own transitions, as the kernel's step adapts it. The adaptation amplifies float32
    rounding (the dual averaging's next step size rounds 1 ulp apart, then trajectories
    part), so the first draws are compared."""
    kernel = _adapted("window", 40)
    starts = jax.vmap(kernel.init)(jax.random.normal(jax.random.key(7), (12, D)),
                                   jax.random.split(jax.random.key(8), 12))  # fmt: skip
    keys = jax.random.split(jax.random.key(9), 12)
    _, (draws, stats) = jax.jit(kernel.machine(kernel.extract, 30))(
        starts, keys, jnp.int32(0), jnp.int32(30)
    )
    _, (ref, ref_stats) = _blackjax_chunk(kernel, starts, keys, 0, 30, kernel.extract)
    np.testing.assert_allclose(draws[:, :3], ref[:, :3], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(stats["step_size"][:, :4], ref_stats["step_size"][:, :4],
                               rtol=1e-4)  # fmt: skip
    assert np.ptp(np.asarray(stats["step_size"][0, :4])) > 0  # it did adapt


def test_which_adapted_kernels_run_as_the_machine():
    """NUTS with the window or the diagonal Fisher adaptation does; with the low-rank
    Fisher (an eigendecomposition that, run for the whole batch at each processing of
    ends, measured slower than the plain loop) and HMC not."""
    import chainrunner as cr

    def machine(factory, adaptation, **options):
        adapter = cr.from_blackjax(factory, logdensity_fn=correlated, adaptation=adaptation,
                                   **options)  # fmt: skip
        return adapter.build_kernel(num_warmup=10).machine

    assert machine(blackjax.nuts, "window") is not None
    assert machine(blackjax.nuts, "window", is_mass_matrix_diagonal=False) is not None
    assert machine(blackjax.nuts, "fisher") is not None
    assert machine(blackjax.nuts, "fisher_low_rank") is None
    assert machine(blackjax.hmc, "window", num_integration_steps=5) is None


@pytest.mark.parametrize("adaptation", ["window", "fisher"])
def test_run_with_adaptation_vmaps_the_machine(monkeypatch, adaptation):
    """What users run (window- or Fisher-adapted NUTS, ``batch_size=None``) goes through the
    machine and samples the target: 32 chains x (300 + 400) draws on 2 devices, means and
    standard deviations of a correlated Gaussian within 4 Monte-Carlo standard errors."""
    import chainrunner as cr

    logdensity, cov = _gaussian(3.0)
    adapter = cr.from_blackjax(blackjax.nuts, logdensity_fn=logdensity, adaptation=adaptation)
    calls = _spy(monkeypatch)
    x0 = jax.random.normal(jax.random.key(4), (32, 5))
    trace = cr.run(adapter, jax.random.key(5), x0, 400, num_warmup=300,
                   mesh=cr.chain_mesh(2), batch_size=None, progress=False)  # fmt: skip
    assert calls, "the vmapped run did not use the machine"
    _assert_moments(trace, cov)


def test_float64_chains_give_the_kernels_dtypes():
    """With x64 on (PyMC turns it on), the machine's draws are float64 and its counts
    int64, as the kernel's own step gives them (``cr.run`` vmaps one or the other)."""
    with jax.enable_x64(True):
        kernel = _adapted("window", 5)
        x = jax.random.normal(jax.random.key(0), (4, D), jnp.float64)
        starts = jax.vmap(kernel.init)(x, jax.random.split(jax.random.key(1), 4))
        keys = jax.random.split(jax.random.key(2), 4)
        _, (draws, stats) = jax.jit(kernel.machine(kernel.extract, 8))(
            starts, keys, jnp.int32(0), jnp.int32(8)
        )
        _, (ref, ref_stats) = _blackjax_chunk(kernel, starts, keys, 0, 8, kernel.extract)
        assert draws.dtype == ref.dtype == jnp.float64
        for name, value in ref_stats.items():
            assert stats[name].dtype == value.dtype, name
        np.testing.assert_allclose(draws[:, :2], ref[:, :2], rtol=1e-8, atol=1e-8)
