"""ChEES and MEADS with the chains spread over the devices (the default layout).

The layout's promises: bitwise the same results on 1, 2, 3 and 8 devices and with or
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
def test_bitwise_on_1_2_3_8_devices_and_padding(adaptation):
    # 12 chains: 12 per device on 1, 6 on 2, 4 on 3, 2 on 8 (+4 padding chains), in
    # batches of 2 (auto: an eighth): one batch per device on 8. (6 chains on 8 devices,
    # one each: tests/test_warmup.py::test_cross_chain_padding_is_masked_and_layout_free.)
    one = run(adaptation, 1)
    assert "sharded" == kernel(adaptation).options["layout"]  # the default
    assert one.warmup_draws.shape == (12, 40, 3)
    for d in (2, 3, 8):
        other = run(adaptation, d)
        assert other.attrs["padded_chains"] == (4 if d == 8 else 0)
        assert_same(one, other)


@pytest.mark.parametrize("adaptation", ["chees", "meads"])
def test_same_algorithm_as_blackjax_run(adaptation):
    # At the same batch width (all chains in one vmap, one device) the sharded warmup
    # does what blackjax's run (the replicated layout) does, to float32 round-off
    # (measured: bitwise for ChEES, 2e-7 relative for MEADS, jax 0.10).
    kw = {"batch_size": None}
    sharded = run(adaptation, 1, **kw)
    replicated = run(adaptation, 1, options={"layout": "replicated"}, **kw)
    np.testing.assert_allclose(sharded.warmup_draws, replicated.warmup_draws, rtol=1e-4, atol=1e-5)
    for name, value in adapted(replicated).items():
        np.testing.assert_allclose(adapted(sharded)[name], value, rtol=1e-4)


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
