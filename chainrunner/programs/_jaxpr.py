"""A digest of a traced program (its jaxpr): what it computes, constants included.

A jaxpr's text names every operation with its parameters and shapes, but not the values
of its constants (``ClosedJaxpr.consts``, at any depth) nor, in full, those of its
literals: the digest reads those values too. ``_compile`` keys programs by it before
lowering them (in this process and in the cache folder, with the versions and devices);
the lowered text stays the key of record. A jaxpr printed otherwise in another process
only misses. A digest that cannot be trusted is not made at all (``None``):

- the text shows a Python object by its address (``<function f at 0x...>``): a callable
  parameter whose behaviour the text does not show. Except the transformation rules of
  ``custom_jvp``, ``custom_vjp`` and ``custom_vmap`` (``_RULES``): they act only when the
  program is transformed further, and a traced program is lowered as it is; and JAX's
  own key implementations (a ``random_wrap``'s ``impl``, the very object JAX registers
  under the name the text shows);
- the program calls back into Python (its callbacks are Python functions);
- a constant whose values cannot be read.

A program the digest cannot key is lowered, and found by its lowered text instead. That
text does not hold every constant either: JAX 0.12 passes a constant larger than
``jax_embedded_constants_max_bytes`` (1 KiB) to the executable as an argument, and the
text shows only its shape. So the lowered key adds ``constants_digest``.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any

import jax
import numpy as np
from jax.extend.core import Literal

from ..core._lazy import COSTLY_SHARE

# Primitives that call a Python function: the function is not in the jaxpr.
_CALLBACKS = frozenset({"debug_print", "debug_callback", "callback"})
_ADDRESS = re.compile(r" at 0x[0-9a-fA-FX]+")  # (jax prints addresses as 0xXXXX...)
# Parameters that are rules for transforming a primitive (differentiation, batching),
# never read when the traced program is lowered.
_RULES = {
    "custom_jvp_call": {"jvp_jaxpr_fun", "jvp_jaxpr_thunk"},
    "custom_vjp_call": {"fwd_jaxpr_thunk", "bwd", "out_trees"},
    "custom_vjp_call_jaxpr": {"fwd_jaxpr_thunk", "bwd", "out_trees"},
    "custom_vmap_call": {"rule"},
}


def digest(jaxpr: Any) -> str | None:
    """The digest of ``jaxpr`` (a ``ClosedJaxpr``, or a ``Jaxpr`` with ``consts``), or
    ``None`` where the jaxpr cannot be keyed (see the module's docstring).

    Examples:
        >>> import jax, jax.numpy as jnp, numpy as np
        >>> def of(c):
        ...     return digest(jax.jit(lambda x: x * c).trace(jnp.ones(3)).jaxpr)
        >>> of(np.arange(3.0)) == of(np.arange(3.0))
        True
        >>> of(np.arange(3.0)) == of(np.arange(3.0) + 1)  # same text, other constants
        False
        >>> def f(x):
        ...     jax.debug.print("{}", x)
        ...     return x
        >>> digest(jax.jit(f).trace(jnp.ones(2)).jaxpr) is None
        True
    """
    text = str(jaxpr)
    h = hashlib.blake2b(text.encode(), digest_size=24)
    try:  # (where the text shows no address, no parameter need be looked at for one)
        for value in _values(jaxpr, _ADDRESS.search(text) is not None):
            _update(h, value)
    except _NotKeyable:
        return None
    return h.hexdigest()


def constants_digest(jaxpr: Any) -> str | None:
    """A digest of the values of ``jaxpr``'s constants at any depth (``ClosedJaxpr.consts``),
    the ones JAX may pass to its executable as arguments; ``None`` where one cannot be
    read (such a program is never shared).

    Examples:
        >>> import jax, jax.numpy as jnp, numpy as np
        >>> def of(c):
        ...     f = lambda x: x + jnp.asarray(c)[1500:1503]
        ...     return constants_digest(jax.jit(f).trace(jnp.ones(3)).jaxpr)
        >>> of(np.zeros(3000)) == of(np.zeros(3000))
        True
        >>> c = np.zeros(3000)
        >>> c[1500] = 5.0  # (JAX 0.12 lowers both to the same text)
        >>> of(np.zeros(3000)) == of(c)
        False
    """
    return values_digest(constants(jaxpr))


def values_digest(values: Any) -> str | None:
    """A digest of ``values`` (arrays): dtypes, shapes and bytes; ``None`` where one
    cannot be read."""
    h = hashlib.blake2b(digest_size=24)
    try:
        for value in values:
            _update(h, value)
    except _NotKeyable:
        return None
    return h.hexdigest()


def constants(jaxpr: Any) -> list:
    """The constants of ``jaxpr`` and of the jaxprs in its parameters, depth first. JAX
    may keep them by reference (a numpy array the model closes over, not copied)."""
    return list(_consts(jaxpr))


def _consts(jaxpr: Any) -> Any:
    """The constants of ``jaxpr`` and of the jaxprs in its parameters, depth first."""
    stack, seen = [jaxpr], set()
    while stack:
        j = stack.pop()
        if id(j) in seen:
            continue
        seen.add(id(j))
        yield from getattr(j, "consts", ())
        inner = j if hasattr(j, "eqns") else j.jaxpr
        for eqn in inner.eqns:
            stack.extend(reversed(list(_jaxprs_in(eqn.params))))


class _NotKeyable(Exception):
    """The jaxpr has a part the digest cannot see."""


def _values(jaxpr: Any, addresses: bool) -> Any:
    """Every constant and literal of ``jaxpr`` and the jaxprs in its parameters, in a
    fixed order (depth first); with ``addresses``, ``_NotKeyable`` for a parameter shown
    by an address that is not a transformation rule."""
    stack, seen = [jaxpr], set()
    while stack:
        j = stack.pop()
        if id(j) in seen:
            continue
        seen.add(id(j))
        yield from getattr(j, "consts", ())
        inner = j if hasattr(j, "eqns") else j.jaxpr
        for eqn in inner.eqns:
            if eqn.primitive.name in _CALLBACKS or "callback" in eqn.primitive.name:
                raise _NotKeyable(eqn.primitive.name)
            if addresses:
                _check_params(eqn)
            yield from (v.val for v in eqn.invars if isinstance(v, Literal))
            stack.extend(reversed(list(_jaxprs_in(eqn.params))))
        yield from (v.val for v in inner.outvars if isinstance(v, Literal))


# Primitives that move or relabel values without arithmetic (no flops counted).
_MOVES = frozenset({
    "broadcast_in_dim", "concatenate", "convert_element_type", "copy", "copy_p",
    "dynamic_slice", "dynamic_update_slice", "expand_dims", "gather", "iota", "pad",
    "reshape", "rev", "scatter", "select_n", "slice", "squeeze", "transpose",
    "random_wrap", "random_unwrap", "random_bits", "random_seed", "random_split",
    "random_fold_in", "stop_gradient", "pjit", "jit", "closed_call",
})  # fmt: skip


def flops(jaxpr: Any) -> float:
    """The arithmetic of ``jaxpr`` (a ``ClosedJaxpr`` or ``Jaxpr``), counted as XLA's cost
    analysis counts a program: ``2 m n k`` for a ``dot_general``, an element for every
    element an elementwise op or a reduction reads, a loop's body once, a ``cond``'s
    dearest branch; moves and relabellings (``_MOVES``) cost nothing. A ``lazy_cond`` that
    says the share of steps its costly branch runs on (``share``: the low-rank metric's
    update, one warmup draw in ten) counts that branch at that share. A fact of the
    computation and the caller's schedule, read from a trace at hand: nothing is lowered.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> a = jnp.ones((20, 30))
        >>> flops(jax.make_jaxpr(lambda x: a @ x)(jnp.ones(30)))  # 2 x 20 x 30
        1200.0
        >>> flops(jax.make_jaxpr(lambda x: jnp.sum(jnp.exp(x)))(jnp.ones(30)))
        60.0
        >>> from chainrunner.core._lazy import lazy_cond
        >>> rare = lambda p, x: lazy_cond(p, lambda x: a.T @ (a @ x), lambda x: x, x, 0.1)
        >>> flops(jax.make_jaxpr(rare)(True, jnp.ones(30)))  # 0.1 x 2 x 1200
        240.0
    """
    inner = jaxpr if hasattr(jaxpr, "eqns") else jaxpr.jaxpr
    return float(sum(_eqn_flops(eqn) for eqn in inner.eqns))


def _eqn_flops(eqn: Any, share: float | None = None) -> float:
    if eqn.primitive.name == "custom_vmap_call" and _costly_share(eqn) is not None:
        inner = eqn.params["call"]
        inner = inner if hasattr(inner, "eqns") else inner.jaxpr
        return float(sum(_eqn_flops(e, _costly_share(eqn)) for e in inner.eqns))
    nested = [v if isinstance(v, (tuple, list)) else (v,) for v in eqn.params.values()]
    branches = [[flops(j) for j in group if _is_jaxpr(j)] for group in nested]
    if share is not None and eqn.primitive.name == "cond" and len(branches[0]) == 2:
        cheap, costly = branches[0]  # (lazy_cond's: the false branch first)
        return (1.0 - share) * cheap + share * costly
    if any(branches):  # a loop's or a call's body once; a cond's dearest branch
        return sum(max(group) for group in branches if group)
    name = eqn.primitive.name
    if name in _MOVES:
        return 0.0
    if name == "dot_general":
        (contract, _), _ = eqn.params["dimension_numbers"]
        lhs = eqn.invars[0].aval.shape
        return 2.0 * _size(eqn.outvars[0]) * math.prod(lhs[d] for d in contract)
    if name.startswith(("reduce_", "argm", "cum")):
        return float(sum(_size(v) for v in eqn.invars))
    return float(sum(_size(v) for v in eqn.outvars))


def _costly_share(eqn: Any) -> float | None:
    """The ``share`` a ``lazy_cond`` gave its costly branch (``None``: none given, or not a
    ``lazy_cond``): an attribute of the batching rule the ``custom_vmap_call`` holds (JAX
    wraps the rule, keeping it as ``__wrapped__``)."""
    rule = eqn.params.get("rule")
    for fn in (rule, getattr(rule, "__wrapped__", None)):
        share = getattr(fn, COSTLY_SHARE, None)
        if share is not None:
            return float(share)
    return None


def _size(var: Any) -> int:
    return math.prod(getattr(var.aval, "shape", ()))


def _check_params(eqn: Any) -> None:
    rules = _RULES.get(eqn.primitive.name, ())
    for name, value in eqn.params.items():
        inner = value if isinstance(value, (tuple, list)) else (value,)
        if name in rules or (inner and all(_is_jaxpr(v) for v in inner)):
            continue  # (a jaxpr's own equations are checked in turn)
        if name == "impl" and _jax_key_impl(value):
            continue
        if _ADDRESS.search(repr(value)):
            raise _NotKeyable(f"{eqn.primitive.name}[{name}]")


_JAX_KEY_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")
_key_impls: dict[str, Any] = {}


def _jax_key_impl(value: Any) -> bool:
    """Whether ``value`` (a ``random_wrap``'s ``impl``, shown with its functions'
    addresses) is one of JAX's own key implementations, which the text names (``fry``)."""
    name = getattr(value, "name", None)
    if name not in _JAX_KEY_IMPLS:
        return False
    if name not in _key_impls:
        data = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0, impl=name)))
        wrap = jax.make_jaxpr(lambda d: jax.random.wrap_key_data(d, impl=name))(data)
        _key_impls[name] = wrap.jaxpr.eqns[0].params["impl"]
    return value is _key_impls[name]


def _is_jaxpr(v: Any) -> bool:
    return hasattr(v, "eqns") or (hasattr(v, "jaxpr") and hasattr(v, "consts"))


def _jaxprs_in(params: dict) -> Any:
    for value in params.values():
        for v in value if isinstance(value, (tuple, list)) else (value,):
            if _is_jaxpr(v):
                yield v


def _update(h: Any, value: Any) -> None:
    """Adds a constant's dtype, shape and bytes to the digest."""
    dtype = getattr(value, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        h.update(str(dtype).encode())
        value = jax.random.key_data(value)
    try:
        array = np.asarray(value)
    except Exception as e:  # an opaque value: no digest
        raise _NotKeyable(type(value).__name__) from e
    if array.dtype == object:
        raise _NotKeyable("object array")
    h.update(f"{array.dtype}{array.shape}".encode())
    h.update(np.ascontiguousarray(array).tobytes())
