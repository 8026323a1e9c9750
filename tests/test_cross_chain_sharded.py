"""ChEES and MEADS with the chains spread over the devices (the default layout).

The layout's promises: bitwise the same results on 1, 3 and 8 devices and with or
without padding chains (same batch width); blackjax's own algorithm (bitwise equal to
``layout="replicated"``, blackjax's ``run``, when the widths match); correct sampling.
"""

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from mcse import mcse, mcse_sd

import chainrunner as cr

SD = np.array([1.0, 3.0, 0.3])
COV = np.diag(SD) @ np.array([[1.0, 0.6, 0.0], [0.6, 1.0, -0.4], [0.0, -0.4, 1.0]]) @ np.diag(SD)
PREC = jnp.asarray(np.linalg.inv(COV), jnp.float32)
MEAN = np.array([1.0, -2.0, 0.5], np.float32)


def logdensity(x):
    z = x - MEAN
    return -0.5 * z @ PREC @ z


FACTORY = {"chees": blackjax.dynamic_hmc, "meads": blackjax.ghmc}
START12 = jax.random.normal(jax.random.key(3), (12, 3)) * 2.0  # dispersed (MEADS: 3 folds)
KW = {"progress": False, "warn": False}


def kernel(adaptation, **options):
    return cr.from_blackjax(
        FACTORY[adaptation], logdensity_fn=logdensity, adaptation=adaptation, **options
    )


def run(adaptation, num_devices, start=START12, *, options=None, **kw):
    return cr.run(
        kernel(adaptation, **(options or {})),
        jax.random.key(0),
        start,
        10,
        num_warmup=40,
        keep_warmup=True,
        mesh=cr.chain_mesh(num_devices),
        **KW,
        **kw,
    )


def adapted(trace):
    return {k: v for k, v in trace.attrs.items() if k.startswith("adapted_")}


def assert_same(a, b):
    np.testing.assert_array_equal(a.draws, b.draws)
    np.testing.assert_array_equal(a.warmup_draws, b.warmup_draws)
    for name in a.warmup_stats:
        np.testing.assert_array_equal(a.warmup_stats[name], b.warmup_stats[name])
    assert adapted(a) == adapted(b)


@pytest.mark.parametrize("adaptation", ["chees", "meads"])
def test_bitwise_on_1_3_8_devices_and_padding(adaptation):
    # 12 chains: 12 per device on 1, 4 on 3, 2 on 8 (+4 padding chains), in batches of 2
    # (auto: an eighth): one batch per device on 8.
    one = run(adaptation, 1)
    assert "sharded" == kernel(adaptation).options["layout"]  # the default
    assert one.warmup_draws.shape == (12, 40, 3)
    for d in (3, 8):
        other = run(adaptation, d)
        assert other.attrs["padded_chains"] == (4 if d == 8 else 0)
        assert_same(one, other)


def blackjax_run(adaptation, start=START12, num_warmup=40):
    """blackjax's own ``chees_adaptation``/``meads_adaptation`` ``run``, as a user calls it,
    with the key and options ``run`` gives the warmup: ``(warmup positions, params)``."""
    import optax
    from blackjax.adaptation.base import return_all_adapt_info

    from chainrunner.adapters._blackjax import _warmup_cross_chain as cc

    o, n = kernel(adaptation).options, start.shape[0]
    key = jax.random.fold_in(jax.random.key(0), cc._CROSS_CHAIN_SALT)

    def chees(key, x):
        warmup = blackjax.chees_adaptation(
            logdensity, n, jitter_amount=o["jitter_amount"],
            target_acceptance_rate=o["target_acceptance_rate"], decay_rate=o["decay_rate"],
            max_leapfrog_steps=o["max_leapfrog_steps"], adaptation_info_fn=return_all_adapt_info,
        )  # fmt: skip
        adam = optax.adam(o["learning_rate"])
        (_, p), info = warmup.run(key, x, o["step_size"], adam, num_warmup,
                                  max_sampling_steps=2**20 - num_warmup)  # fmt: skip
        steps = p["integration_steps_params"][0]
        return info.state.position, {"step_size": p["step_size"], "num_leapfrog_steps": steps}

    def meads(key, x):
        warmup = blackjax.meads_adaptation(
            logdensity, n, num_folds=cc.meads_folds(n, o["num_folds"]),
            step_size_multiplier=o["step_size_multiplier"],
            damping_slowdown=o["damping_slowdown"], adaptation_info_fn=return_all_adapt_info,
        )  # fmt: skip
        (_, p), info = warmup.run(key, x, num_warmup)
        names = ("step_size", "momentum_inverse_scale", "alpha", "delta")
        return info.state.position, {k: p[k] for k in names}

    positions, params = jax.jit(chees if adaptation == "chees" else meads)(key, start)
    return np.swapaxes(np.asarray(positions), 0, 1), params


@pytest.mark.parametrize("adaptation", ["chees", "meads"])
def test_one_implementation_that_is_blackjaxs_run(adaptation):
    # layout="replicated" (every device steps all chains in one vmap) is blackjax's own run,
    # bitwise; the sharded default at the same width (all chains in one vmap, one device)
    # to float32 round-off (measured: bitwise for ChEES, 2e-7 relative for MEADS).
    draws, params = blackjax_run(adaptation)
    replicated = run(adaptation, 2, options={"layout": "replicated"})
    np.testing.assert_array_equal(replicated.warmup_draws, draws)
    for name, value in params.items():
        got = np.asarray(replicated.kernel_params[name])
        np.testing.assert_array_equal(got, np.asarray(jax.tree.leaves(value)[0]))
    sharded = run(adaptation, 1, batch_size=None)
    np.testing.assert_allclose(sharded.warmup_draws, draws, rtol=1e-4, atol=1e-5)


def test_replicated_layout_still_works():
    one = run("chees", 1, options={"layout": "replicated"})
    three = run("chees", 3, options={"layout": "replicated"}, batch_size=2)
    assert_same(one, three)  # blackjax's run, every device all chains: any layout
    with pytest.raises(ValueError, match="layout must be"):
        kernel("chees", layout="gspmd")


@pytest.mark.parametrize("adaptation", ["chees", "meads"])
def test_sharded_warmup_samples_correctly(adaptation):
    # 16 chains over 4 devices; moments within 5 Monte-Carlo standard errors.
    start = jax.random.normal(jax.random.key(9), (16, 3)) * 2.0
    trace = cr.run(kernel(adaptation), jax.random.key(2), start, 300, num_warmup=300,
                   mesh=cr.chain_mesh(4), **KW)  # fmt: skip
    x = trace.draws.astype(np.float64)
    for i in range(3):
        m, s = x[..., i].mean(), x[..., i].std()
        assert abs(m - MEAN[i]) < 5 * mcse(x[..., i]), (i, m)
        assert abs(s - SD[i]) < 5 * mcse_sd(x[..., i]), (i, s)
    assert trace.stats["acceptance_rate"].mean() > 0.4
