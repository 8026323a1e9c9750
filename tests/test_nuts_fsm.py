"""blackjax's NUTS as a state machine (issue 37): the same transition, tick by tick.

The machine (``adapters/_blackjax/_nuts_fsm.py``) calls blackjax's own pieces in the same
order with the same keys as ``blackjax.nuts``: run to its end, a transition equals
blackjax's, draw for draw (to XLA's rounding), with the same statistics.
"""

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from chainrunner.adapters._blackjax._nuts_fsm import nuts_machine

D = 6
A = jnp.asarray(np.random.default_rng(0).normal(size=(D, D)), jnp.float32)


def correlated(x):
    return -0.5 * jnp.sum((A @ x) ** 2) / D


def funnel(x):  # a hard target: divergences and long trajectories
    return (
        -0.5 * x[0] ** 2 / 9.0 - 0.5 * jnp.sum(x[1:] ** 2) * jnp.exp(-x[0]) - 0.5 * (D - 1) * x[0]
    )


@pytest.mark.parametrize(
    "logdensity, imm, step_size, depth",
    [(correlated, jnp.ones(D), 0.3, 10), (correlated, jnp.eye(D) * 0.5, 0.4, 3),
     (funnel, jnp.ones(D), 0.9, 10)],
)  # fmt: skip
def test_a_transition_is_blackjaxs(logdensity, imm, step_size, depth):
    """200 transitions from the same states and keys: the same draw, steps, doublings,
    divergences, U-turns, acceptance rate and energy (diagonal and dense metrics, a
    maximum depth that binds, a funnel that diverges)."""
    nuts = blackjax.nuts(logdensity, step_size, imm, max_num_doublings=depth)
    machine = nuts_machine(logdensity, max_num_doublings=depth)(imm)

    @jax.jit
    def fsm_step(key, state):
        m = machine.begin(key, state, jnp.float32(step_size))
        return machine.result(jax.lax.while_loop(lambda q: ~q.done, machine.tick, m))

    ref_step = jax.jit(nuts.step)
    state = nuts.init(jnp.ones(D))
    seen = {"diverging": 0, "max_depth": 0}
    for t in range(200):
        key = jax.random.fold_in(jax.random.key(3), t)
        (ref, ref_info), (got, info) = ref_step(key, state), fsm_step(key, state)
        np.testing.assert_allclose(got.position, ref.position, rtol=1e-5, atol=1e-6)
        for field in ("num_integration_steps", "num_trajectory_expansions", "is_divergent",
                      "is_turning"):  # fmt: skip
            assert int(getattr(info, field)) == int(getattr(ref_info, field)), (t, field)
        for field in ("acceptance_rate", "energy"):
            np.testing.assert_allclose(getattr(info, field), getattr(ref_info, field),
                                       rtol=1e-5, atol=1e-6)  # fmt: skip
        seen["diverging"] += int(info.is_divergent)
        seen["max_depth"] += int(info.num_trajectory_expansions) == depth
        state = ref
    if logdensity is funnel:
        assert seen["diverging"] > 0  # the divergence path was exercised
    if depth == 3:
        assert seen["max_depth"] > 0  # and the depth limit


def test_an_ended_machine_stays_as_it_is():
    machine = nuts_machine(correlated)(jnp.ones(D))
    nuts = blackjax.nuts(correlated, 0.3, jnp.ones(D))
    m = machine.begin(jax.random.key(0), nuts.init(jnp.ones(D)), jnp.float32(0.3))
    m = jax.lax.while_loop(lambda q: ~q.done, machine.tick, m)
    again = machine.tick(m)
    for a, b in zip(jax.tree.leaves(m), jax.tree.leaves(again), strict=True):
        if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_array_equal(a, b)
