"""Checks of single arguments, eager and free of JAX work, shared by every public function.

Every check raises ``TypeError`` or ``ValueError`` naming the function, the argument,
the value and what was expected, before anything is traced or compiled.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh


def check_int(name: str, value: Any, *, minimum: int, where: str) -> int:
    """``value`` as an int, if it is one and at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{where}: {name} must be an int, got {value!r} ({type(value).__name__}).")
    if value < minimum:
        raise ValueError(f"{where}: {name} must be >= {minimum}, got {value}.")
    return int(value)


def check_bool(name: str, value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{where}: {name} must be True or False, got {value!r}.")
    return value


def check_key(rng_key: Any, where: str = "run") -> jax.Array:
    """A typed scalar key; a legacy ``uint32[2]`` key is wrapped."""
    dtype = getattr(rng_key, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        if np.shape(rng_key) != ():
            raise ValueError(
                f"{where}: rng_key must be a single key, got a key array of shape "
                f"{np.shape(rng_key)}."
            )
        return rng_key
    if dtype is not None and np.dtype(dtype) == np.uint32 and np.shape(rng_key) == (2,):
        return jax.random.wrap_key_data(jnp.asarray(rng_key))
    raise TypeError(
        f"{where}: rng_key must be a JAX PRNG key (jax.random.key(seed)), got "
        f"{type(rng_key).__name__}"
        + (f" of dtype {dtype} and shape {np.shape(rng_key)}" if dtype else "")
        + "."
    )


def check_batch_size(batch_size: Any, where: str) -> int | str | None:
    if batch_size is None or batch_size == "auto":
        return batch_size
    if isinstance(batch_size, str):
        raise TypeError(
            f"{where}: batch_size must be an int >= 1, None or 'auto', got {batch_size!r}."
        )
    return check_int("batch_size", batch_size, minimum=1, where=where)


def check_mesh(mesh: Any, where: str) -> Mesh:
    """Returns ``mesh`` if it has a ``'chain'`` axis, else raises a clear error."""
    if not isinstance(mesh, Mesh):
        raise TypeError(
            f"{where}: mesh must be a jax.sharding.Mesh (e.g. cr.chain_mesh()), "
            f"got {type(mesh).__name__}."
        )
    if "chain" not in mesh.axis_names:
        raise ValueError(
            f"{where}: mesh has axes {mesh.axis_names}; expected an axis named 'chain' "
            "(build one with cr.chain_mesh())."
        )
    return mesh


def leading_size(tree: Any, name: str, where: str) -> int:
    """The common leading-axis size of every leaf of ``tree``, or a clear error."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    if not leaves:
        raise ValueError(f"{where}: {name} has no array leaves; expected a leading chain axis.")
    sizes = {}
    for path, leaf in leaves:
        shape = np.shape(leaf)
        if len(shape) == 0:
            raise ValueError(
                f"{where}: leaf {name}{jax.tree_util.keystr(path)} is a scalar; every leaf "
                "needs a leading chain axis."
            )
        sizes.setdefault(shape[0], jax.tree_util.keystr(path))
    if len(sizes) > 1:
        found = ", ".join(f"{name}{p} has {s}" for s, p in sizes.items())
        raise ValueError(
            f"{where}: leaves disagree on the number of chains (leading axis): {found}."
        )
    (n,) = sizes
    if n == 0:
        raise ValueError(f"{where}: {name} has 0 chains; expected at least 1.")
    return int(n)
