"""The JAX settings that change what a trace builds: part of every compiled-program key."""

from __future__ import annotations

import contextlib
from typing import Any

import jax

__all__ = ["trace_settings", "x64_scope"]

# The settings that change what a trace builds and that a ``with`` context sets for one
# thread only (read through the public ``jax.config``; a name a version lacks is skipped).
_TRACE_SETTINGS = (
    "jax_enable_x64", "jax_default_matmul_precision", "jax_numpy_rank_promotion",
    "jax_numpy_dtype_promotion", "jax_default_device", "jax_default_prng_impl",
    "jax_threefry_partitionable", "jax_softmax_custom_jvp", "jax_disable_jit",
    "jax_random_seed_offset", "jax_debug_nans", "jax_debug_infs", "jax_check_tracer_leaks",
    "jax_use_shardy_partitioner",
)  # fmt: skip


def trace_settings() -> tuple:
    """This thread's values of ``_TRACE_SETTINGS`` and its abstract mesh, if any.

    Examples:
        >>> import jax
        >>> before = trace_settings()
        >>> with jax.enable_x64(not jax.config.jax_enable_x64):
        ...     trace_settings() != before
        True
    """
    values = tuple(repr(getattr(jax.config, name, None)) for name in _TRACE_SETTINGS)
    mesh = getattr(jax.sharding, "get_abstract_mesh", lambda: None)()
    return (*values, repr(mesh))


def x64_scope(adapter: Any) -> Any:
    """A context with 64-bit types on for this thread where ``adapter`` asks for them
    (``Adapter.x64``: a PyMC model of float64), else one that changes nothing. JAX's
    scoped setting: the process's ``jax_enable_x64`` is the same before and after.

    Examples:
        >>> import jax, types
        >>> before = jax.config.jax_enable_x64
        >>> with x64_scope(types.SimpleNamespace(x64=True)):
        ...     jax.numpy.zeros(1, float).dtype.name
        'float64'
        >>> jax.config.jax_enable_x64 == before
        True
    """
    if getattr(adapter, "x64", False):
        return jax.enable_x64(True)
    return contextlib.nullcontext()
