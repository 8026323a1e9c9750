"""Compiled programs kept on disk, so that the next process does not compile them again.

chainrunner's own cache folder: ``$CHAINRUNNER_CACHE_DIR``, else the platform's cache
folder (``~/.cache/chainrunner`` on Linux, ``~/Library/Caches/chainrunner`` on macOS,
``%LOCALAPPDATA%\\chainrunner\\Cache`` on Windows). ``CHAINRUNNER_CACHE=off`` (or
``cr.set_cache(False)``) turns it off. Two kinds of entries:

- ``programs/``: compiled executables (``jax.experimental.serialize_executable``) with the
  trees of their arguments and results and the digest of the program's text, stored by
  the program's keys (``_compile.program_key``: a digest of the lowered program, its
  argument and result trees, its devices and ``environment()``; and the same with the
  digest of its jaxpr in place of the lowered text, ``_jaxpr``). A process traces its
  program and finds the compiled code here by the jaxpr's key, without lowering it; or
  else lowers it and finds it by the lowered program's key, instead of compiling it.
  Programs that call back into Python are never stored (``calls_python``).
- ``jax/``: JAX's own persistent compilation cache, turned on for the duration of each
  ``run`` (``jax_cache``) unless you configured one: the programs that are not stored in
  ``programs/`` (warmups across chains, a program that JAX's cache served) are found
  there by JAX's key of their text.

``environment`` is part of every key: the versions of Python, jax and jaxlib, XLA's
platform version, a digest of chainrunner's own source (the Python objects an entry's
trees name), the devices (platform, kind, ids, the CPU's model and flags), ``XLA_FLAGS``,
and JAX's settings that change a trace.

``programs/`` files are written atomically (a temporary file, then a rename), so
processes sharing the folder never read half of one; each starts with a digest of its
contents, and one that does not match it, or fails to load, is deleted and compiled anew.
``jax/`` is written by JAX itself, which checks what it reads and compiles again where
an entry is unreadable.
After each run the least recently used (``programs/``) or written (``jax/``) files go
until each is under its share of the size bound (``CHAINRUNNER_CACHE_MAX_BYTES``, 2 GiB
by default, half each). Loading a file runs pickled code: the folder is yours, keep it
so (as for JAX's own persistent cache).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import pickle
import platform
import re
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from ..core._settings import trace_settings

__all__ = [
    "Program", "calls_python", "environment", "folder", "jax_cache", "load", "save", "set_cache",
    "trace_settings",
]  # fmt: skip

_MAGIC = b"chainrunner-program-3\n"
DEFAULT_MAX_BYTES = 2 * 1024**3
_OFF = ("0", "off", "false", "no")
_lock = threading.Lock()
_SETTING: dict[str, Any] = {}  # set_cache's choice: {"folder": str | None, "max_bytes": int}


def platform_cache_dir() -> str:
    """The platform's folder for chainrunner's caches."""
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or os.path.expanduser("~")
        return os.path.join(base, "chainrunner", "Cache")
    if sys.platform == "darwin":
        return os.path.join(os.path.expanduser("~"), "Library", "Caches", "chainrunner")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "chainrunner")


def base() -> str | None:
    """chainrunner's cache folder, or ``None`` when off."""
    if "folder" in _SETTING:
        found = _SETTING["folder"]
    elif os.environ.get("CHAINRUNNER_CACHE", "").strip().lower() in _OFF:
        found = None
    else:
        found = os.environ.get("CHAINRUNNER_CACHE_DIR") or platform_cache_dir()
    return None if found is None else os.path.abspath(found)


def folder() -> str | None:
    """Where compiled programs are kept (``<cache folder>/programs``), or ``None`` when off."""
    where = base()
    return None if where is None else os.path.join(where, "programs")


def max_bytes() -> int:
    """The folder's size bound."""
    if "max_bytes" in _SETTING:
        return _SETTING["max_bytes"]
    return _parse_max_bytes(os.environ.get("CHAINRUNNER_CACHE_MAX_BYTES"))


