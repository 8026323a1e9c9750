"""A traced kernel replayed with JAX's threefry key derivations written out.

On CPU, JAX lowers each threefry hash to a rolled XLA loop of five rounds, which the CPU
runs round by round. ``replay`` evaluates a kernel's traced step or init (its
``ClosedJaxpr``) as ``jax.extend.core.jaxpr_as_fun`` does, except that
``random_split`` and ``random_fold_in`` of threefry keys are computed by
``core/_threefry``'s plain arithmetic: the same hash, so the same keys, bit for bit. Keys
are integers that only other random primitives read, so no float operation of the
program changes: checked on the runs of ``tests/bitwise_runs.py`` (the same bits, both
JAX versions) and on their optimised programs (the same float operations, fusion by
fusion; a rebuilt ``cond``'s index gains an integer clamp). Measured on blackjax NUTS,
64 chains on 2 CPU devices, ``batch_size=1``: eight schools sampled 0.132 -> 0.103-0.121 s
(jax 0.12) and 0.70-0.73 -> 0.58-0.61 s (jax 0.10), the first call as long as before.

``random_bits`` stays JAX's. Written out too, it sampled faster still (0.097 and
0.40 s), but its words feed float operations, and XLA fused those differently around
straight-line code than around JAX's loop: ChEES's acceptance rates moved by an ulp on
jax 0.10 and numpyro's momenta (``erf_inv``) by an ulp that its warmup grew. The same
call's draws would then differ between chainrunner versions on a given machine.

Where a jaxpr's higher-order primitive holds such a primitive (a ``while``, ``cond`` or
``scan`` body, a ``jit``, a custom derivative's function), it is rebuilt from ``jax.lax``
(``while_loop``, ``switch``, jax 0.10's ``scan``) or inlined (``jit``, ``custom_jvp_call``,
``custom_vjp_call``: the replayed program is lowered, never differentiated), with its
body evaluated the same way. Every other equation is bound as it was traced.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.extend.core import Literal

from ..core import _threefry

_RANDOM = frozenset({"random_split", "random_fold_in"})
_INLINED = {  # primitive: the parameter holding the ClosedJaxpr it calls
    "jit": "jaxpr",
    "pjit": "jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
}


def replay(closed: Any, *args: Any) -> list[Any]:
    """``jaxpr_as_fun(closed)(*args)``, with threefry's key derivations written out.

    Examples:
        >>> import jax, numpy as np
        >>> def draw(k):
        ...     return jax.random.uniform(jax.random.split(jax.random.fold_in(k, 3))[1], (3,))
        >>> closed = jax.make_jaxpr(draw)(jax.random.key(0))
        >>> mine = replay(closed, jax.random.key(7))[0]
        >>> bool(np.array_equal(mine, draw(jax.random.key(7))))
        True
    """
    return _Replay().closed(closed, args)


class _Replay:
    """One replay: remembers which jaxprs hold a key primitive."""

    def __init__(self) -> None:
        self._holds: dict[int, bool] = {}

    def holds(self, jaxpr: Any) -> bool:
        """Whether ``jaxpr`` (a ``Jaxpr``) or one it calls holds a key primitive."""
        key = id(jaxpr)
        if key not in self._holds:
            self._holds[key] = any(
                eqn.primitive.name in _RANDOM or any(self.holds(j) for j in _sub_jaxprs(eqn))
                for eqn in jaxpr.eqns
            )
        return self._holds[key]

    def closed(self, closed: Any, args: Sequence[Any]) -> list[Any]:
        return self.jaxpr(closed.jaxpr, closed.consts, args)

    def jaxpr(self, jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]) -> list[Any]:
        """``jaxpr`` evaluated on ``consts`` and ``args`` (``core.eval_jaxpr``'s loop)."""
        env: dict[Any, Any] = dict(zip(jaxpr.constvars, consts, strict=True))
        env.update(zip(jaxpr.invars, args, strict=True))

        def read(v: Any) -> Any:
            return v.val if isinstance(v, Literal) else env[v]

        for eqn in jaxpr.eqns:
            with eqn.ctx.manager:
                out = self.equation(eqn, [read(v) for v in eqn.invars])
            if not eqn.primitive.multiple_results:
                out = [out]
            env.update(zip(eqn.outvars, out, strict=True))
        return [read(v) for v in jaxpr.outvars]

    def equation(self, eqn: Any, invals: list[Any]) -> Any:
        name = eqn.primitive.name
        written = _written_out(name, eqn.params, invals) if name in _RANDOM else None
        if written is not None:
            return written
        if any(self.holds(j) for j in _sub_jaxprs(eqn)):
            rebuilt = self.rebuilt(name, eqn.params, invals)
            if rebuilt is not None:
                return rebuilt
        return eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(eqn.params))

    def rebuilt(self, name: str, params: dict, invals: list[Any]) -> Any:
        """A higher-order equation from ``jax.lax`` with its bodies replayed, or ``None``
        (bound as traced) where it is none of ``while``, ``cond``, ``scan`` (jax 0.10's:
        jax 0.12 describes a scan's operands as trees) and those inlined."""
        if name in _INLINED:
            return self.closed(params[_INLINED[name]], invals)
        if name == "while":
            return self.while_loop(params, invals)
        if name == "cond":
            return self.switch(params, invals)
        if name == "scan" and "num_consts" in params:  # (jax 0.12's scan takes trees)
            return self.scan(params, invals)
        return None

    def while_loop(self, params: dict, invals: list[Any]) -> list[Any]:
        nc, nb = params["cond_nconsts"], params["body_nconsts"]
        cc, bc, init = invals[:nc], invals[nc : nc + nb], invals[nc + nb :]

        def cond(carry):
            return self.closed(params["cond_jaxpr"], [*cc, *carry])[0]

        def body(carry):
            return self.closed(params["body_jaxpr"], [*bc, *carry])

        return jax.lax.while_loop(cond, body, list(init))

    def switch(self, params: dict, invals: list[Any]) -> list[Any]:
        index, ops = invals[0], invals[1:]
        branches = [(lambda *a, b=branch: self.closed(b, a)) for branch in params["branches"]]
        return jax.lax.switch(index, branches, *ops)

    def scan(self, params: dict, invals: list[Any]) -> list[Any]:
        nconsts, ncarry = params["num_consts"], params["num_carry"]
        consts, init, xs = (
            invals[:nconsts],
            invals[nconsts : nconsts + ncarry],
            invals[nconsts + ncarry :],
        )

        def step(carry, x):
            out = self.closed(params["jaxpr"], [*consts, *carry, *x])
            return out[:ncarry], out[ncarry:]

        carry, ys = jax.lax.scan(step, list(init), list(xs), length=params["length"],
                                 reverse=params["reverse"], unroll=params["unroll"])  # fmt: skip
        return [*carry, *ys]


