"""The compile cache: a compiled program is found by what it computes.

Every call traces its program and lowers it; the program's key (``program_key``) is a
digest of the lowered module's text (its constants included, its source locations not),
the trees of its arguments and results, the devices it runs on in order, and the
environment (jax, jaxlib and XLA versions, the CPU, ``XLA_FLAGS``, JAX's settings:
``_store.environment``). Whatever a model reads while it is traced (the environment, a
file, a random draw, a global, ``jax_enable_x64``) is a constant of the lowered program,
so it is in the key: two computations never share a program, and the same computation
built from new Python objects (a notebook cell run again, a second process) finds its
program without compiling.

Within a process the executables are kept by that key (``_EXECUTABLES``); between
processes, in the cache folder (``_store``). The thread that compiles the sampling loop
while the chains are initialised shares the cache, so it is locked, and an executable
being compiled by one thread is awaited by the other.
"""

from __future__ import annotations

import collections
import hashlib
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from ..core._lru import LRU
from ..core._threads import Background
from . import _jaxpr, _store

CACHE_SIZE = 32
_EXECUTABLES = LRU(CACHE_SIZE)
# A jaxpr's digest (``_traced_key``) -> the key of what it lowered to, in this process:
# the same trace again (a notebook cell run again) skips lowering.
_BY_TRACE = LRU(4 * CACHE_SIZE)
_PENDING: dict[str, threading.Event] = {}  # executables being compiled, by key
_PENDING_LOCK = threading.Lock()

# Tracing runs the kernel's Python code, and numpyro kernels rebuild their closures while
# traced: one trace at a time. Lowering and XLA compilation may overlap.
TRACE_LOCK = threading.Lock()

# XLA compiles (and loads from the cache folder) per kind of program: tests read them to
# check the promises "compiles nothing" and "loads instead of compiling".
compile_counts: collections.Counter = collections.Counter()
load_counts: collections.Counter = collections.Counter()
lower_counts: collections.Counter = collections.Counter()  # (the same trace again: none)


def signature(args: Any) -> tuple:
    """What a trace depends on besides the code: tree structure, shapes, dtypes, shardings."""
    leaves, treedef = jax.tree.flatten(args)
    return (
        treedef,
        *(
            (np.shape(x), x.dtype, getattr(x, "weak_type", False), getattr(x, "sharding", None))
            for x in leaves
        ),
    )


def _claim(key: str) -> tuple[Any, threading.Event | None]:
    """``(executable, None)`` if cached, else ``(None, event)``: this thread compiles it."""
    while True:
        with _PENDING_LOCK:
            found, executable = _EXECUTABLES.lookup(key)
            if found and _holds_its_constants(executable):
                return executable, None
            pending = _PENDING.get(key)
            if pending is None:
                pending = _PENDING[key] = threading.Event()
                return None, pending
        pending.wait()  # then look again: it is cached, or that compile failed


def compiled(
    kind: str,
    program: Callable,
    args: tuple,
    on_traced: Callable[[Any], None] | None = None,
    options: tuple = (),
) -> tuple[_store.Program, float]:
    """``program`` (a ``jax.jit``) compiled for ``args``, and the seconds it took.

    The program is traced on every call (the key must see what this trace reads). The
    executable comes, by the trace's key (``_traced_key``), from this process's cache or
    the cache folder; else the program is lowered, and it comes by ``program_key`` from
    this process's cache, the cache folder, or XLA (then stored under both keys).
    ``on_traced(out_info)`` is called once the program is traced, before it is lowered.
    ``kind`` names the program in ``compile_counts``; ``options``: XLA's compile options
    (``_choose.compile_options``), part of both keys.
    """
    t0 = time.perf_counter()
    with TRACE_LOCK:
        traced = program.trace(*args)
    if on_traced is not None:
        on_traced(traced.out_info)
    devices = mesh_devices(args)
    by_trace = _traced_key(traced, args, devices, options)
    found, key = _BY_TRACE.lookup(by_trace) if by_trace is not None else (False, None)
    found, executable = _EXECUTABLES.lookup(key) if found else (False, None)
    if found and _holds_its_constants(executable):  # the very same trace, lowered before
        return executable, time.perf_counter() - t0
    stored = _load_traced(kind, by_trace, devices)
    if stored is not None:  # another process compiled the very same trace
        return stored, time.perf_counter() - t0
    executable, key = _lower_and_find(kind, traced, args, devices, by_trace, options)
    if by_trace is not None and key is not None:
        _BY_TRACE.put(by_trace, key)
    return executable, time.perf_counter() - t0


