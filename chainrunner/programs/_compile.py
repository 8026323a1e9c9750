"""The compile cache: each program built once, each executable compiled once.

Within a process, by the program's key and its arguments' signature; between processes,
through the cache folder (``_store``).

A *program* is ``jit(shard_map(...))`` of a body that closes over the kernel and the loop
length (never static arguments), cached on what identifies it (the kernel's functions,
the mesh, ``batch_size``, chunk length, ...). An *executable* is that program compiled for
the shapes, dtypes and shardings of its arguments. Both caches are shared with the
thread that compiles the sampling loop while the chains are initialised, so they are
locked, and an executable being compiled by one thread is awaited by the other.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from ..core._lru import LRU
from ..core._settings import trace_settings
from ..core._threads import Background
from . import _store

CACHE_SIZE = 32
_PROGRAMS = LRU(CACHE_SIZE)
_EXECUTABLES = LRU(CACHE_SIZE)
_PENDING: dict[tuple, threading.Event] = {}  # executables being compiled, by key
_PENDING_LOCK = threading.Lock()

# Tracing runs the kernel's Python code, and numpyro kernels rebuild their closures while
# traced: one trace at a time. Lowering and XLA compilation may overlap.
TRACE_LOCK = threading.Lock()


def signature(args: Any) -> tuple:
    """What an executable is compiled for: tree structure, shapes, dtypes, shardings."""
    leaves, treedef = jax.tree.flatten(args)
    return (
        treedef,
        *(
            (np.shape(x), x.dtype, getattr(x, "weak_type", False), getattr(x, "sharding", None))
            for x in leaves
        ),
    )


def _claim(key: tuple) -> tuple[Any, threading.Event | None]:
    """``(executable, None)`` if cached, else ``(None, event)``: this thread compiles it."""
    while True:
        with _PENDING_LOCK:
            found, executable = _EXECUTABLES.lookup(key)
            if found:
                return executable, None
            pending = _PENDING.get(key)
            if pending is None:
                pending = _PENDING[key] = threading.Event()
                return None, pending
        pending.wait()  # then look again: it is cached, or that compile failed


def compiled(
    program_key: tuple,
    build: Callable[[], Callable],
    args: tuple,
    on_traced: Callable[[Any], None] | None = None,
    identity: tuple | None = None,
) -> tuple[Any, float]:
    """The compiled executable for ``args``, and the seconds spent compiling (or waiting).

    ``on_traced(out_info)`` is called once the program is traced and before it is
    compiled (not at all when the executable is cached in this process, or loaded from
    the cache folder: then with the loaded program's ``out_info``). ``identity``: what
    names the program in every process (the kernel's ``identity`` and the program's
    layout), or ``None``: it is then traced and lowered in every process, and JAX's
    persistent cache may serve its compile (``_store``).
    """
    program = _PROGRAMS.get(program_key, build)
    key = (program_key, signature(args), trace_settings())  # x64 on: another program
    t0 = time.perf_counter()
    executable, pending = _claim(key)
    if pending is None:
        waited = time.perf_counter() - t0
        return executable, waited if waited > 1e-3 else 0.0
    try:
        executable = _EXECUTABLES.put(key, _compile(program, args, on_traced, identity))
    finally:
        with _PENDING_LOCK:
            del _PENDING[key]
        pending.set()
    return executable, time.perf_counter() - t0


def _compile(program: Any, args: tuple, on_traced: Any, identity: tuple | None) -> Any:
    """The ``_store.Program`` for ``args``: loaded from the cache folder by ``identity``,
    or traced, lowered and compiled (JAX's persistent cache, on during a run, may serve
    the compile: ``_store.jax_cache``), then stored by ``identity``. Programs whose
    arguments are not all on one mesh are not stored (their devices are not known before
    compiling)."""
    devices = mesh_devices(args)
    name = None
    if identity is not None and devices is not None and _store.folder() is not None:
        name = _store.key("identity", identity, stable_signature(args))
        loaded = _store.load(name, devices)
        if loaded is not None:
            if on_traced is not None:
                on_traced(loaded.out_info)
            return loaded
    with TRACE_LOCK:
        traced = program.trace(*args)
    if on_traced is not None:
        on_traced(traced.out_info)
    lowered = traced.lower()
    digest = hashlib.blake2b(lowered.as_text().encode(), digest_size=20).hexdigest()
    executable, fresh = _store.compile_fresh(lowered)
    compiled = _store.Program(executable, digest)
    if name is not None and fresh:  # (JAX's cache served it: it stays there)
        _store.save(name, compiled, devices)
    return compiled


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
    own thread. ``log_compiles`` is carried over.
    """
    context = trace_settings()
    fresh: list[Any] = []
    probe = threading.Thread(target=lambda: fresh.append(trace_settings()))
    probe.start()
    probe.join()
    if fresh[0] != context:
        return None
    log = jax.config.jax_log_compiles

    def run(*args: Any) -> Any:
        with jax.log_compiles(log):
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
