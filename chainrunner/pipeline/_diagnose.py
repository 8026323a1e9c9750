"""What a start is, and what is wrong with it when the kernel fails on it.

A fresh run's ``initial_position`` may be positions, or the kernel's own states with a
leading chain axis (``jax.vmap(nuts.init)(positions)``, or the states a vmapped
``window_adaptation`` returned, as the pmap recipes hold them): ``as_states`` tells them
apart by the kernel's own init, traced on one chain (``jax.eval_shape``, nothing runs).

When the kernel raises on a start, ``diagnose`` traces its init and step on one chain's
values again to find which mistake it is: a log density whose value is not a scalar, a
missing chain axis, a kernel array (a mass matrix) that does not fit the positions, or
float32 mixed with float64. Only on an error: a run that works traces nothing more.
"""

from __future__ import annotations

import math
import re
from typing import Any

import jax
import numpy as np

#: the fields that hold a state's position (blackjax's states; numpyro's HMCState).
POSITION_FIELDS = ("position", "z")


def one_chain(tree: Any) -> Any:
    """Shape structs of one chain's values: every leaf without its leading axis."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x)[1:], x.dtype), tree)


def _whole(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), tree)


def _init_shape(kernel: Any, position: Any) -> Any:
    """The structure of ``kernel.init`` on one chain's ``position`` (traced, not run)."""
    key = jax.random.key(0)
    extra = () if kernel.params is None else (kernel.params,)
    return jax.eval_shape(lambda p: kernel.init(p, key, *extra), position)


def _step_shape(kernel: Any, state: Any) -> Any:
    key = jax.random.key(0)
    extra = () if kernel.params is None else (kernel.params,)
    return jax.eval_shape(lambda s: kernel.step(key, s, *extra), state)


def _signature(tree: Any) -> tuple:
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, [(tuple(x.shape), np.dtype(x.dtype)) for x in leaves]


def _state_position(tree: Any) -> tuple[str, Any] | None:
    """``(field, positions)`` of a tree that is a state (a named tuple with a position)."""
    for field in POSITION_FIELDS:
        if isinstance(tree, tuple) and field in getattr(type(tree), "_fields", ()):
            return field, getattr(tree, field)
    return None


def as_states(kernel: Any, tree: Any) -> bool:
    """Whether ``tree`` (leading chain axis) is this kernel's states, to start from as they
    are; a ``ValueError`` for another kernel's states, ``False`` for positions.

    Examples:
        >>> import blackjax, jax, jax.numpy as jnp
        >>> from chainrunner.adapters import as_adapter
        >>> nuts = blackjax.nuts(lambda x: -0.5 * jnp.sum(x**2), 0.5, jnp.ones(2))
        >>> kernel = as_adapter(nuts, "run").build_kernel(num_warmup=0)
        >>> states = jax.vmap(nuts.init)(jnp.zeros((4, 2)))
        >>> as_states(kernel, states), as_states(kernel, jnp.zeros((4, 2)))
        (True, False)
    """
    found = _state_position(tree)
    if found is None:
        return False
    field, position = found
    try:
        ours = _init_shape(kernel, one_chain(position))
    except Exception as e:
        ours = e
    if not isinstance(ours, Exception) and _signature(ours) == _signature(one_chain(tree)):
        return True
    theirs = type(tree).__name__
    said = (
        f"this kernel cannot start from its {field!r} ({type(ours).__name__}: {ours})"
        if isinstance(ours, Exception)
        else f"this kernel's state is a {type(ours).__name__} of other fields or shapes"
    )
    raise ValueError(
        f"run: initial_position is a {theirs} (a kernel's states, leading chain axis), but "
        f"{said}. Pass this kernel's own states (jax.vmap(kernel.init)(positions)), or "
        f"the positions: initial_position=states.{field}."
    )


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:300]


def _describe(position: Any) -> str:
    shapes = jax.tree.map(lambda x: tuple(x.shape), position)
    size = sum(math.prod(x.shape) for x in jax.tree.leaves(position))
    return f"shapes {shapes}, {size} numbers"


def _dtypes(position: Any) -> list[str]:
    return sorted({str(np.dtype(x.dtype)) for x in jax.tree.leaves(position)})


def diagnose(kernel: Any, position: Any, num_chains: int, error: BaseException) -> Exception | None:
    """A clear error for the mistake behind ``error`` (the kernel's, on ``position`` with a
    leading chain axis), or ``None`` where none of the known mistakes explains it."""
    one = one_chain(position)
    failed = _fails(kernel, one)
    if failed is None:
        return None
    stage, e = failed
    text = str(e)
    if stage == "init" and ("scalar-output" in text or "scalar output" in text):
        return ValueError(
            f"run: the log density's value is not a scalar for one chain's position "
            f"({_describe(one)}): it must return one number per chain, the sum of its log "
            f"terms (e.g. jnp.sum(...)). {type(e).__name__}: {_first_line(e)}"
        )
    if _fails(kernel, _whole(position)) is None:
        return ValueError(
            f"run: initial_position has no leading chain axis: the kernel works with all "
            f"of it ({_describe(_whole(position))}) as one chain's position, not with one "
            f"of its {num_chains} rows, which is what each chain gets. Pass positions of "
            f"shape (num_chains, *one chain's shape): x[None] for one chain, or jnp.stack "
            f"of one position per chain."
        )
    if _dtype_clash(text):
        return _dtype_error(one, e)
    if stage == "step" and re.search(
        r"incompatible shapes|shapes must|dot_general requires|cannot broadcast", text
    ):
        size = sum(math.prod(x.shape) for x in jax.tree.leaves(one))
        return ValueError(
            f"run: the kernel's step does not fit one chain's position ({_describe(one)}), "
            f"although its init does: one of the kernel's own arrays has another size, "
            f"typically inverse_mass_matrix (it needs {size} entries, or {size}x{size} "
            f"for a dense one). {type(e).__name__}: {_first_line(e)}"
        )
    return None


def _fails(kernel: Any, position: Any) -> tuple[str, Exception] | None:
    """``("init" | "step", error)`` where the kernel's init or step fails on ``position``
    (one chain's shape structs), traced only; ``None`` where both trace."""
    try:
        state = _init_shape(kernel, position)
    except Exception as e:
        return "init", e
    try:
        _step_shape(kernel, state)
    except Exception as e:
        return "step", e
    return None


def _dtype_clash(text: str) -> bool:
    return bool(re.search(r"float64", text) and re.search(r"float32|bfloat16|float16", text))


def _dtype_error(one: Any, e: Exception) -> Exception:
    x64 = "on" if jax.config.jax_enable_x64 else "off"
    return TypeError(
        f"run: the kernel mixes float32 and float64: initial_position is "
        f"{'/'.join(_dtypes(one))} (jax_enable_x64 is {x64}), and one of the kernel's own "
        f"arrays or the log density's constants has the other precision. Give "
        f"initial_position, the step size and the mass matrix one dtype (e.g. "
        f"jnp.asarray(x, jnp.float32)), built under the same jax_enable_x64. "
        f"{type(e).__name__}: {_first_line(e)}"
    )