def _load_traced(kind: str, by_trace: str | None, devices: list | None) -> Any:
    """The program stored under the trace's key (kept in this process then), or ``None``."""
    if by_trace is None or devices is None:
        return None
    stored = _store.load(by_trace, devices, lowered=False)
    if stored is not None:
        load_counts[kind] += 1
        _EXECUTABLES.put(by_trace, stored)
        _BY_TRACE.put(by_trace, by_trace)
    return stored


def _lower_and_find(
    kind: str, traced: Any, args: tuple, devices: list | None, by_trace: str | None,
    options: tuple,
) -> tuple[_store.Program, str | None]:  # fmt: skip
    """``traced`` lowered, and its executable found by ``program_key`` (in this process,
    the cache folder, or compiled; a fresh compile is stored under ``by_trace`` too), with
    that key (``None`` for a program never kept)."""
    lower_counts[kind] += 1
    lowered = traced.lower()
    text, constants = lowered.as_text(), _jaxpr.constants(traced.jaxpr)
    held = _jaxpr.values_digest(constants)
    # Its callbacks are not in the text, nor are constants that cannot be read: never
    # shared. The constants JAX passes as arguments are not in the text: they join it.
    if _store.calls_python(text) or held is None:
        return _compile_only(kind, lowered, text, options), None
    text += f"\n// constants {held}{_options_words(options)}"
    key = program_key(text, args, traced.out_info, devices)
    executable, pending = _claim(key)
    if pending is None:
        return executable, key
    try:
        executable = _load_or_compile(kind, lowered, text, (key, by_trace), devices, options)
        executable.constants = (constants, held)
        _EXECUTABLES.put(key, executable)
    finally:
        with _PENDING_LOCK:
            del _PENDING[key]
        pending.set()
    return executable, key


def _holds_its_constants(program: _store.Program) -> bool:
    """Whether the constants ``program`` was compiled with still hold the values its key
    names. JAX may pass a constant to the executable by reference: a numpy array the
    model closes over, changed in place since, would change what a kept program computes."""
    values, held = program.constants
    return not values or _jaxpr.values_digest(values) == held


def _traced_key(traced: Any, args: tuple, devices: list | None, options: tuple) -> str | None:
    """The key of a traced program (``_jaxpr.digest`` of its jaxpr, with the key's other
    parts), or ``None`` where the jaxpr cannot be keyed."""
    digest = _jaxpr.digest(traced.jaxpr)
    if digest is None:
        return None
    return program_key(digest + _options_words(options), args, traced.out_info, devices)


def _options_words(options: tuple) -> str:
    return f"\n// options {list(options)}" if options else ""


def program_key(text: str, args: Any, out_info: Any, devices: list | None) -> str:
    """The key of a lowered program: a digest of its text, the trees of its arguments
    and results (``stable_signature``), its devices in order and ``_store.environment``.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> def key_of(f, x):
        ...     traced = jax.jit(f).trace(x)
        ...     return program_key(traced.lower().as_text(), (x,), traced.out_info, None)
        >>> x = jnp.ones(3)
        >>> key_of(lambda x: x * 2.0, x) == key_of(lambda x: x * 2.0, x)
        True
        >>> key_of(lambda x: x * 2.0, x) == key_of(lambda x: x * 3.0, x)
        False
    """
    ids = None if devices is None else [d.id for d in devices]
    words = repr((stable_signature(args), stable_signature(out_info), ids, _store.environment()))
    h = hashlib.blake2b(digest_size=24)
    h.update(text.encode())
    h.update(words.encode())
    return h.hexdigest()


