"""A digest of a traced program (its jaxpr): what it computes, constants included.

A jaxpr's text names every operation with its parameters and shapes, but not the values
of its constants (``ClosedJaxpr.consts``, at any depth) nor, in full, those of its
literals: the digest reads those values too. It is used within one process only
(``_compile``): printing a jaxpr is not promised to be the same in every process, and a
digest that cannot be trusted is not made at all (``None``):

- the text shows a Python object by its address (``<function f at 0x...>``): a callable
  parameter whose behaviour the text does not show;
- the program calls back into Python (its callbacks are Python functions);
- a constant whose values cannot be read.

A program the digest cannot key is lowered, and found by its lowered text instead.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import jax
import numpy as np
from jax.extend.core import Literal

# Primitives that call a Python function: the function is not in the jaxpr.
_CALLBACKS = frozenset({"debug_print", "debug_callback", "callback"})
_ADDRESS = re.compile(r" at 0x[0-9a-fA-FX]+")  # (jax prints addresses as 0xXXXX...)


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
    if _ADDRESS.search(text):
        return None
    h = hashlib.blake2b(text.encode(), digest_size=24)
    try:
        for value in _values(jaxpr):
            _update(h, value)
    except _NotKeyable:
        return None
    return h.hexdigest()


class _NotKeyable(Exception):
    """The jaxpr has a part the digest cannot see."""


def _values(jaxpr: Any) -> Any:
    """Every constant and literal of ``jaxpr`` and the jaxprs in its parameters, in a
    fixed order (depth first)."""
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
            yield from (v.val for v in eqn.invars if isinstance(v, Literal))
            stack.extend(reversed(list(_jaxprs_in(eqn.params))))
        yield from (v.val for v in inner.outvars if isinstance(v, Literal))


def _jaxprs_in(params: dict) -> Any:
    for value in params.values():
        for v in value if isinstance(value, (tuple, list)) else (value,):
            if hasattr(v, "eqns") or (hasattr(v, "jaxpr") and hasattr(v, "consts")):
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