@functools.lru_cache(maxsize=8)
def _parse_max_bytes(value: str | None) -> int:
    """``CHAINRUNNER_CACHE_MAX_BYTES`` as a number of bytes; a value that is not a
    non-negative integer is warned about (once) and the default used."""
    if not value:
        return DEFAULT_MAX_BYTES
    try:
        parsed = int(value)
    except ValueError:
        parsed = -1
    if parsed < 0:
        import warnings

        warnings.warn(
            f"CHAINRUNNER_CACHE_MAX_BYTES={value!r} is not a number of bytes (a "
            f"non-negative integer); using {DEFAULT_MAX_BYTES}.",
            RuntimeWarning,
            stacklevel=2,
        )
        return DEFAULT_MAX_BYTES
    return parsed


def set_cache(
    path: str | os.PathLike[str] | bool | None = True, *, max_bytes: int | None = None
) -> str | None:
    """Where chainrunner keeps compiled programs between processes (on by default).

    The first ``cr.run`` of a model in a process compiles its programs (seconds, often
    most of a short run); they are written to this folder, and a later process running
    the same model, options and layout loads them instead (tens of milliseconds). Only
    chainrunner's programs go there: JAX's persistent cache points at the folder's
    ``jax/`` only while a run compiles, and JAX's settings are put back after it
    (``jax_cache``); for JAX's own persistent cache of all your programs, see
    ``cr.enable_compilation_cache``. [What is compiled when](compilation.md) says what
    is kept and how.

    Args:
        path: the cache folder (created when first written); ``True``: the default
            (``$CHAINRUNNER_CACHE_DIR``, else the platform's cache folder, e.g.
            ``~/.cache/chainrunner``); ``False`` or ``None``: off for this process
            (``CHAINRUNNER_CACHE=off`` does the same from the environment).
        max_bytes: the folder's size bound (least recently used programs are dropped
            beyond it); ``None``: ``$CHAINRUNNER_CACHE_MAX_BYTES`` or 2 GiB.

    Returns:
        The folder programs are kept in, or ``None`` when off.

    Raises:
        TypeError: ``max_bytes`` is not an integer.
        ValueError: ``max_bytes`` is negative, or ``path`` is an existing file.

    Examples:
        >>> import tempfile
        >>> import chainrunner as cr
        >>> cr.set_cache(tempfile.mkdtemp()).endswith("programs")
        True
        >>> cr.set_cache(False) is None
        True
        >>> _ = cr.set_cache(True)  # the default again
    """
    if max_bytes is not None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
            raise TypeError(f"set_cache: max_bytes must be an int, got {max_bytes!r}.")
        if max_bytes < 0:
            raise ValueError(f"set_cache: max_bytes must be >= 0, got {max_bytes}.")
    if path is True:
        _SETTING.pop("folder", None)
    elif path is False or path is None:
        _SETTING["folder"] = None
    else:
        path = os.fspath(path)
        if os.path.isfile(path):
            raise ValueError(f"set_cache: path={path!r} is a file; expected a folder.")
        _SETTING["folder"] = path
    if max_bytes is None:
        _SETTING.pop("max_bytes", None)
    else:
        _SETTING["max_bytes"] = max_bytes
    return folder()


class Program:
    """A compiled program, and the digest of its lowered text: what names it wherever it
    was compiled or loaded from (a checkpoint's identity; the optimised text of an
    executable loaded from disk differs from a fresh one's in its metadata)."""

    def __init__(self, executable: Any, digest: str):
        self.executable, self.digest = executable, digest
        # The constants it was compiled with, and their digest then (``_compile``); a
        # program loaded from disk holds copies of its own.
        self.constants: tuple = ((), None)

    def __call__(self, *args: Any) -> Any:
        return self.executable(*args)

    @property
    def out_info(self) -> Any:
        return self.executable.out_info


def load(name: str, devices: list, lowered: bool = True) -> Program | None:
    """The program stored under ``name`` for ``devices`` (the mesh's, in order: the key
    names them too), or ``None`` (missing, off, damaged: dropped).

    jaxlib sets up the custom kernels a program calls (LAPACK's ``eigh``, ``qr``, ...)
    when it lowers them, and an executable that calls kernels not set up crashes the
    process: where the caller has not ``lowered`` the program, they are set up here first
    (``_set_up_kernels``).
    """
    where = folder()
    if where is None:
        return None
    if not lowered:
        _set_up_kernels()
    path = os.path.join(where, name + ".bin")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    try:
        entry = _unpack(data)
        from jax.experimental import serialize_executable

        if entry["devices"] != [d.id for d in devices]:
            raise ValueError("compiled for other devices")
        digest = entry["digest"]
        loaded = serialize_executable.deserialize_and_load(
            entry["executable"], entry["in_tree"], entry["out_tree"],
            execution_devices=devices,
        )  # fmt: skip
    except Exception:  # damaged, or of a JAX that cannot read it: compiled anew
        _remove(path)
        return None
    try:
        os.utime(path)  # recently used: pruned last
    except OSError:
        pass
    return Program(loaded, digest)


