"""A traced function cut around its main loop: what runs before it, its steps, and after.

blackjax's adaptations that are one call (``window_adaptation_low_rank``,
``staged_adaptation``, ``pathfinder_adaptation``, a built ``AdaptationAlgorithm``) run
their warmup as a ``lax.scan`` of ``num_steps`` steps between some set-up and some
finishing work. ``split_scan`` traces such a function and cuts its jaxpr there, so that a
caller can run the same computation in chunks of steps (``_warmup_tuned``):

- ``start(*args)``: the equations before the scan, giving the carry: the values computed
  from the arguments that the scan or the equations after it read, the scan's own carry,
  and a buffer for its per-step outputs;
- ``step(carry, i)``: the scan's body for step ``i`` (its ``xs`` row ``i``);
- ``finish(carry, done)``: the equations after the scan, on the carry after ``done``
  steps (the per-step outputs past ``done`` read as the last one done), giving the
  function's outputs.

The scan is the last one of ``length`` steps in the function's own equations (the calls
on the way to it, such as the ``jit`` blackjax wraps it in, are opened; the loops and
branches of other equations are not). Values that do not depend on the arguments (the
function's constants, a schedule made with numpy) stay out of the carry: each program
computes them again. A function with effects, or without such a scan, is not split
(``None``). The equations run as traced, with their own parameters: after all ``length``
steps, ``finish`` gives what the function gives, within float rounding of its one
program.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.extend.core import DropVar, Literal

# Primitives that call a jaxpr once, as it is (opened on the way to the scan).
_CALLS = frozenset({"jit", "pjit", "closed_call", "core_call"})


class Split(NamedTuple):
    """A function as set-up, ``length`` steps and finish (see the module's docstring).

    Attributes:
        length: the scan's steps.
        start: ``start(*args) -> carry`` (a list of arrays).
        step: ``step(carry, i) -> carry``: step ``i`` (``0 <= i < length``).
        finish: ``finish(carry, done) -> outputs`` (the function's pytree).
    """

    length: int
    start: Callable[..., list]
    step: Callable[[list, Any], list]
    finish: Callable[[list, Any], Any]


class _Cut(NamedTuple):
    """A jaxpr's items before its scan, the scan's equation, and the items after."""

    before: list
    scan: Any
    after: list


def split_scan(fn: Callable, length: int, *args: Any) -> Split | None:
    """``fn`` cut around its last ``lax.scan`` of ``length`` steps, or ``None``.

    ``args`` are ``fn``'s arguments, or their shapes (``jax.ShapeDtypeStruct``).

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> def f(x):
        ...     c, ys = jax.lax.scan(lambda c, a: (c * a, c), x[0], x * 2.0)
        ...     return c + ys.sum()
        >>> s = split_scan(f, 4, jnp.arange(1.0, 5.0))
        >>> carry = s.start(jnp.arange(1.0, 5.0))
        >>> for i in range(4):
        ...     carry = s.step(carry, i)
        >>> float(s.finish(carry, 4)) == float(f(jnp.arange(1.0, 5.0)))
        True
    """
    closed, shapes = jax.make_jaxpr(fn, return_shape=True)(*args)
    path = _path(closed.jaxpr, length)
    if closed.effects or path is None:
        return None
    cut = _cut(closed.jaxpr, closed.consts, path)
    counts = _counts(cut.scan)
    if counts is None:
        return None
    plan = _plan(closed.jaxpr, cut, counts, jax.tree.structure(shapes), length)
    return Split(length, functools.partial(_start, plan), functools.partial(_step, plan),
                 functools.partial(_finish, plan))  # fmt: skip


class _Plan(NamedTuple):
    """Where a cut call's values are. ``names``: the variables computed from the
    arguments that the carry holds (then the scan's carry, then the per-step outputs
    ``ys`` of the scan, the indices of those read after it). ``static``: the items
    computing the values that depend on no argument. ``after``: the items after the scan
    that the outputs need."""

    jaxpr: Any
    before: list
    scan: Any
    static: list
    names: list
    ys: list
    after: list
    n_consts: int
    n_carry: int
    out_tree: Any
    length: int


def _plan(jaxpr: Any, cut: _Cut, counts: tuple[int, int], out_tree: Any, length: int) -> _Plan:
    n_consts, n_carry = counts
    operands = list(cut.scan.invars)
    after, later = _needed(cut.after, [v for v in jaxpr.outvars if not _literal(v)])
    scanned = {v for v in operands[:n_consts] + operands[n_consts + n_carry :] if not _literal(v)}
    dynamic = _dynamic(jaxpr.invars, cut.before)
    static = [item for item in cut.before if not any(v in dynamic for v in _sources(item))]
    static, _ = _needed(static, scanned | later)
    names = [v for v in _written(cut.before, jaxpr.invars) if v in dynamic and v in later | scanned]
    ys = [j for j, v in enumerate(cut.scan.outvars[n_carry:]) if v in later]
    return _Plan(jaxpr, cut.before, cut.scan, static, names, ys, after, n_consts, n_carry,
                 out_tree, length)  # fmt: skip


def _needed(items: list, outputs: Any) -> tuple[list, set]:
    """The items that ``outputs`` need (in order), and the variables they read with
    ``outputs``."""
    needed, kept = set(outputs), []
    for item in reversed(items):
        if set(_writes(item)) & needed:
            kept.append(item)
            needed.update(_sources(item))
    return kept[::-1], needed


def _start(plan: _Plan, *values: Any) -> list:
    """The carry before the first step: the set-up run on the arguments."""
    env = dict(zip(plan.jaxpr.invars, jax.tree.leaves(values), strict=True))
    env = _evaluate(plan.before, env)
    inits = plan.scan.invars[plan.n_consts : plan.n_consts + plan.n_carry]
    outs = plan.scan.outvars[plan.n_carry :]
    ys = [jnp.zeros(outs[j].aval.shape, outs[j].aval.dtype) for j in plan.ys]
    return [env[v] for v in plan.names] + [_read(env, v) for v in inits] + ys


def _unpack(plan: _Plan, carry: list) -> tuple[dict, list, list, list, list]:
    """``(env, scan carry, consts, xs, per-step outputs)`` of a carry, with the constants."""
    env = _evaluate(plan.static, {})
    k, n_consts, n_carry = len(plan.names), plan.n_consts, plan.n_carry
    env.update(zip(plan.names, carry[:k], strict=True))
    operands = plan.scan.invars
    consts = [_read(env, v) for v in operands[:n_consts]]
    xs = [_read(env, v) for v in operands[n_consts + n_carry :]]
    return env, carry[k : k + n_carry], consts, xs, carry[k + n_carry :]


def _step(plan: _Plan, carry: list, i: Any) -> list:
    """The carry after step ``i`` (the scan's body on row ``i`` of its ``xs``)."""
    _, scan_carry, consts, xs, ys = _unpack(plan, carry)
    row = [jax.lax.dynamic_index_in_dim(x, i, 0, keepdims=False) for x in xs]
    out = jax.extend.core.jaxpr_as_fun(plan.scan.params["jaxpr"])(*consts, *scan_carry, *row)
    new, y = list(out[: plan.n_carry]), [out[plan.n_carry + j] for j in plan.ys]
    ys = [jax.lax.dynamic_update_index_in_dim(b, v, i, 0) for b, v in zip(ys, y, strict=True)]
    return carry[: len(plan.names)] + new + ys


def _finish(plan: _Plan, carry: list, done: Any) -> Any:
    """The call's outputs after ``done`` steps (the per-step outputs past them read as
    the last one done)."""
    env, scan_carry, _, _, ys = _unpack(plan, carry)
    for var, value in zip(plan.scan.outvars, scan_carry, strict=False):
        _write(env, var, value)
    rows = jnp.clip(jnp.arange(plan.length), 0, jnp.maximum(done, 1) - 1)
    outs = plan.scan.outvars[plan.n_carry :]
    for j, buffer in zip(plan.ys, ys, strict=True):
        _write(env, outs[j], buffer[rows])
    env = _evaluate(plan.after, env)
    return jax.tree.unflatten(plan.out_tree, [_read(env, v) for v in plan.jaxpr.outvars])


def _counts(scan: Any) -> tuple[int, int] | None:
    """A scan's numbers of constants and of carried values, or ``None`` for a scan of
    other than plain arrays. jax 0.10 names them; jax 0.12 groups the operands in a flat
    tree (``ft_in``: constants, carry, ``xs``; a ``None`` leaf per plain array)."""
    if "num_consts" in scan.params:
        return scan.params["num_consts"], scan.params["num_carry"]
    try:  # a flat tree of three groups, each one leaf per operand
        groups = [list(g) for g in scan.params["ft_in"].unpack()]
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
    if len(groups) != 3 or any(x is not None for g in groups for x in g):
        return None
    if sum(map(len, groups)) != len(scan.invars):
        return None
    return len(groups[0]), len(groups[1])


def _path(jaxpr: Any, length: int) -> list[int] | None:
    """Indices of the equations down to the last forward scan of ``length`` steps, through
    calls; ``None`` if there is none."""
    for i in range(len(jaxpr.eqns) - 1, -1, -1):
        eqn = jaxpr.eqns[i]
        name = eqn.primitive.name
        if name == "scan" and eqn.params["length"] == length and not eqn.params["reverse"]:
            return [i]
        if name in _CALLS and _called(eqn) is not None:
            inner = _path(_open(_called(eqn))[0], length)
            if inner is not None:
                return [i, *inner]
    return None


def _called(eqn: Any) -> Any:
    """The jaxpr a call equation calls (``jit``: ``jaxpr``; ``closed_call``: ``call_jaxpr``)."""
    return eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))


def _open(call: Any) -> tuple[Any, Sequence]:
    """A call's jaxpr and constants (a ``ClosedJaxpr``, or a ``Jaxpr`` without)."""
    if hasattr(call, "jaxpr") and hasattr(call, "consts"):
        return call.jaxpr, call.consts
    return call, ()


def _cut(jaxpr: Any, consts: Sequence, path: list[int]) -> _Cut:
    """The items of ``jaxpr`` (``("const", var, value)``, ``("bind", targets, sources)``,
    ``("eqn", eqn)``), the calls on ``path`` opened, before and after its scan."""
    i, eqns = path[0], jaxpr.eqns
    before = [("const", v, c) for v, c in zip(jaxpr.constvars, consts, strict=True)]
    before += [("eqn", e) for e in eqns[:i]]
    after = [("eqn", e) for e in eqns[i + 1 :]]
    if len(path) == 1:
        return _Cut(before, eqns[i], after)
    call = eqns[i]
    inner_jaxpr, inner_consts = _open(_called(call))
    inner = _cut(inner_jaxpr, inner_consts, path[1:])
    # one binding per variable, so that each one's dependence on the arguments is its own
    entering = zip(inner_jaxpr.invars, call.invars, strict=True)
    leaving = zip(call.outvars, inner_jaxpr.outvars, strict=True)
    before += [*(("bind", [t], [s]) for t, s in entering), *inner.before]
    after = [*inner.after, *(("bind", [t], [s]) for t, s in leaving), *after]
    return _Cut(before, inner.scan, after)


def _evaluate(items: list, env: dict) -> dict:
    """``env`` after the items run (as ``jax.core.eval_jaxpr`` runs equations)."""
    env = dict(env)
    for item in items:
        if item[0] == "const":
            env[item[1]] = item[2]
        elif item[0] == "bind":
            for target, source in zip(item[1], item[2], strict=True):
                _write(env, target, _read(env, source))
        else:
            eqn = item[1]
            params = eqn.primitive.get_bind_params(eqn.params)
            with eqn.ctx.manager:
                out = eqn.primitive.bind(*[_read(env, v) for v in eqn.invars], **params)
            out = out if eqn.primitive.multiple_results else [out]
            for var, value in zip(eqn.outvars, out, strict=True):
                _write(env, var, value)
    return env


def _literal(var: Any) -> bool:
    return isinstance(var, Literal)


def _read(env: dict, var: Any) -> Any:
    return var.val if _literal(var) else env[var]


def _write(env: dict, var: Any, value: Any) -> None:
    if not isinstance(var, DropVar):
        env[var] = value


def _writes(item: tuple) -> list:
    """The variables an item defines, in order."""
    if item[0] == "const":
        return [item[1]]
    targets = item[1] if item[0] == "bind" else item[1].outvars
    return [v for v in targets if not isinstance(v, DropVar)]


def _sources(item: tuple) -> list:
    """The variables an item reads."""
    if item[0] == "const":
        return []
    sources = item[2] if item[0] == "bind" else item[1].invars
    return [v for v in sources if not _literal(v)]


def _reads(items: list) -> list:
    return [v for item in items for v in _sources(item)]


def _written(items: list, invars: Sequence) -> list:
    """Every variable the arguments and ``items`` define, in order, once each."""
    return _unique([*invars, *(v for item in items for v in _writes(item))])


def _dynamic(invars: Sequence, items: list) -> set:
    """The variables whose values depend on the arguments."""
    dynamic = set(invars)
    for item in items:
        if any(v in dynamic for v in _sources(item)):
            dynamic.update(_writes(item))
    return dynamic


def _unique(variables: list) -> list:
    """``variables`` without repeats, in order."""
    seen, out = set(), []
    for v in variables:
        if v not in seen:
            seen.add(v)
            out.append(v)
    return out
