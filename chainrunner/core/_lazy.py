"""``lazy_cond`` and ``lazy_switch``: ``lax.cond`` and ``lax.switch`` that still skip the
branches no chain needs under ``vmap``.

Under ``vmap`` a ``lax.cond`` whose predicate differs per batch member becomes a
``select``: both branches run for every member, every time. A kernel's step is vmapped
over the chains of a device, and its step number is per chain, so a costly update that
only some steps need (the low-rank mass matrix, during warmup only) would run on every
step of sampling too. ``lazy_cond`` batches differently: it runs the costly branch, for
the whole batch, only when at least one member needs it, and selects per member after.
The chains of one run are in step, so that is exactly the steps that need it.
``lazy_switch`` does the same for several branches (the low-rank metric at the width each
chain's directions need), each member taking its own branch's output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap

COSTLY_SHARE = "chainrunner_costly_share"
"""The attribute of ``lazy_cond``'s batching rule (the ``rule`` of its ``custom_vmap_call``
in a jaxpr) that holds its ``share``: a hint for counting, never part of what the program
computes."""


def _broadcast(x: Any, batched: bool, size: int) -> Any:
    return x if batched else jnp.broadcast_to(x, (size, *jnp.shape(x)))


def lazy_cond(pred: jax.Array, costly: Callable, cheap: Callable, operand: Any,
              share: float | None = None) -> Any:  # fmt: skip
    """``costly(operand)`` where ``pred``, else ``cheap(operand)``; under ``vmap`` the
    costly branch runs only when ``pred`` holds for some member of the batch.

    Args:
        pred: a scalar bool (batched under ``vmap``).
        costly, cheap: functions of ``operand`` with the same output structure; they
            must not close over traced values (pass those in ``operand``).
        operand: a pytree of arrays.
        share: about the share of steps on which ``pred`` holds, where the caller's
            schedule fixes it (the low-rank update: one warmup draw in ``update_freq``).
            The layout rule's count of a step's arithmetic (``_jaxpr.flops``) counts the
            costly branch at this share (``COSTLY_SHARE``); ``None`` counts it in full.

    Returns:
        The chosen branch's output.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> f = lambda p, x: lazy_cond(p, lambda x: x * 2.0, lambda x: x, x)
        >>> jax.vmap(f)(jnp.array([True, False]), jnp.array([1.0, 1.0]))
        Array([2., 1.], dtype=float32)
    """

    @custom_vmap
    def chosen(pred, operand):
        return jax.lax.cond(pred, costly, cheap, operand)

    @chosen.def_vmap
    def rule(axis_size, in_batched, pred, operand):
        pred_batched, operand_batched = in_batched
        operand = jax.tree.map(lambda x, b: _broadcast(x, b, axis_size), operand, operand_batched)
        hot, cold = jax.vmap(costly), jax.vmap(cheap)
        if not pred_batched:
            out = jax.lax.cond(pred, hot, cold, operand)
        else:

            def mixed(operand):
                a, b = hot(operand), cold(operand)
                return jax.tree.map(
                    lambda x, y: jnp.where(pred.reshape((-1,) + (1,) * (x.ndim - 1)), x, y),
                    a, b,
                )  # fmt: skip

            out = jax.lax.cond(jnp.any(pred), mixed, cold, operand)
        return out, jax.tree.map(lambda _: True, out)

    setattr(rule, COSTLY_SHARE, share)
    return chosen(pred, operand)


def lazy_switch(index: jax.Array, branches: Sequence[Callable], operand: Any) -> Any:
    """``branches[index](operand)``; under ``vmap`` each branch runs, for the whole batch,
    only when some member's ``index`` names it, and each member takes its own branch's
    output.

    Each member gets what its own branch computes, whatever the other members of its batch
    need: the result of a chain does not depend on which chains share its batch (the same
    draws on every layout). Where every member names the same branch (the common case),
    that branch runs once.

    Args:
        index: a scalar int32 in ``[0, len(branches))`` (batched under ``vmap``).
        branches: functions of ``operand`` with the same output structure; they must not
            close over traced values (pass those in ``operand``).
        operand: a pytree of arrays.

    Returns:
        The chosen branch's output.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> f = lambda i, x: lazy_switch(i, [lambda x: x, lambda x: x * 2.0], x)
        >>> jax.vmap(f)(jnp.array([1, 0]), jnp.array([1.0, 1.0]))
        Array([2., 1.], dtype=float32)
    """
    branches = list(branches)

    @custom_vmap
    def chosen(index, operand):
        return jax.lax.switch(index, branches, operand)

    @chosen.def_vmap
    def rule(axis_size, in_batched, index, operand):
        index_batched, operand_batched = in_batched
        operand = jax.tree.map(lambda x, b: _broadcast(x, b, axis_size), operand, operand_batched)
        hot = [jax.vmap(b) for b in branches]
        if not index_batched:
            out = jax.lax.switch(index, hot, operand)
        else:
            out = _each_branch(index, hot, operand)
        return out, jax.tree.map(lambda _: True, out)

    return chosen(index, operand)


def _each_branch(index: jax.Array, hot: list[Callable], operand: Any) -> Any:
    """The branches the members name, smallest index first, each for the whole batch (one
    round where they all name the same); each member keeps its own branch's output."""
    shapes = jax.eval_shape(hot[0], operand)
    out = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    done = jnp.zeros(index.shape, bool)

    def more(carry):
        return ~jnp.all(carry[0])

    def one(carry):
        done, out = carry
        i = jnp.min(jnp.where(done, len(hot), index))
        mine = index == i
        new = jax.lax.switch(i, hot, operand)
        out = jax.tree.map(
            lambda x, y: jnp.where(mine.reshape((-1,) + (1,) * (x.ndim - 1)), x, y), new, out
        )
        return done | mine, out

    return jax.lax.while_loop(more, one, (done, out))[1]