def _compile_only(kind: str, lowered: Any, text: str, options: tuple) -> _store.Program:
    """A program that calls back into Python (``jax.debug.print``, ``pure_callback``):
    its text names each callback by a number only, so two programs with other callbacks
    can have the same text. Compiled every time, never kept."""
    compile_counts[kind] += 1
    digest = hashlib.blake2b(text.encode(), digest_size=20).hexdigest()
    return _store.Program(lowered.compile(dict(options)) if options else lowered.compile(), digest)


def _load_or_compile(
    kind: str, lowered: Any, text: str, keys: tuple, devices: list | None, options: tuple
) -> _store.Program:
    """The program from the cache folder under ``keys[0]``, or compiled by XLA (and then
    stored there under each of ``keys`` that is not ``None``).

    Programs whose arguments are not all on one mesh are not stored (their devices are
    not known before compiling)."""
    digest = hashlib.blake2b(text.encode(), digest_size=20).hexdigest()
    if devices is not None:
        loaded = _store.load(keys[0], devices)
        if loaded is not None:
            load_counts[kind] += 1
            return loaded
    executable, fresh = _store.compile_fresh(lowered, options)
    compile_counts[kind] += 1
    program = _store.Program(executable, digest)
    if devices is not None and fresh:  # (JAX's cache served it: it stays there)
        _store.save([k for k in keys if k is not None], program, devices)
    return program


def mesh_devices(args: Any) -> list | None:
    """The devices (in the mesh's order) of the one mesh every argument lies on, or
    ``None`` where they are not all placed on one mesh."""
    meshes = {getattr(getattr(x, "sharding", None), "mesh", None) for x in jax.tree.leaves(args)}
    if len(meshes) != 1 or None in meshes:
        return None
    return list(next(iter(meshes)).devices.flat)


def stable_signature(args: Any) -> tuple:
    """``signature`` in words that mean the same in every process."""
    leaves, treedef = jax.tree.flatten(args)
    return (
        str(treedef),
        tuple(
            (np.shape(x), str(x.dtype), bool(getattr(x, "weak_type", False)),
             _sharding_words(getattr(x, "sharding", None)))
            for x in leaves
        ),
    )  # fmt: skip


def _sharding_words(sharding: Any) -> Any:
    spec = getattr(sharding, "spec", None)
    mesh = getattr(sharding, "mesh", None)
    if spec is None or mesh is None:
        return repr(sharding)
    return (str(spec), tuple(mesh.axis_names), tuple(mesh.devices.shape),
            tuple(int(d.id) for d in mesh.devices.flat))  # fmt: skip


def in_this_context(fn: Callable[..., Any]) -> Callable[..., Any] | None:
    """``fn`` for another thread, or ``None`` when this thread's jax settings forbid it.

    jax's configuration contexts (``with jax.enable_x64(True)``,
    ``jax.default_matmul_precision``, ...) are thread-local, and a program traced under
    other settings would be another program. So when this thread has such a context in
    force, there is no thread-safe way to compile it elsewhere: the caller compiles on its
    own thread. ``log_compiles`` and ``jax_enable_x64`` (``run``'s scope for a PyMC
    model, ``core._settings.x64_scope``) are carried over: the same scoped settings there.
    """
    context = _store.trace_settings()
    fresh: list[Any] = []
    probe = threading.Thread(target=lambda: fresh.append(_store.trace_settings()))
    probe.start()
    probe.join()
    if fresh[0][1:] != context[1:]:  # (the first is jax_enable_x64)
        return None
    log, x64 = jax.config.jax_log_compiles, jax.config.jax_enable_x64

    def run(*args: Any) -> Any:
        with jax.log_compiles(log), jax.enable_x64(x64):
            return fn(*args)

    return run


class Ahead:
    """A compile started on a helper thread; ``traced`` is set once it has been traced.

    ``traced`` is also set when the compile ends (or fails) before tracing.
    """

    def __init__(self, fn: Callable[[Callable[[Any], None]], Any], name: str):
        self.traced = threading.Event()

        def go() -> Any:
            try:
                return fn(lambda _: self.traced.set())
            finally:
                self.traced.set()

        self.job = Background(go, name)
