"""blackjax's adjusted MCLMC tuner as steps, one chain at a time: ``run`` drives it in chunks.

``blackjax.adjusted_mclmc_find_L_and_step_size`` tunes a chain in passes, each a
``lax.scan`` inside one call. Per window (``num_windows``, 1 by default):

1. ``frac_tune1 + frac_tune2`` of ``num_steps``: dual averaging of the step size towards
   ``target`` over the first part; the posterior's moments over the second. Then ``L``
   and the step size from the variances (and, with ``diagonal_preconditioning``, the
   variances as the inverse mass matrix);
2. with a second part: ``frac_tune1`` of the steps again, dual averaging afresh.

With ``frac_tune3`` (0 by default), per window: plain steps whose effective sample size
sets ``L``, then a pass of dual averaging with ``L`` fixed. Last, ``L`` is
``target_num_integration_steps`` step sizes.

Here the same algorithm (blackjax 1.7.1's passes, keys and updates, with blackjax's
kernel, ``handle_nans``, dual averaging and ``effective_sample_size``) runs as one step
function over every pass's keys in order (``Segment``): a step knows its pass by its
number, and what comes between two passes is applied after the last step of the first.
Each chain's result is blackjax's own call's, within float rounding.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from ._warmup_mclmc import PerChain, defaults_of


class Segment(NamedTuple):
    """A pass of the tuning: its ``keys``; ``averaging`` (dual averaging) or plain steps
    for ``L``; ``mask``: how many of its first steps update the step size (the rest
    gather moments); ``fix_L``; ``end(t, carry) -> carry``, applied after its last step
    (with the start of the next pass)."""

    keys: Any
    averaging: bool
    mask: int
    fix_L: bool
    end: Callable


class Tuning(NamedTuple):
    """What every step reads: blackjax's ``kernel``, the target, the options ``o``
    (blackjax's defaults filled in), the position's size and dtype."""

    kernel: Callable
    logdensity_fn: Callable
    o: dict
    dim: int
    dtype: Any


class Carry(NamedTuple):
    """One chain's tuning: the sampler's ``state``, the ``params`` it steps with, the
    dual averaging state ``da``, the ``largest`` step size without NaNs, the
    ``moments`` (weighted means of ``x`` and ``x**2``), the plain steps' ``samples``."""

    state: Any
    params: Any
    da: Any
    largest: jax.Array
    moments: tuple
    samples: jax.Array


def with_defaults(options: dict) -> dict:
    """``options`` with blackjax's ``adjusted_mclmc_find_L_and_step_size`` defaults."""
    import blackjax

    return defaults_of(blackjax.adjusted_mclmc_find_L_and_step_size, options)


def counts(num_steps: int, options: dict) -> tuple[int, int, int]:
    """``(n1, n2, n3)``: each window's steps of ``frac_tune1..3``, as blackjax truncates
    them."""
    o = with_defaults(options)
    w = o["num_windows"]
    return tuple(int(num_steps * (o[f"frac_tune{k}"] / w)) for k in (1, 2, 3))


def total_steps(num_steps: int, options: dict) -> int:
    """How many steps the tuning takes.

    Examples:
        >>> from chainrunner.adapters._blackjax._warmup_adjusted_mclmc import total_steps
        >>> total_steps(1500, {"target": 0.9})  # 150 + 150, then 150 again
        450
    """
    o = with_defaults(options)
    n1, n2, n3 = counts(num_steps, o)
    per_window = n1 + n2 + (n1 if n2 else 0)
    third = n3 + n1 if o["frac_tune3"] != 0 else 0
    return o["num_windows"] * (per_window + third)


def adjusted_steps(kernel: Callable, logdensity_fn: Callable, init: Callable,
                   options: dict) -> Callable:  # fmt: skip
    """``(rng_key, position, num_steps) -> PerChain``:
    ``adjusted_mclmc_find_L_and_step_size(kernel, logdensity_fn, num_steps, init(position,
    logdensity_fn, init_key), tune_key, **options)`` as steps, with ``init_key, tune_key
    = split(rng_key)``."""
    from blackjax.adaptation.mclmc_adaptation import MCLMCAdaptationState

    o = with_defaults(options)

    def build(rng_key, position, num_steps):
        init_key, tune_key = jax.random.split(rng_key)
        state = init(position, logdensity_fn, init_key)
        flat = ravel_pytree(state.position)[0]
        t = Tuning(kernel, logdensity_fn, o, flat.shape[0], flat.dtype)
        params = o["params"] or MCLMCAdaptationState(
            jnp.sqrt(t.dim), jnp.sqrt(t.dim) * 0.2, inverse_mass_matrix=jnp.ones((t.dim,))
        )
        params = params._replace(L=o["target_num_integration_steps"] * params.step_size)
        params = jax.tree.map(lambda x: jnp.asarray(x, t.dtype), params)
        segments = _segments(o, num_steps, tune_key)
        if any(len(s.keys) == 0 for s in segments):
            raise ValueError(
                f"run: the warmup is too short for adaptation='adjusted_mclmc': each of its "
                f"passes needs a step, and num_steps={num_steps} gives one none "
                f"({counts(num_steps, o)} steps of frac_tune1..3 per window); pass a "
                "longer num_warmup."
            )
        n3 = max([len(s.keys) for s in segments if not s.averaging], default=0)
        c = Carry(state, params, None, None, None, jnp.zeros((n3, t.dim), t.dtype))
        c = _begin(t, c)
        ends = np.cumsum([len(s.keys) for s in segments])
        keys = jnp.concatenate([s.keys for s in segments])
        plan = _Plan(tuple(segments), ends, _per_step(segments))
        return PerChain(c, functools.partial(_step, t, plan), keys,
                        functools.partial(_finish, t, int(ends[-1])))  # fmt: skip

    return build


class _Plan(NamedTuple):
    segments: tuple
    ends: np.ndarray
    per_step: tuple  # (averaging, mask, fix_L), a value per step


def _per_step(segments: list[Segment]) -> tuple:
    averaging, mask, fix_l = [], [], []
    for s in segments:
        n = len(s.keys)
        averaging += [s.averaging] * n
        mask += [1.0] * min(s.mask, n) + [0.0] * (n - min(s.mask, n))
        fix_l += [s.fix_L] * n
    return np.array(averaging), np.array(mask, np.float32), np.array(fix_l)


def _segments(o: dict, num_steps: int, tune_key: jax.Array) -> list[Segment]:
    """blackjax's passes in order, with their keys (its splits and folds)."""
    n1, n2, n3 = counts(num_steps, o)
    pass1_fix_l = True if o["target_num_integration_steps"] is not None else False
    part1, part2 = jax.random.split(tune_key)
    out = []
    for i in range(o["num_windows"]):
        _, key = jax.random.split(jax.random.fold_in(part1, i))
        first, second = jax.random.split(key)
        end = functools.partial(_end_of_first, n2 != 0, True)
        out.append(Segment(jax.random.split(first, n1 + n2), True, n1, pass1_fix_l, end))
        if n2:
            out.append(Segment(jax.random.split(second, n1), True, n1, False, _end_of_second))
    if o["frac_tune3"] != 0:
        for i in range(o["num_windows"]):
            part2 = jax.random.fold_in(part2, i)
            plain, averaged = jax.random.split(part2)
            out.append(Segment(jax.random.split(plain, n3), False, 0, False, _end_of_plain))
            _, key = jax.random.split(averaged)
            first, _ = jax.random.split(key)
            end = functools.partial(_end_of_first, False, False)
            out.append(Segment(jax.random.split(first, n1), True, n1, True, end))
    return out


def _step(t: Tuning, plan: _Plan, c: Carry, x: tuple) -> tuple[Carry, None]:
    """Step ``i`` (``x = (i, key)``) of whichever pass it falls in; after a pass's last
    step, its end."""
    i, key = x
    averaging, mask, fix_l = (jnp.asarray(a)[i] for a in plan.per_step)
    mask = mask.astype(t.dtype)
    p = c.params
    new, info = t.kernel(rng_key=key, state=c.state, logdensity_fn=t.logdensity_fn,
                         step_size=p.step_size, inverse_mass_matrix=p.inverse_mass_matrix,
                         integration_steps_params=(p.L / p.step_size,))  # fmt: skip
    samples = c.samples  # (no select of the buffer: neither branch touches it)
    c = jax.lax.cond(averaging, lambda c: _averaged(t, c, new, info, mask, fix_l),
                     lambda c: c._replace(state=new), c._replace(samples=None))  # fmt: skip
    c = _plain(c._replace(samples=samples), i, averaging, plan)
    k = jnp.searchsorted(jnp.asarray(plan.ends), i + 1)
    ends = [functools.partial(s.end, t) for s in plan.segments]
    is_end = jnp.asarray(plan.ends)[jnp.minimum(k, len(ends) - 1)] == i + 1
    return jax.lax.cond(is_end, lambda c: jax.lax.switch(k, ends, c), lambda c: c, c), None


def _averaged(t: Tuning, c: Carry, new: Any, info: Any, mask: jax.Array,
              fix_l: jax.Array) -> Carry:  # fmt: skip
    """A dual averaging step after the kernel's step ``new`` (blackjax's
    ``dual_avg_step``): the step size where ``mask`` is 1, the moments where it is 0."""
    from blackjax.adaptation.adjusted_mclmc_adaptation import _AVG_FLOOR, handle_nans
    from blackjax.adaptation.step_size import dual_averaging_adaptation
    from blackjax.util import incremental_value_update

    p = c.params
    ok, new, largest, _ = handle_nans(c.state, new, p.step_size, c.largest, info.energy)

    def with_mask(x, y):
        return mask * x + (1 - mask) * y

    _, update, _ = dual_averaging_adaptation(target=t.o["target"])
    da = jax.tree.map(with_mask, update(c.da, info.acceptance_rate), c.da)
    step_size = jax.lax.clamp(1e-5, jnp.exp(da.log_step_size), p.L / _AVG_FLOOR)
    da = da._replace(log_step_size=jnp.log(step_size))
    x = ravel_pytree(new.position)[0]
    moments = incremental_value_update(jnp.array([x, jnp.square(x)]), c.moments,
                                       weight=(1 - mask) * ok * step_size,
                                       zero_prevention=mask)  # fmt: skip
    L = jnp.where(fix_l, p.L, with_mask(p.L * (step_size / p.step_size), p.L))
    params = p._replace(step_size=with_mask(step_size, p.step_size), L=L)
    return c._replace(state=new, params=params, da=da, largest=largest, moments=moments)


def _plain(c: Carry, i: jax.Array, averaging: jax.Array, plan: _Plan) -> Carry:
    """After a plain step (for ``L``; not ``averaging``), its position kept in its
    pass's row (a row written with itself otherwise: no copy of the buffer)."""
    if not c.samples.shape[0]:
        return c
    starts = np.concatenate([[0], plan.ends[:-1]])
    row = i - jnp.asarray(starts)[jnp.searchsorted(jnp.asarray(plan.ends), i + 1)]
    row = jnp.clip(row, 0, c.samples.shape[0] - 1)
    x = jnp.where(averaging, c.samples[row], ravel_pytree(c.state.position)[0])
    return c._replace(samples=c.samples.at[row].set(x))


def _begin(t: Tuning, c: Carry) -> Carry:
    """A pass's start: dual averaging from the step size, no NaN seen, no moments."""
    from blackjax.adaptation.step_size import dual_averaging_adaptation

    initial, _, _ = dual_averaging_adaptation(target=t.o["target"])
    da = jax.tree.map(lambda x: jnp.asarray(x, t.dtype), initial(c.params.step_size))
    moments = (jnp.zeros((), t.dtype), jnp.zeros((2, t.dim), t.dtype))
    return c._replace(da=da, largest=jnp.full((), jnp.inf, t.dtype), moments=moments)


def _final_step_size(t: Tuning, c: Carry) -> Carry:
    from blackjax.adaptation.step_size import dual_averaging_adaptation

    _, _, final = dual_averaging_adaptation(target=t.o["target"])
    return c._replace(params=c.params._replace(step_size=final(c.da)))


def _end_of_first(moments: bool, first_part: bool, t: Tuning, c: Carry) -> Carry:
    """After a pass with a second part (``moments``): the step size dual averaging
    found, then ``L``, the step size (and the inverse mass matrix) from the variances."""
    from blackjax.adaptation.adjusted_mclmc_adaptation import (
        Lratio_lowerbound,
        Lratio_upperbound,
    )

    c = _final_step_size(t, c)
    p, o = c.params, t.o
    if moments:
        average = c.moments[1]
        variances = average[1] - jnp.square(average[0])
        if o["max"] == "max":
            size = jnp.sqrt(jnp.max(variances) * t.dim) * o["tuning_factor"]
        else:
            size = jnp.sqrt(jnp.sum(variances)) * o["tuning_factor"]
        change = jax.lax.clamp(Lratio_lowerbound, size / p.L, Lratio_upperbound)
        p = p._replace(L=p.L * change, step_size=p.step_size * change)
        if o["diagonal_preconditioning"]:
            p = p._replace(inverse_mass_matrix=variances)
        if first_part and o["target_num_integration_steps"] is not None:
            p = p._replace(L=o["target_num_integration_steps"] * p.step_size)
    return _begin(t, c._replace(params=p))


def _end_of_second(t: Tuning, c: Carry) -> Carry:
    """After the second pass of dual averaging: its step size."""
    return _begin(t, _final_step_size(t, c))


def _end_of_plain(t: Tuning, c: Carry) -> Carry:
    """After the plain steps: ``L`` from their effective sample size (blackjax's
    ``adjusted_mclmc_make_adaptation_L``, ``l_factor=0.5``)."""
    from blackjax.adaptation.adjusted_mclmc_adaptation import Lratio_upperbound
    from blackjax.diagnostics import effective_sample_size

    p = c.params
    contract = jnp.min if t.o["max"] == "max" else jnp.mean
    ess = contract(effective_sample_size(c.samples[None, ...])) / c.samples.shape[0]
    L = jnp.clip(0.5 * p.L / jnp.mean(ess), max=p.L * Lratio_upperbound)
    return _begin(t, c._replace(params=p._replace(L=L)))


def _finish(t: Tuning, total: int, c: Carry, done: jax.Array) -> tuple[Any, dict]:
    """The chain's state and parameters after ``done`` steps; once all are done, ``L``
    is ``target_num_integration_steps`` step sizes."""
    p = c.params
    L = jnp.where(done == total, t.o["target_num_integration_steps"] * p.step_size, p.L)
    return c.state, {"L": L, "step_size": p.step_size,
                     "inverse_mass_matrix": p.inverse_mass_matrix}  # fmt: skip
