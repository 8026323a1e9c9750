"""blackjax's NUTS as a state machine: one leapfrog step per call, no chain waits.

Under ``vmap``, blackjax's NUTS (two nested ``while_loop``s: the doublings, and the
leapfrog steps of each doubling) runs every chain of a batch until the longest trajectory
of the batch ends: at every draw each chain waits for the slowest. Dance, Glaser, Orbanz
& Adams (ICML 2025) recast NUTS as a finite-state machine instead: each vmapped *tick*
advances every chain by one leapfrog step of its own trajectory, and a chain whose
transition ends starts its next one at the next tick. A batch then waits for its slowest
chain once per chunk of draws, not once per draw.

This module is that machine, written from the paper's idea on blackjax's own pieces
(``blackjax.mcmc.trajectory``, ``proposal``, ``termination``, ``integrators``,
``metrics``), called in the same order with the same keys as blackjax's iterative NUTS
(``nuts.build_kernel``: ``trajectory.dynamic_multiplicative_expansion`` over
``dynamic_progressive_integration``): multinomial sampling within a doubling, biased
progressive sampling across doublings, numpyro's iterative U-turn checkpoints, the
divergence threshold, the maximum number of doublings. So a chain's transition is
blackjax's, to XLA's rounding: ``tests/test_nuts_fsm.py`` checks it draw for draw.

``begin(rng_key, state, step_size, inverse_mass_matrix)`` starts a transition from an
``HMCState``; ``tick(machine)`` does one leapfrog step; ``machine.done`` says the
transition has ended; ``result(machine)`` is ``(HMCState, NUTSInfo)``, as
``blackjax.nuts(...).step`` returns them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ...core._lazy import lazy_cond

__all__ = ["Machine", "NutsMachine", "nuts_machine"]


class Machine(NamedTuple):
    """One chain's NUTS transition in progress.

    The transition's fields (blackjax's ``DynamicExpansionState`` and what ``propose``
    keeps): ``key`` (the integrator's key), ``step_size``, ``initial_energy``,
    ``momentum`` (the transition's initial momentum, for ``NUTSInfo``), ``doubling``
    (expansions done), ``proposal``, ``trajectory``, ``termination`` (the U-turn
    checkpoints), ``diverging``, ``turning``; the current doubling's
    (``DynamicIntegrationState`` and its keys): ``direction``, ``leaf`` (leapfrog steps
    done in it), ``sub_proposal``, ``sub_trajectory``, ``sub_diverging``,
    ``sub_terminated``, ``trajectory_key``, ``proposal_key``; and ``done``.
    """

    key: Any
    step_size: Any
    initial_energy: Any
    momentum: Any
    doubling: Any
    proposal: Any
    trajectory: Any
    termination: Any
    diverging: Any
    turning: Any
    direction: Any
    leaf: Any
    sub_proposal: Any
    sub_trajectory: Any
    sub_diverging: Any
    sub_terminated: Any
    trajectory_key: Any
    proposal_key: Any
    done: Any


class NutsMachine(NamedTuple):
    """The machine's functions (see the module's docstring): ``begin(rng_key, state,
    step_size)``, ``tick(machine)``, ``result(machine)``."""

    begin: Callable
    tick: Callable
    result: Callable


def _where(flag: jax.Array, a: Any, b: Any) -> Any:
    return jax.tree.map(lambda x, y: jnp.where(flag, x, y), a, b)


class Config(NamedTuple):
    """What a machine is built from, besides the inverse mass matrix (static)."""

    logdensity_fn: Callable
    integrator: Callable
    max_num_doublings: int
    divergence_threshold: float


class Parts(NamedTuple):
    """blackjax's pieces for one inverse mass matrix (``parts``)."""

    config: Config
    metric: Any
    step: Callable
    generate_proposal: Callable
    new_termination: Callable
    update_termination: Callable
    is_criterion_met: Callable


def parts(config: Config, imm: Any) -> Parts:
    """The metric, integrator, proposal and U-turn functions that ``blackjax.nuts``'s
    kernel builds at every step, for ``imm``."""
    from blackjax.mcmc import metrics, proposal, termination, trajectory

    metric = metrics.default_metric(imm)
    new, update, met = termination.iterative_uturn_numpyro(metric.check_turning)
    _, generate = proposal.proposal_generator(trajectory.hmc_energy(metric.kinetic_energy))
    step = config.integrator(config.logdensity_fn, metric.kinetic_energy)
    return Parts(config, metric, step, generate, new, update, met)


def nuts_machine(
    logdensity_fn: Callable,
    *,
    max_num_doublings: int = 10,
    divergence_threshold: float = 1000,
    integrator: Callable | None = None,
) -> Callable:
    """``make(inverse_mass_matrix) -> NutsMachine``: blackjax's NUTS, one leapfrog per tick.

    The arguments are ``blackjax.nuts``'s (the step size is ``begin``'s, so that one
    program serves every step size); ``inverse_mass_matrix`` is given to ``make`` (a
    metric is built from it, as blackjax's kernel builds one at every step).

    Examples:
        >>> import blackjax, jax, jax.numpy as jnp
        >>> logdensity = lambda x: -0.5 * jnp.sum(x**2)
        >>> machine = nuts_machine(logdensity)(jnp.ones(2))
        >>> state = blackjax.nuts(logdensity, 0.5, jnp.ones(2)).init(jnp.ones(2))
        >>> m = machine.begin(jax.random.key(0), state, jnp.float32(0.5))
        >>> m = jax.lax.while_loop(lambda q: ~q.done, machine.tick, m)
        >>> new, info = machine.result(m)
        >>> int(info.num_integration_steps) == int(m.trajectory.num_states)
        True
    """
    from blackjax.mcmc import integrators

    config = Config(
        logdensity_fn,
        integrators.velocity_verlet if integrator is None else integrator,
        int(max_num_doublings),
        float(divergence_threshold),
    )

    def make(imm: Any) -> NutsMachine:
        return NutsMachine(
            functools.partial(_begin, config, imm),
            functools.partial(_tick, config, imm),
            _result,
        )

    return make


def _subtree(p: Parts, m: Machine) -> Machine:
    """The next doubling's start (``expand_once`` up to the integration)."""
    from blackjax.mcmc import trajectory

    subkey = jax.random.fold_in(m.key, m.doubling)
    direction_key, trajectory_key, proposal_key = jax.random.split(subkey, 3)
    direction = jnp.where(jax.random.bernoulli(direction_key), 1, -1)
    start = _where(direction > 0, m.trajectory.rightmost_state, m.trajectory.leftmost_state)
    return m._replace(
        direction=direction,
        leaf=jnp.zeros((), jnp.int32),
        sub_proposal=p.generate_proposal(m.initial_energy, start),
        sub_trajectory=trajectory.Trajectory(start, start, start.momentum, 0),
        sub_diverging=jnp.bool_(False),
        sub_terminated=jnp.bool_(False),
        trajectory_key=trajectory_key,
        proposal_key=proposal_key,
    )


def _begin(config: Config, imm: Any, rng_key: jax.Array, state: Any,
           step_size: jax.Array) -> Machine:  # fmt: skip
    """A transition from ``state`` (blackjax's ``kernel`` and ``propose``)."""
    from blackjax.mcmc import integrators, proposal, trajectory

    p = parts(config, imm)
    key_momentum, key_integrator = jax.random.split(rng_key, 2)
    position, logdensity, logdensity_grad = state
    momentum = p.metric.sample_momentum(key_momentum, position)
    start = integrators.IntegratorState(position, momentum, logdensity, logdensity_grad)
    energy = -start.logdensity + p.metric.kinetic_energy(start.momentum)
    initial = proposal.Proposal(
        start, energy, jnp.zeros_like(energy), jnp.full_like(energy, -np.inf)
    )
    m = Machine(
        key=key_integrator,
        step_size=step_size,
        initial_energy=energy,
        momentum=momentum,
        doubling=jnp.zeros((), jnp.int32),
        proposal=initial,
        trajectory=trajectory.Trajectory(start, start, start.momentum, 0),
        termination=p.new_termination(start, config.max_num_doublings),
        diverging=jnp.bool_(False),
        turning=jnp.bool_(False),
        direction=None,
        leaf=None,
        sub_proposal=None,
        sub_trajectory=None,
        sub_diverging=None,
        sub_terminated=None,
        trajectory_key=None,
        proposal_key=None,
        done=jnp.bool_(False),
    )
    return jax.tree.map(_strong, _subtree(p, m))


def _leapfrog(p: Parts, m: Machine) -> Machine:
    """One step of the doubling (``add_one_state``)."""
    from blackjax.mcmc import proposal, trajectory

    key = jax.random.fold_in(m.trajectory_key, m.leaf)
    new_state = p.step(m.sub_trajectory.rightmost_state, m.direction * m.step_size)
    new_proposal = p.generate_proposal(m.initial_energy, new_state)
    diverging = -new_proposal.weight > p.config.divergence_threshold
    first = m.leaf == 0
    new_trajectory = _where(
        first,
        trajectory.Trajectory(new_state, new_state, new_state.momentum, 1),
        trajectory.append_to_trajectory(m.sub_trajectory, new_state),
    )
    sampled = _where(
        first, new_proposal,
        proposal.progressive_uniform_sampling(key, m.sub_proposal, new_proposal),
    )  # fmt: skip
    checkpoints = p.update_termination(
        m.termination, new_trajectory.momentum_sum, new_state.momentum, m.leaf
    )
    terminated = p.is_criterion_met(checkpoints, new_trajectory.momentum_sum, new_state.momentum)
    return m._replace(
        leaf=m.leaf + 1, sub_proposal=sampled, sub_trajectory=new_trajectory,
        termination=checkpoints, sub_diverging=diverging, sub_terminated=terminated,
    )  # fmt: skip


def _merge(p: Parts, m: Machine) -> Machine:
    """The doubling's end (the rest of ``expand_once``)."""
    from blackjax.mcmc import proposal, trajectory

    sub = m.sub_trajectory
    flipped = trajectory.Trajectory(
        sub.rightmost_state, sub.leftmost_state, sub.momentum_sum, sub.num_states
    )
    new_trajectory = _where(m.direction > 0, sub, flipped)
    rejected = m.sub_diverging | m.sub_terminated
    kept = m.proposal._replace(
        sum_log_p_accept=jnp.logaddexp(m.proposal.sum_log_p_accept, m.sub_proposal.sum_log_p_accept)
    )
    sampled = proposal.progressive_biased_sampling(m.proposal_key, m.proposal, m.sub_proposal)
    left, right = _where(
        m.direction > 0, (m.trajectory, new_trajectory), (new_trajectory, m.trajectory)
    )
    merged = trajectory.merge_trajectories(left, right)
    turning = p.metric.check_turning(
        merged.leftmost_state.momentum, merged.rightmost_state.momentum, merged.momentum_sum
    )
    doubling = m.doubling + 1
    turning = m.sub_terminated | turning
    done = (doubling >= p.config.max_num_doublings) | m.sub_diverging | turning
    return m._replace(
        doubling=doubling, proposal=_where(rejected, kept, sampled), trajectory=merged,
        diverging=m.sub_diverging, turning=turning, done=done,
    )  # fmt: skip


def _turn(config: Config, operand: tuple) -> Any:
    """A doubling's end: its merge, then the next one's start unless the transition
    ended. ``operand``: ``(machine, inverse mass matrix)``."""
    m, imm = operand
    p = parts(config, imm)
    merged = _merge(p, m)
    return _where(merged.done, merged, _subtree(p, merged)), imm


def _tick(config: Config, imm: Any, m: Machine) -> Machine:
    """One leapfrog step; at a doubling's end its merge, and the next doubling's start
    unless the transition ended (an ended machine is left as it is). Under ``vmap`` the
    doubling's end runs only at ticks where some chain needs it (``lazy_cond``: its
    branches get the inverse mass matrix as an operand, never closed over)."""
    stepped = _where(m.done, m, _leapfrog(parts(config, imm), m))
    ended = ~m.done & (
        (stepped.leaf >= 2**stepped.doubling) | stepped.sub_terminated | stepped.sub_diverging
    )
    turned, _ = lazy_cond(ended, functools.partial(_turn, config), lambda x: x, (stepped, imm))
    return turned


def _result(m: Machine) -> tuple[Any, Any]:
    """``(HMCState, NUTSInfo)`` of an ended transition (``propose``'s return)."""
    from blackjax.mcmc import hmc, nuts

    state = m.proposal.state
    acceptance = jnp.exp(m.proposal.sum_log_p_accept) / m.trajectory.num_states
    info = nuts.NUTSInfo(
        m.momentum, m.diverging, m.turning, m.proposal.energy, m.trajectory.leftmost_state,
        m.trajectory.rightmost_state, m.doubling, m.trajectory.num_states, acceptance,
    )  # fmt: skip
    return hmc.HMCState(state.position, state.logdensity, state.logdensity_grad), info


def _strong(x: Any) -> Any:
    """``x`` as an array of a definite dtype (a Python number becomes weakly typed)."""
    return jnp.asarray(x)
