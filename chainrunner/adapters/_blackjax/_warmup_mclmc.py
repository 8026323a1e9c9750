"""blackjax's MCLMC tuner as steps, one chain at a time: the warmup ``run`` runs in chunks.

``blackjax.mclmc_find_L_and_step_size`` tunes a chain in three phases, each a
``lax.scan`` inside one call:

1. ``frac_tune1 + frac_tune2`` of ``num_steps``: the step size from the energy error
   (its streaming estimate), and, over the second part, the posterior's variances;
2. with ``diagonal_preconditioning`` (and a second part of two steps or more): a third
   of the second part's steps again, from a fresh estimate, with those variances as the
   inverse mass matrix;
3. ``frac_tune3`` of ``num_steps`` (two steps or more): plain steps whose effective
   sample size sets ``L``.

Here the same algorithm (blackjax 1.7.1's steps, keys and updates, with blackjax's
kernel, ``handle_nans`` and ``effective_sample_size``) runs as one step function over
the three phases' keys in order: a step knows its phase by its number, the ends of
phases 1 and 2 are applied after their last step, and phase 3's ``L`` when the last
step is done. So ``run`` can stop, write and resume the tuning between any two steps,
and each chain's result is blackjax's own call's, within float rounding.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree


class PerChain(NamedTuple):
    """One chain's warmup as its steps.

    ``carry``: before the first step (or a function of no argument that gives it, traced
    only where the first chunk computes it); ``step(carry, (i, key)) -> (carry, None)``: step
    ``i`` (a ``lax.scan`` body); ``keys``: every step's key, in order;
    ``finish(carry, done) -> (sampler state, parameters)`` after ``done`` steps (the
    parameters adapted so far when ``done`` is short of ``len(keys)``); ``kept``:
    ``None``, or ``kept(carry) -> (positions, stats)`` of every step (leading axis: the
    steps), the warmup draws (``keep_warmup``).
    """

    carry: Any
    step: Callable
    keys: Any
    finish: Callable
    kept: Callable | None = None


class Phases(NamedTuple):
    """The steps of each phase: ``first`` (of which ``n1`` unweighted), ``second``
    (phase 2, the rerun with the mass matrix) and ``third`` (phase 3, for ``L``)."""

    n1: int
    first: int
    second: int
    third: int

    @property
    def total(self) -> int:
        return self.first + self.second + self.third


def phases(num_steps: int, options: dict) -> Phases:
    """The phases' step counts, as blackjax 1.7.1 rounds them.

    Examples:
        >>> from chainrunner.adapters._blackjax._warmup_mclmc import phases
        >>> phases(1000, {}).total  # 100 + 100, 33 again, 100
        333
    """
    o = with_defaults(options)
    n1, n2 = round(num_steps * o["frac_tune1"]), round(num_steps * o["frac_tune2"])
    second = round(n2 / 3) if o["diagonal_preconditioning"] and n2 > 1 else 0
    n3 = round(num_steps * o["frac_tune3"])
    return Phases(n1, n1 + n2, second, n3 if n3 >= 2 else 0)


class Carry(NamedTuple):
    """One chain's tuning: the sampler's ``state``; ``params`` (``L``, ``step_size``,
    ``inverse_mass_matrix``) the kernel steps with; ``estimate``, the step size's
    streaming estimate (time, weighted average, largest step size); ``moments``, the
    weighted means of ``x`` and ``x**2`` (phase 1); ``L``, the length phases 1-2 found;
    ``samples``, phase 3's positions (flat)."""

    state: Any
    params: Any
    estimate: tuple
    moments: tuple
    L: jax.Array
    samples: jax.Array


def defaults_of(function: Callable, options: dict) -> dict:
    """``options`` and, for the rest, ``function``'s defaults (read from its signature)."""
    import inspect

    signature = inspect.signature(function).parameters
    defaults = {k: p.default for k, p in signature.items() if p.default is not p.empty}
    return {**defaults, **options}


def with_defaults(options: dict) -> dict:
    """``options`` with blackjax's ``mclmc_find_L_and_step_size`` defaults."""
    import blackjax

    return defaults_of(blackjax.mclmc_find_L_and_step_size, options)


