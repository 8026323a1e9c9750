"""The JAX settings that change what a trace builds: part of every compiled-program key."""

from __future__ import annotations

import jax

__all__ = ["trace_settings"]

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
