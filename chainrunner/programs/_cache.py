"""JAX's persistent compilation cache, switched on explicitly (never at import)."""

from __future__ import annotations

import os

import jax

__all__ = ["enable_compilation_cache"]


def default_cache_dir() -> str:
    """``$XDG_CACHE_HOME/chainrunner/jax`` (``~/.cache/chainrunner/jax`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "chainrunner", "jax")


def enable_compilation_cache(
    path: str | os.PathLike[str] | None = None, *, min_compile_time_secs: float = 0.2
) -> str:
    """Switches on JAX's persistent compilation cache, so a new process starts warm.

    Compiling NUTS takes seconds, often longer than sampling a small model. JAX can keep
    compiled programs on disk, keyed on the program, the jax version and the devices;
    a later process (a script run again, a test suite, a notebook restarted) that builds
    the same program loads it instead of compiling. This sets the three ``jax.config``
    options that do it (``jax_compilation_cache_dir``,
    ``jax_persistent_cache_min_compile_time_secs`` and
    ``jax_persistent_cache_min_entry_size_bytes``): a process-wide setting, so it is a
    call you make, never something chainrunner does on import. Call it once, early; it
    also caches your other JAX programs. Within one process chainrunner keeps its own
    compiled programs anyway (see [what is compiled when](compilation.md)).

    Args:
        path: the cache folder (created if missing); ``None``:
            ``$XDG_CACHE_HOME/chainrunner/jax``, i.e. ``~/.cache/chainrunner/jax``.
        min_compile_time_secs: only programs that took at least this long to compile
            are written (JAX's default is 1 s; small helper programs are not worth a
            file).

    Returns:
        The cache folder, as an absolute path.

    Raises:
        TypeError: ``min_compile_time_secs`` is not a number.
        ValueError: ``min_compile_time_secs`` is negative, or ``path`` is an existing file.

    Examples:
        >>> import tempfile
        >>> import chainrunner as cr
        >>> folder = cr.enable_compilation_cache(tempfile.mkdtemp())
        >>> import jax
        >>> jax.config.jax_compilation_cache_dir == folder
        True
        >>> from jax.experimental.compilation_cache import compilation_cache
        >>> jax.config.update("jax_compilation_cache_dir", None)  # off again (this example only)
        >>> compilation_cache.reset_cache()
    """
    if isinstance(min_compile_time_secs, bool) or not isinstance(
        min_compile_time_secs, (int, float)
    ):
        raise TypeError(
            "enable_compilation_cache: min_compile_time_secs must be a number of seconds, "
            f"got {type(min_compile_time_secs).__name__}."
        )
    if not min_compile_time_secs >= 0:
        raise ValueError(
            "enable_compilation_cache: min_compile_time_secs must be >= 0, got "
            f"{min_compile_time_secs}."
        )
    folder = os.path.abspath(os.fspath(path) if path is not None else default_cache_dir())
    if os.path.isfile(folder):
        raise ValueError(f"enable_compilation_cache: path={folder!r} is a file; expected a folder.")
    os.makedirs(folder, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_secs))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return folder