class Tuning(NamedTuple):
    """What every step of one chain's tuning reads: blackjax's ``kernel`` and the target,
    the options (``o``, with blackjax's defaults), the ``phases``, the position's size
    and dtype."""

    kernel: Callable
    logdensity_fn: Callable
    o: dict
    ph: Phases
    dim: int
    dtype: Any

    def fresh(self) -> tuple:
        """The step size's estimate before its first step (time, average, largest)."""
        zero = jnp.zeros((), self.dtype)
        return zero, zero, jnp.full((), jnp.inf, self.dtype)


def mclmc_steps(
    kernel: Callable, logdensity_fn: Callable, init: Callable, options: dict
) -> Callable:
    """``(rng_key, position, num_steps) -> PerChain``: ``mclmc_find_L_and_step_size(kernel,
    num_steps, init(position, logdensity_fn, init_key), tune_key, **options)`` as steps,
    with ``init_key, tune_key = split(rng_key)``."""
    from blackjax.adaptation.mclmc_adaptation import MCLMCAdaptationState

    o = with_defaults(options)

    def build(rng_key, position, num_steps):
        init_key, tune_key = jax.random.split(rng_key)
        state = init(position, logdensity_fn, init_key)
        flat = ravel_pytree(state.position)[0]
        t = Tuning(kernel, logdensity_fn, o, phases(num_steps, o), flat.shape[0], flat.dtype)
        params = o["params"] or MCLMCAdaptationState(
            jnp.sqrt(t.dim), jnp.sqrt(t.dim) * 0.25, inverse_mass_matrix=jnp.ones((t.dim,))
        )
        params = jax.tree.map(lambda x: jnp.asarray(x, t.dtype), params)
        moments = (jnp.zeros((), t.dtype), jnp.zeros((2, t.dim), t.dtype))
        carry = Carry(state, params, t.fresh(), moments, params.L,
                      jnp.zeros((t.ph.third, t.dim), t.dtype))  # fmt: skip
        if t.ph.first == 0:  # no tuning steps: phase 3 starts from the initial values
            carry = _end_of_second(_end_of_first(t, carry))
        part1, part2 = jax.random.split(tune_key)
        first = jax.random.split(part1, t.ph.first + 1)
        keys = [first[:-1], jax.random.split(first[-1], t.ph.second),
                jax.random.split(part2, t.ph.third)]  # fmt: skip
        return PerChain(carry, functools.partial(_step, t), jnp.concatenate(keys),
                        functools.partial(_finish, t))  # fmt: skip

    return build


def _step(t: Tuning, c: Carry, x: tuple) -> tuple[Carry, None]:
    """Step ``i`` of the tuning (``x = (i, key)``), in whichever phase it falls, then
    the end of phase 1 or 2 where it is their last."""
    i, key = x
    tuning = i < t.ph.first + t.ph.second
    split, nan_key = jax.random.split(key)  # the predictor's keys (phases 1-2)
    data = jnp.where(tuning, jax.random.key_data(split), jax.random.key_data(key))
    new, info = _kernel_step(t, c, jax.random.wrap_key_data(data, impl=jax.random.key_impl(key)))
    c = _unless_sampled(tuning, lambda c: _tuned(t, c, i, new, info, nan_key),
                        lambda c: c._replace(state=new), c)  # fmt: skip
    c = _sampled(t, c, i, tuning)
    c = _unless_sampled(i + 1 == t.ph.first, functools.partial(_end_of_first, t), _same, c)
    return _unless_sampled(i + 1 == t.ph.first + t.ph.second, _end_of_second, _same, c), None


def _same(c: Carry) -> Carry:
    return c


def _unless_sampled(condition: jax.Array, a: Callable, b: Callable, c: Carry) -> Carry:
    """``a(c)`` if ``condition``, else ``b(c)``, as a ``lax.cond`` (one branch runs where
    the chains are not vmapped); neither touches the samples (no select of the buffer)."""
    samples = c.samples
    c = jax.lax.cond(condition, a, b, c._replace(samples=None))
    return c._replace(samples=samples)