@functools.lru_cache(maxsize=1)
def _set_up_kernels() -> None:
    """Lowers a small program that calls LAPACK: jaxlib then sets up its LAPACK kernels
    (all of them, once per process: ``prepare_lapack_call`` initialises the library)."""
    import jax.numpy as jnp

    jax.jit(jnp.linalg.eigh).lower(np.eye(2, dtype=np.float32))


def save(names: list[str], program: Program, devices: list) -> None:
    """Stores ``program`` (for ``devices``) under each of ``names`` (atomically), then
    prunes the folder to its bound. Not stored: a program that cannot be serialized
    (JAX's ``serialize`` refuses some; trees of classes that cannot be pickled)."""
    where = folder()
    if where is None or jax.process_count() > 1:
        return
    try:
        from jax.experimental import serialize_executable

        executable, in_tree, out_tree = serialize_executable.serialize(program.executable)
        entry = {
            "executable": executable,
            "in_tree": in_tree,
            "out_tree": out_tree,
            "devices": [d.id for d in devices],
            "digest": program.digest,
        }
        payload = pickle.dumps(entry, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return
    data = _MAGIC + hashlib.sha256(payload).digest() + payload
    try:
        os.makedirs(where, exist_ok=True)
        for name in names:
            fd, tmp = tempfile.mkstemp(dir=where, prefix=".tmp-", suffix=".bin")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, os.path.join(where, name + ".bin"))
    except OSError:  # a full disk or a read-only folder: no cache, no failure
        return
    prune(where, max_bytes() // 2)


_CALLBACK = re.compile(r'custom_call @"?\w*callback\w*"?')


def calls_python(text: str) -> bool:
    """Whether a lowered program calls back into Python (``jax.debug.print``,
    ``jax.pure_callback``, ``io_callback``). Its text names each callback by a number
    only, and the number means another function in another program or process: such a
    program is never found by its text.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> def f(x):
        ...     jax.debug.print("{}", x)
        ...     return x
        >>> calls_python(jax.jit(f).lower(jnp.ones(2)).as_text())
        True
        >>> calls_python(jax.jit(jnp.sin).lower(jnp.ones(2)).as_text())
        False
    """
    return _CALLBACK.search(text) is not None


def _unpack(data: bytes) -> dict:
    if not data.startswith(_MAGIC):
        raise ValueError("not a chainrunner program file")
    digest, payload = data[len(_MAGIC) : len(_MAGIC) + 32], data[len(_MAGIC) + 32 :]
    if hashlib.sha256(payload).digest() != digest:
        raise ValueError("damaged program file")
    return pickle.loads(payload)


def prune(where: str, bound: int, suffix: str = ".bin") -> None:
    """Removes the least recently used (or written) files ending in ``suffix`` until the
    folder holds at most ``bound`` bytes of them (a little under, so that it is not
    pruned at every write)."""
    with _lock:
        try:
            entries = [e for e in os.scandir(where) if e.name.endswith(suffix)]
            stats = [(e.stat().st_mtime, e.stat().st_size, e.path) for e in entries]
        except OSError:
            return
        total = sum(size for _, size, _ in stats)
        if total <= bound:
            return
        for _, size, path in sorted(stats):
            _remove(path)
            total -= size
            if total <= 0.8 * bound:
                break


_JAX_OPTIONS = (
    "jax_compilation_cache_dir",
    "jax_persistent_cache_min_compile_time_secs",
    "jax_persistent_cache_min_entry_size_bytes",
)
_jax_users: list[Any] = []  # the runs inside jax_cache now; [0]: JAX's settings before
_jax_lock = threading.Lock()


_served: set[int] = set()  # threads whose last compile JAX's persistent cache served
_listening: list[bool] = []


def _on_event(event: str, **_: Any) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        _served.add(threading.get_ident())


def compile_fresh(lowered: Any, options: tuple = ()) -> tuple[Any, bool]:
    """``(lowered.compile(options), whether XLA compiled it)``: ``False`` where JAX's persistent
    cache served it. Measured: an executable JAX's cache loaded, serialized again into
    ``programs/``, fails in the next process (XLA's CPU client: ``NOT_FOUND: Function
    wrapped_iota not found``), so ``save`` is given only executables XLA compiled.
    JAX reports a hit on the thread that compiles (``jax.monitoring``)."""
    with _jax_lock:
        if not _listening:
            jax.monitoring.register_event_listener(_on_event)
            _listening.append(True)
    me = threading.get_ident()
    _served.discard(me)
    executable = lowered.compile(dict(options)) if options else lowered.compile()
    served = me in _served
    _served.discard(me)
    return executable, not served


@contextlib.contextmanager
def jax_cache() -> Iterator[None]:
    """JAX's persistent compilation cache in ``<cache folder>/jax`` while a run compiles.

    Unless chainrunner's folder is off, or JAX already has a cache folder (yours: then
    that one serves), this sets ``jax_compilation_cache_dir`` to it,
    ``jax_persistent_cache_min_compile_time_secs`` to 0.1 and
    ``jax_persistent_cache_min_entry_size_bytes`` to 0 on entry, and on exit (of the last
    run, where several run at once on threads) puts the three back as they were and
    resets JAX's cache object (``compilation_cache.reset_cache()``), so that your own
    programs outside runs are never cached there. While a run is inside it, programs
    that other threads compile are cached there too. The ``jax/`` folder is pruned to
    half of ``max_bytes()`` after each run.
    """
    where = base()
    if where is None or jax.process_count() > 1:
        yield
        return
    with _jax_lock:
        if not _jax_users:
            if jax.config.jax_compilation_cache_dir is not None:  # the user's: serves as is
                _jax_users.append(None)
            else:
                _jax_users.append({k: getattr(jax.config, k) for k in _JAX_OPTIONS})
                jax.config.update("jax_compilation_cache_dir", os.path.join(where, "jax"))
                jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.1)
                jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        _jax_users.append(True)
    try:
        yield
    finally:
        with _jax_lock:
            _jax_users.pop()
            if len(_jax_users) == 1:
                _leave_jax_cache(_jax_users.pop(), os.path.join(where, "jax"))


