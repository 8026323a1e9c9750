"""A run killed in its warmup (tests/test_warmup_chunks.py): each adaptation's kernel
(the test module's too), and its run with a checkpoint; run as a script, the run a test
kills. Not a test module
(conftest's ``collect_ignore``)."""

import sys

import blackjax
import jax
import jax.numpy as jnp

import chainrunner as cr

NUM_WARMUP = 2000  # 40 chunks of 50: the kill comes long before the warmup's end
# blackjax's algorithm of each adaptation (HMC of 5 steps for its one-call adaptations)
FACTORY = {
    "window": blackjax.nuts, "fisher": blackjax.nuts, "fisher_low_rank": blackjax.nuts,
    "pooled": blackjax.nuts, "chees": blackjax.dynamic_hmc, "meads": blackjax.ghmc,
    "window_low_rank": blackjax.hmc, "staged": blackjax.hmc, "pathfinder": blackjax.hmc,
    "mclmc": blackjax.mclmc, "adjusted_mclmc": blackjax.adjusted_mclmc_dynamic,
}  # fmt: skip
# adapted in the sampling loop: checkpointed as sampling is (``manifest.json``)
IN_LOOP = ("window", "fisher", "fisher_low_rank")


SD = jnp.array([1.0, 3.0, 0.3])
START = jax.random.normal(jax.random.key(3), (8, 3)) * 2.0  # dispersed (MEADS: 2 folds)


def logdensity(x):
    return -0.5 * jnp.sum((x / SD) ** 2)


def kernel(adaptation):
    options = {"adaptation": adaptation}
    if adaptation == "pooled":
        options = {"adaptation": "fisher", "pooled": True}
    if FACTORY[adaptation] is blackjax.hmc:
        options["num_integration_steps"] = 5
    return cr.from_blackjax(FACTORY[adaptation], logdensity_fn=logdensity, **options)


def keeps(adaptation):
    """Whether the warmup keeps its draws (blackjax's MCLMC tuners return none)."""
    return "mclmc" not in adaptation


def warmup_run(adaptation, checkpoint=None):
    return cr.run(kernel(adaptation), jax.random.key(1), START, 100, num_warmup=NUM_WARMUP,
                  keep_warmup=keeps(adaptation), chunk_size=50, mesh=cr.chain_mesh(2),
                  progress=False, warn=False, checkpoint=checkpoint)  # fmt: skip


if __name__ == "__main__":
    warmup_run(sys.argv[1], sys.argv[2])