def _kernel_step(t: Tuning, c: Carry, key: jax.Array) -> tuple:
    p = c.params
    return t.kernel(rng_key=key, state=c.state, logdensity_fn=t.logdensity_fn,
                    inverse_mass_matrix=p.inverse_mass_matrix, L=p.L,
                    step_size=p.step_size)  # fmt: skip


def _tuned(t: Tuning, c: Carry, i: jax.Array, new: Any, info: Any, nan_key: jax.Array) -> Carry:
    """Phases 1-2 after the kernel's step ``new``: blackjax's predictor (the step size
    from the energy error) and, in phase 1, the weighted moments."""
    from blackjax.adaptation.mclmc_adaptation import handle_nans
    from blackjax.util import incremental_value_update

    p, o = c.params, t.o
    time, x_average, largest = c.estimate
    ok, new, largest, change = handle_nans(
        c.state, new, p.step_size, largest, info.energy_change, info.nonans, nan_key
    )
    n_eff = o["num_effective_samples"]
    decay = (n_eff - 1.0) / (n_eff + 1.0)
    xi = jnp.square(change) / (t.dim * o["desired_energy_var"]) + 1e-8
    weight = jnp.exp(-0.5 * jnp.square(jnp.log(xi) / (6.0 * o["trust_in_estimate"])))
    x_average = decay * x_average + weight * (xi / jnp.power(p.step_size, 6.0))
    time = decay * time + weight
    step_size = jnp.power(x_average / time, -1.0 / 6.0)
    step_size = (step_size < largest) * step_size + (step_size > largest) * largest
    x = ravel_pytree(new.position)[0]
    mask = jnp.where(i >= t.ph.n1, 1.0, 0.0).astype(t.dtype)
    moments = incremental_value_update(
        jnp.array([x, jnp.square(x)]), c.moments, weight=mask * ok * step_size
    )
    return c._replace(state=new, params=p._replace(step_size=step_size),
                      estimate=(time, x_average, largest),
                      moments=jax.tree.map(functools.partial(jnp.where, i < t.ph.first),
                                           moments, c.moments))  # fmt: skip


def _sampled(t: Tuning, c: Carry, i: jax.Array, tuning: jax.Array) -> Carry:
    """In phase 3 (not ``tuning``), the position the step reached kept in its row."""
    if not t.ph.third:
        return c
    row = jnp.clip(i - t.ph.first - t.ph.second, 0, t.ph.third - 1)
    x = jnp.where(tuning, c.samples[row], ravel_pytree(c.state.position)[0])
    return c._replace(samples=c.samples.at[row].set(x))


def _end_of_first(t: Tuning, c: Carry) -> Carry:
    """After phase 1: ``L`` from the variances (with a second part of two steps or
    more); with ``diagonal_preconditioning``, the variances as the inverse mass matrix
    and a fresh estimate for phase 2."""
    if t.ph.first - t.ph.n1 <= 1:
        return c._replace(L=c.params.L)
    average = c.moments[1]
    variances = average[1] - jnp.square(average[0])
    if not t.o["diagonal_preconditioning"]:
        return c._replace(L=jnp.sqrt(jnp.sum(variances)))
    params = c.params._replace(inverse_mass_matrix=variances)
    return c._replace(params=params, estimate=t.fresh(), L=jnp.sqrt(t.dim).astype(t.dtype))


def _end_of_second(c: Carry) -> Carry:
    """After phase 2: the parameters phase 3 steps with (``L`` from phase 1)."""
    return c._replace(params=c.params._replace(L=c.L))


def _finish(t: Tuning, c: Carry, done: jax.Array) -> tuple[Any, dict]:
    """The chain's state and parameters after ``done`` steps: phase 3's ``L`` (from the
    effective sample size of its positions) once every step is done."""
    from blackjax.diagnostics import effective_sample_size

    p = c.params
    if t.ph.third:
        tau = t.ph.third / effective_sample_size(c.samples[None, ...])
        finite = jnp.isfinite(tau)
        L = t.o["l_factor"] * p.step_size * jnp.mean(tau, where=finite)
        L = jnp.where(jnp.any(finite) & (done == t.ph.total), L, p.L)
        p = p._replace(L=L)
    return c.state, {"L": p.L, "step_size": p.step_size,
                     "inverse_mass_matrix": p.inverse_mass_matrix}  # fmt: skip