def _leave_jax_cache(saved: dict | None, where: str) -> None:
    if saved is None:
        return
    from jax.experimental.compilation_cache import compilation_cache

    for name, value in saved.items():
        jax.config.update(name, value)
    compilation_cache.reset_cache()
    prune(where, max_bytes() // 2, suffix="-cache")


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


@functools.lru_cache(maxsize=1)
def _process_environment() -> tuple:
    """What this process's programs depend on besides their text: the versions of Python,
    jax and jaxlib, chainrunner's own source, the machine, ``XLA_FLAGS``."""
    import jaxlib

    return (
        sys.version,
        jax.__version__,
        getattr(jaxlib, "__version__", None),
        _own_source(),
        platform.machine(),
        _cpu(),
        os.environ.get("XLA_FLAGS", ""),
    )


def environment() -> tuple:
    """``_process_environment`` and what may change within a process: the devices, XLA's
    version (the client's), and the JAX settings that change a trace."""
    devices = jax.devices()
    device = devices[0]
    return (
        _process_environment(),
        device.platform,
        getattr(device, "device_kind", ""),
        getattr(device.client, "platform_version", ""),
        tuple(d.id for d in devices),
        trace_settings(),
    )


@functools.lru_cache(maxsize=1)
def _own_source() -> str:
    """A digest of chainrunner's own Python files (its version is not enough while it is
    developed)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.blake2b(digest_size=16)
    for base, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                with open(os.path.join(base, name), "rb") as f:
                    h.update(name.encode() + f.read())
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def _cpu() -> str:
    """The CPU's model and instruction-set flags (XLA compiles for this CPU's features)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags", "Features"))]
        return hashlib.blake2b("".join(sorted(set(lines))).encode()).hexdigest()
    except OSError:
        return platform.processor()