def _sub_jaxprs(eqn: Any) -> list[Any]:
    """The ``Jaxpr``s in ``eqn``'s parameters (a ``ClosedJaxpr``'s, or bare ones)."""
    found = []
    for value in eqn.params.values():
        for v in value if isinstance(value, (tuple, list)) else (value,):
            if hasattr(v, "consts") and hasattr(v, "jaxpr"):
                found.append(v.jaxpr)
            elif hasattr(v, "eqns"):
                found.append(v)
    return found


def _written_out(name: str, params: dict, invals: list[Any]) -> Any:
    """The key primitive ``name`` from ``core/_threefry`` (threefry keys), else ``None``."""
    keys = invals[0]
    impl = jax.random.key_impl(keys)
    if not _threefry.is_threefry_impl(impl) or params.get("out_sharding") is not None:
        return None
    data = jax.random.key_data(keys)
    if name == "random_fold_in":
        return jax.random.wrap_key_data(_threefry.fold_in(data, invals[1]), impl=impl)
    shape = tuple(params["shape"])
    split = _threefry.split(data, math.prod(shape))
    return jax.random.wrap_key_data(split.reshape((*keys.shape, *shape, 2)), impl=impl)


def replayed(closed: Any, unrolled: bool) -> Callable[..., list[Any]]:
    """``(*args) -> outputs`` of ``closed``: ``replay`` where ``unrolled`` (a program
    for CPU devices), else ``jaxpr_as_fun``."""
    if unrolled:
        return lambda *args: replay(closed, *args)
    from jax.extend.core import jaxpr_as_fun

    return jaxpr_as_fun(closed)
