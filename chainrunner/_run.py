"""``run`` and ``sample``: keys, chunks, progress, host transfer, caching."""

from __future__ import annotations

import atexit
import os
import threading
import time
import types
import warnings
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from . import _checkpoint, _diagnostics, _distributed, _kernel, _mesh
from ._chain_map import check_batch_size, leading_size
from ._kernel import Kernel
from ._trace import Trace

DEFAULT_CHUNK_SIZE = 250
"""Draws per compiled call when ``chunk_size=None`` (fewer if the run is shorter)."""

_CACHE_MAX = 32
_PROGRAMS: OrderedDict[tuple, Callable] = OrderedDict()
_EXECUTABLES: OrderedDict[tuple, Any] = OrderedDict()

# Number of times each runner body has been traced (a trace precedes every compile).
# Tests read it to check the no-recompile promises.
trace_counts: dict[str, int] = {"init": 0, "chunk": 0}


# The caches are shared with the thread that compiles a run's loop (``_Background``).
_CACHE_LOCK = threading.RLock()
_PENDING: dict[tuple, threading.Event] = {}  # executables being compiled, by key


def _lru_get(cache: OrderedDict, key: tuple, build: Callable[[], Any]) -> tuple[Any, bool]:
    """``cache[key]``, built (under the cache lock) if missing; least recent dropped."""
    with _CACHE_LOCK:
        if key in cache:
            cache.move_to_end(key)
            return cache[key], False
        value = cache[key] = build()
        while len(cache) > _CACHE_MAX:
            cache.popitem(last=False)
        return value, True


def _signature(args: Any) -> tuple:
    leaves, treedef = jax.tree.flatten(args)
    return (
        treedef,
        *(
            (np.shape(x), x.dtype, getattr(x, "weak_type", False), getattr(x, "sharding", None))
            for x in leaves
        ),
    )


# Tracing runs the kernel's Python code, and numpyro kernels rebuild their closures while
# traced: one trace at a time. Lowering and XLA compilation may overlap.
_TRACE_LOCK = threading.Lock()


def _compiled(
    program_key: tuple,
    build: Callable[[], Callable],
    args: tuple,
    on_traced: Callable[[Any], None] | None = None,
) -> tuple[Any, float]:
    """The compiled executable for ``args``; returns it and the seconds spent compiling.

    If another thread is compiling the same executable, waits for it (the seconds
    waited count as compiling). ``on_traced(out_info)`` is called once the program is
    traced and before it is compiled (not at all when the executable is cached).
    """
    program, _ = _lru_get(_PROGRAMS, program_key, build)
    key = (program_key, _signature(args))
    t0 = time.perf_counter()
    while True:
        with _CACHE_LOCK:
            if key in _EXECUTABLES:
                _EXECUTABLES.move_to_end(key)
                waited = time.perf_counter() - t0
                return _EXECUTABLES[key], waited if waited > 1e-3 else 0.0
            pending = _PENDING.get(key)
            if pending is None:
                pending = _PENDING[key] = threading.Event()
                break
        pending.wait()  # then look again: it is cached, or that compile failed
    try:
        with _TRACE_LOCK:
            traced = program.trace(*args)
        if on_traced is not None:
            on_traced(traced.out_info)
        executable = traced.lower().compile()
        _lru_get(_EXECUTABLES, key, lambda: executable)
    finally:
        with _CACHE_LOCK:
            del _PENDING[key]
        pending.set()
    return executable, time.perf_counter() - t0


def _in_this_context(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` for another thread: it runs only under this thread's jax settings.

    jax's configuration contexts (``with jax.enable_x64(True)``,
    ``jax.default_matmul_precision``, ...) are thread-local, and a program traced under
    other settings would be another program. So the returned function does nothing
    when this thread has such a context in force (its settings differ from the new
    thread's), and the caller compiles on its own thread. ``log_compiles`` is carried.
    """
    from jax._src import config

    context = getattr(config, "trace_context", lambda: None)()
    log = jax.config.jax_log_compiles

    def run() -> Any:
        if context is None or config.trace_context() != context:
            return None
        with jax.log_compiles(log):
            return fn()

    return run


_THREADS: list[threading.Thread] = []


def _join_at_exit() -> None:
    # A compile still running when the interpreter exits would race jax's own clean-up
    # of the backends: let it finish first (atexit runs this before jax's handler).
    for thread in _THREADS:
        thread.join()


class _Background:
    """``fn()`` on a daemon thread named ``name``, joined at exit; its errors are dropped.

    ``traced`` is an event that ``fn`` sets once it has traced what it compiles; it is
    set when ``fn`` ends, too.
    """

    def __init__(self, fn: Callable[[], Any], name: str, traced: threading.Event):
        self.traced = traced
        self._thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)
        if not _THREADS:
            atexit.register(_join_at_exit)
        _THREADS[:] = [t for t in _THREADS if t.is_alive()] + [self._thread]
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except BaseException:  # the calling thread compiles it again, and raises
            pass
        finally:
            self.traced.set()


# -- argument checks ------------------------------------------------------------------


def _check_key(rng_key: Any) -> jax.Array:
    """A typed scalar key; a legacy ``uint32[2]`` key is wrapped."""
    dtype = getattr(rng_key, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        if np.shape(rng_key) != ():
            raise ValueError(
                f"run: rng_key must be a single key, got a key array of shape {np.shape(rng_key)}."
            )
        return rng_key
    if dtype is not None and np.dtype(dtype) == np.uint32 and np.shape(rng_key) == (2,):
        return jax.random.wrap_key_data(jnp.asarray(rng_key))
    raise TypeError(
        "run: rng_key must be a JAX PRNG key (jax.random.key(seed)), got "
        f"{type(rng_key).__name__}"
        + (f" of dtype {dtype} and shape {np.shape(rng_key)}" if dtype else "")
        + "."
    )


def _check_progress(progress: Any) -> None:
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(f"run: progress must be None, True or False, got {progress!r}.")


def _chain_key_pair(rng_key: jax.Array, chain: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Chain ``chain``'s ``(init_key, step_key)``: ``split(fold_in(rng_key, chain))``."""
    init_key, step_key = jax.random.split(jax.random.fold_in(rng_key, chain))
    return init_key, step_key


def chain_keys(rng_key: jax.Array, num_chains: int) -> tuple[jax.Array, jax.Array]:
    """Per-chain ``(init_key, step_key)``: chain ``i``'s from ``fold_in(rng_key, i)`` only.

    The compiled programs derive the same keys themselves, from ``rng_key`` and the
    chain indices (no separate program); this eager form serves re-initialisation.
    """
    chains = jnp.arange(num_chains, dtype=jnp.uint32)
    return jax.vmap(_chain_key_pair, in_axes=(None, 0))(rng_key, chains)


def _retry_key(init_key: jax.Array, tries: jax.Array) -> jax.Array:
    """The init key of a chain re-initialised ``tries`` times (``fold_in`` by try 1, 2, ...)."""
    return jax.lax.fori_loop(0, tries, lambda j, k: jax.random.fold_in(k, j + 1), init_key)


def _chain_ids(n: int, padded: int) -> np.ndarray:
    """Chain indices ``0..n-1``, padded by repeating the last (as ``_mesh.pad``)."""
    return np.minimum(np.arange(padded), n - 1).astype(np.uint32)


# -- compiled programs ------------------------------------------------------------------


def _init_program(kernel: Kernel, mesh: Mesh, batch_size: int | None) -> Callable:
    def body(position, chain, tries, rng_key, params):
        trace_counts["init"] += 1
        k = kernel.bind(params)  # params are replicated, closed over (not mapped)

        def one(args):
            position, chain, tries = args
            init_key = _retry_key(_chain_key_pair(rng_key, chain)[0], tries)
            state = k.init(position, init_key)
            lp = k.logdensity(state) if k.logdensity is not None else None
            return state, jnp.zeros(()) if lp is None else jnp.asarray(lp)

        return _mesh.local_map(one, batch_size)((position, chain, tries))

    return _mesh.shard_chains(body, mesh, num_chained=3, num_replicated=2)


def _chunk_program(
    kernel: Kernel, mesh: Mesh, batch_size: int | None, chunk_len: int, thinning: int, keep: Any
) -> Callable:
    def body(state, chain, rng_key, start, n_valid, params):
        trace_counts["chunk"] += 1
        loop = _kernel.chunk_loop(_apply_keep(kernel.bind(params), keep), chunk_len, thinning)

        def one_chain(args):
            state, chain = args
            return loop(state, _chain_key_pair(rng_key, chain)[1], start, n_valid)

        return _mesh.local_map(one_chain, batch_size)((state, chain))

    return _mesh.shard_chains(body, mesh, num_chained=2, num_replicated=4)


# -- host side --------------------------------------------------------------------------


class _Sink:
    """Host arrays ``(chain, draw, ...)`` filled chunk by chunk (one copy of the draws)."""

    def __init__(self, num_chains: int, num_draws: int, like: Any):
        self.n = num_chains
        self.filled = 0
        self.arrays = jax.tree.map(
            lambda x: np.empty((num_chains, num_draws, *x.shape[2:]), x.dtype), like
        )

    def write(self, tree: Any, at: int, src: slice) -> None:
        width = src.stop - src.start

        def put(dst, x):
            dst[:, at : at + width] = x[: self.n, src]

        jax.tree.map(put, self.arrays, tree)
        self.filled = max(self.filled, at + width)

    def result(self) -> Any:
        """The arrays, cut to the draws written so far (a view: no copy)."""
        return jax.tree.map(lambda a: a[:, : self.filled], self.arrays)


def _progress_bar(progress: bool | None, total: int, desc: str):
    from tqdm.auto import tqdm

    # disable=None: on in a terminal, off otherwise. With several processes only process 0
    # shows one (they all run the same chunks).
    disable = None if progress is None else not progress
    if not _distributed.is_main_process():
        disable = True
    return tqdm(total=total, desc=desc, unit="step", disable=disable, dynamic_ncols=True)


def _versions() -> dict[str, str]:
    from . import __version__

    return {"chainrunner_version": __version__, "jax_version": jax.__version__}


class CrossChainWarmup(NamedTuple):
    """What a cross-chain warmup hook returns (see ``_warmup``).

    Attributes:
        state: the adapted, padded, sharded kernel state to start sampling from.
        kernel: the ``Kernel`` to sample with (adapted shared parameters as ``params``).
        draws: optional warmup draws ``(chain, draw, ...)`` (numpy), when kept.
        stats: optional warmup stats, when kept.
        attrs: adapted parameters to record in the trace's ``attrs``.
    """

    state: Any
    kernel: Kernel
    draws: Any = None
    stats: dict | None = None
    attrs: dict | None = None


def _check_keep(keep: Any) -> Any:
    if keep is None or callable(keep):
        return keep
    if isinstance(keep, str):
        keep = (keep,)
    if isinstance(keep, (list, tuple)) and keep and all(isinstance(k, str) for k in keep):
        return tuple(keep)
    raise TypeError(
        "run: keep must be None, a site name, a list of names, or a function "
        f"(state, info) -> pytree, got {keep!r}."
    )


def _apply_keep(kernel: Kernel, keep: Any) -> Kernel:
    """``kernel`` (already bound to its params) with ``extract`` reduced to ``keep``."""
    if keep is None:
        return kernel
    extract = kernel.extract
    if callable(keep):

        def kept(state, info):
            return keep(state, info), extract(state, info)[1]

    else:

        def kept(state, info):
            draws, stats = extract(state, info)
            if not isinstance(draws, dict):
                raise ValueError(
                    f"run: keep={list(keep)} names draws, but this kernel's draws are a "
                    f"{type(draws).__name__}, not a dict of sites."
                )
            missing = [k for k in keep if k not in draws]
            if missing:
                raise ValueError(
                    f"run: keep names {missing}, which are not among the draws {sorted(draws)}."
                )
            return {k: draws[k] for k in keep}, stats

    return kernel._replace(extract=kept)


_ON_BAD_INIT = ("raise", "warn", "reinit")
MAX_REINIT = 10


def _jitter_fn(init_jitter: Any) -> Callable:
    if callable(init_jitter):
        return init_jitter

    def jitter(rng_key, position):
        leaves, treedef = jax.tree.flatten(position)
        keys = jax.random.split(rng_key, len(leaves))
        return jax.tree.unflatten(
            treedef,
            [
                x + init_jitter * jax.random.normal(k, jnp.shape(x), jnp.result_type(x))
                for x, k in zip(leaves, keys, strict=True)
            ],
        )

    return jitter


def run(
    kernel: Any,
    rng_key: jax.Array,
    initial_position: Any,
    num_samples: int,
    *,
    num_warmup: int = 0,
    num_chains: int | None = None,
    thinning: int = 1,
    mesh: Mesh | None = None,
    batch_size: int | str | None = "auto",
    chunk_size: int | None = None,
    progress: bool | None = None,
    keep_warmup: bool = False,
    keep: Any = None,
    checkpoint: str | os.PathLike | None = None,
    monitor: bool = False,
    warn: bool = True,
    on_bad_init: str = "raise",
    init_jitter: float | Callable = 1.0,
) -> Trace:
    """Runs many chains of an MCMC kernel, spread over the devices of a mesh.

    The inference loop (``lax.scan`` over the kernel's step) runs under
    ``jax.jit`` + ``jax.shard_map`` over the mesh's ``'chain'`` axis, with
    ``batch_size`` chains advanced together on each device. Chain ``i`` uses keys
    derived from ``(rng_key, i)`` only and step ``t`` of it from ``(chain key, t)``,
    so the same seed and layout give bitwise-identical draws and the device count,
    ``batch_size`` and ``chunk_size`` never change which random numbers a chain
    sees. The run executes ``chunk_size`` draws per compiled call and moves each
    chunk's draws to host memory before the next, so device memory does not grow
    with ``num_samples``. The compiled program is cached: new seeds, initial values
    or a new ``num_samples`` do not recompile.

    Ctrl-C (``KeyboardInterrupt``) stops the run after the chunks already finished:
    ``run`` returns them as a partial trace (``attrs["interrupted"]``) and warns how
    to go on (``cr.run(kernel, rng_key, trace, remaining)`` or the same call again
    with a ``checkpoint``).

    Args:
        kernel: a blackjax ``SamplingAlgorithm``, a numpyro ``MCMCKernel``, or a
            ``cr.Kernel`` (``cr.from_blackjax`` / ``cr.from_numpyro``).
        rng_key: a JAX PRNG key (``jax.random.key(seed)``).
        initial_position: pytree whose leaves have a leading chain axis; or a
            ``Trace`` to continue from its final state (steps numbered on, so both
            runs concatenated equal one longer run with the same key); or ``None``
            for kernels that initialise chains themselves (numpyro).
        num_samples: kernel steps after warmup; ``num_samples // thinning`` draws are kept.
        num_warmup: kernel steps before the kept draws (the kernel's own adaptation
            runs during them, for numpyro kernels and adaptive blackjax kernels).
        num_chains: number of chains; inferred from ``initial_position`` if ``None``.
        thinning: keep every ``thinning``-th step; must divide ``num_samples`` and
            ``num_warmup``.
        mesh: a mesh with a ``'chain'`` axis; ``None``: ``chain_mesh`` over
            ``min(num_chains, len(jax.devices()))`` devices.
        batch_size: chains advanced together on one device (``lax.map`` over batches
            of that many, each a ``vmap``; 1: a plain loop, no ``vmap``); ``None``: all of
            a device's chains in one ``vmap``; ``"auto"`` (the default): 1 on CPU
            devices, ``None`` on GPU/TPU (see ``docs/batch-size.md``). The choice is
            recorded in ``attrs["batch_size_choice"]``.
        chunk_size: draws per compiled call (default ``min(total draws, 250)``); also
            how often the progress bar moves and checkpoints are written.
        progress: a progress bar; ``None``: on in a terminal only.
        keep_warmup: keep warmup draws and stats in ``Trace.warmup_draws`` / ``warmup_stats``.
        keep: what to store per draw, to cut memory: a site name or list of names
            (for dict draws, e.g. numpyro sites), or a function ``(state, info) ->
            pytree`` replacing the draws. ``None`` stores the kernel's draws.
        checkpoint: a folder: every finished chunk's draws, stats and state are
            written there (netCDF per chunk, atomically; on a writer thread while the
            next chunk runs); the same call again with the same folder, after a crash,
            resumes after the last complete chunk and gives the same draws as an
            uninterrupted run. A folder of another run is an error.
        monitor: show the running split-R-hat (max) and bulk ESS (min) on the
            progress bar after each chunk (ArviZ; costs a little per chunk).
        warn: warn after the run when its diagnostics (R-hat, ESS, divergences,
            stuck or non-finite chains) say something went wrong; see ``Trace.diagnostics``.
        on_bad_init: chains that start at a non-finite log density: ``"raise"`` a
            ``ValueError`` naming them, ``"warn"`` and run anyway, or ``"reinit"``:
            new starts for those chains (``init_jitter`` added to their positions,
            or a new init key for kernels that initialise themselves), up to 10 tries.
        init_jitter: the scale of the normal noise ``"reinit"`` adds, or a function
            ``(rng_key, position) -> position`` for one chain.

    Returns:
        A ``Trace`` with numpy ``draws`` and ``stats`` ``(chain, draw, ...)`` and the
        sharded ``final_state``.

    Raises:
        TypeError, ValueError: for bad arguments, before any compilation.
        ValueError: also if some chains start at a non-finite log density (their
            indices are listed) with ``on_bad_init="raise"``, as soon as the chains
            are initialised, without waiting for the sampling loop to compile (that
            compile goes on, on a second thread, and is cached for the next call);
            or if ``checkpoint`` holds another run.

    Examples:
        >>> import blackjax, jax, jax.numpy as jnp
        >>> import chainrunner as cr
        >>> nuts = blackjax.nuts(lambda x: -0.5 * jnp.sum(x**2), 0.8, jnp.ones(3))
        >>> trace = cr.run(nuts, jax.random.key(0), jnp.zeros((6, 3)), 200, progress=False)
        >>> trace.draws.shape
        (6, 200, 3)
        >>> more = cr.run(nuts, jax.random.key(0), trace, 100, progress=False)  # continue
        >>> more.num_steps
        300
    """
    where = "run"
    rng_key = _check_key(rng_key)
    num_samples = _mesh._check_int("num_samples", num_samples, minimum=1, where=where)
    num_warmup = _mesh._check_int("num_warmup", num_warmup, minimum=0, where=where)
    thinning = _mesh._check_int("thinning", thinning, minimum=1, where=where)
    for name, value in (("num_samples", num_samples), ("num_warmup", num_warmup)):
        if value % thinning:
            raise ValueError(
                f"run: {name}={value} is not a multiple of thinning={thinning}; "
                "draws are kept every `thinning` steps."
            )
    if num_chains is not None:
        num_chains = _mesh._check_int("num_chains", num_chains, minimum=1, where=where)
    batch_size = check_batch_size(batch_size, where)
    if chunk_size is not None:
        chunk_size = _mesh._check_int("chunk_size", chunk_size, minimum=1, where=where)
    if mesh is not None:
        _mesh.check_mesh(mesh, where)
    _check_progress(progress)
    for name, value in (("keep_warmup", keep_warmup), ("monitor", monitor), ("warn", warn)):
        if not isinstance(value, bool):
            raise TypeError(f"run: {name} must be True or False, got {value!r}.")
    keep = _check_keep(keep)
    if checkpoint is not None and not isinstance(checkpoint, (str, os.PathLike)):
        raise TypeError(
            f"run: checkpoint must be a folder path (str or os.PathLike), got {checkpoint!r}."
        )
    if on_bad_init not in _ON_BAD_INIT:
        raise ValueError(f"run: on_bad_init must be one of {_ON_BAD_INIT}, got {on_bad_init!r}.")
    if not callable(init_jitter) and (
        isinstance(init_jitter, bool)
        or not isinstance(init_jitter, (int, float))
        or not np.isfinite(init_jitter)
        or init_jitter <= 0
    ):
        raise ValueError(
            f"run: init_jitter must be a positive number or a function, got {init_jitter!r}."
        )
    if warn or monitor:
        _diagnostics.preload_arviz()  # overlaps the compilation
    source = kernel
    cross_chain = getattr(source, "chainrunner_cross_chain_warmup", None)
    if (
        cross_chain is not None
        and isinstance(initial_position, Trace)
        and initial_position.kernel_params is not None
    ):
        # Continuing a cross-chain-adapted run: sample on with its adapted parameters.
        kernel = source.kernel(initial_position.kernel_params)
    else:
        kernel = resolve_kernel(kernel, num_warmup=num_warmup)

    # -- what to start from
    previous = initial_position if isinstance(initial_position, Trace) else None
    if previous is not None:
        state = previous.final_state
        n = leading_size(state, "initial_position.final_state", where)
        start_step = previous.num_steps
        position = None
    else:
        position = initial_position
        start_step = 0
        if position is None:
            if kernel.needs_position:
                raise ValueError(
                    "run: initial_position is None, but this kernel needs initial positions "
                    "(a pytree whose leaves have a leading chain axis)."
                )
            if num_chains is None:
                raise ValueError("run: num_chains is required when initial_position is None.")
            n = num_chains
        else:
            n = leading_size(position, "initial_position", where)
    if num_chains is not None and num_chains != n:
        raise ValueError(
            f"run: num_chains={num_chains} but initial_position has {n} chains (leading axis)."
        )
    if mesh is None:
        # Several processes: every process must hold part of the mesh, so use all devices.
        multi = _distributed.is_multiprocess()
        mesh = _mesh.chain_mesh(None if multi else min(n, len(jax.devices())))
    _distributed.check_mesh_spans_processes(mesh, where)
    batch_size, batch_choice = _mesh.auto_batch_size(batch_size, mesh)
    layout = _mesh.make_layout(n, mesh, batch_size)
    b = layout.batch_size

    # -- keys and initial states
    compile_time = 0.0
    # The programs derive each chain's keys from the key and its index (no key program).
    chains = _mesh.place(_chain_ids(n, layout.padded), mesh)
    key = _mesh.replicate(rng_key, mesh)
    params = _mesh.replicate(kernel.params, mesh) if kernel.params is not None else None
    zero = _mesh.replicate((np.int32(0), np.int32(0)), mesh)
    cross_warmup = cross_chain is not None and previous is None and num_warmup > 0

    def compile_chunk(kernel, chunk_len, state, params, on_traced=None):
        return _compiled(
            ("chunk", kernel.functions, mesh, b, chunk_len, thinning, keep),
            lambda: _chunk_program(kernel, mesh, b, chunk_len, thinning, keep),
            (state, chains, key, *zero, params),
            on_traced,
        )

    background = None

    def compile_loop_meanwhile(init_out):
        # The loop program compiles on a second thread while the initialisation compiles
        # and runs (XLA compiles one program mostly on one core): the start is checked
        # as early as before, and the loop is ready sooner. The loop's compile below
        # waits for it.
        nonlocal background
        chain_sharding = _mesh.chain_sharding(mesh)
        state_like = jax.tree.map(
            lambda s: jax.ShapeDtypeStruct(
                s.shape, s.dtype, sharding=chain_sharding, weak_type=s.weak_type
            ),
            init_out[0],
        )

        traced = threading.Event()

        def compile_loop():
            compile_chunk(kernel, chunk_len, state_like, params, lambda _: traced.set())

        background = _Background(_in_this_context(compile_loop), "chainrunner-compile-loop", traced)

    chunk_len = min((num_warmup + num_samples) // thinning, chunk_size or DEFAULT_CHUNK_SIZE)
    if previous is None:
        try:
            state, dt, reinit = _initial_state(
                kernel, mesh, layout, position, rng_key, chains, key, params, on_bad_init,
                init_jitter, on_traced=None if cross_warmup else compile_loop_meanwhile,
            )  # fmt: skip
        except BaseException:
            if background is not None:
                background.traced.wait()  # its compile goes on, and lands in the cache
            raise
        compile_time += dt
    else:
        state = _mesh.place(_mesh.pad(state, n, layout.padded), mesh)
        reinit = []

    extra_attrs: dict[str, Any] = {}
    cross = None
    if cross_warmup:
        t0 = time.perf_counter()
        cross = cross_chain(
            rng_key=rng_key,
            state=state,
            num_chains=n,
            num_warmup=num_warmup,
            mesh=mesh,
            keep_warmup=keep_warmup,
        )
        state, kernel = cross.state, cross.kernel
        params = _mesh.replicate(kernel.params, mesh) if kernel.params is not None else None
        extra_attrs.update(cross.attrs or {})
        extra_attrs["warmup_time"] = time.perf_counter() - t0
        start_step += num_warmup
        num_warmup = 0

    total_draws = (num_warmup + num_samples) // thinning
    warmup_draws = num_warmup // thinning
    chunk_len = min(total_draws, chunk_size or DEFAULT_CHUNK_SIZE)
    chunk_fn, dt = compile_chunk(kernel, chunk_len, state, params)
    compile_time += dt
    out_like = chunk_fn.out_info[1]  # (draws, stats) shapes of one chunk

    keep_main = _Sink(n, num_samples // thinning, out_like)
    keep_w = _Sink(n, warmup_draws, out_like) if keep_warmup and warmup_draws else None

    # -- a checkpoint: check it belongs to this run, then load what it holds
    ckpt = None
    first_draw = 0
    if checkpoint is not None:
        from ._arviz import flat_dict

        ckpt = _checkpoint.Checkpoint(
            checkpoint,
            {
                "fingerprint": _checkpoint.fingerprint(
                    chunk_fn.as_text(), _distributed.to_host(kernel.params)
                ),
                "seed": np.asarray(jax.random.key_data(rng_key)).tolist(),
                "num_chains": n,
                "num_devices": layout.num_devices,
                "chains_per_device": layout.per_device,
                "batch_size": b,
                "chunk_size": chunk_len,
                "thinning": thinning,
                "num_warmup": num_warmup,
                "num_samples": num_samples,
                "first_step": start_step,
                "keep_warmup": keep_warmup,
                "state": _checkpoint.describe_state(state),
            },
        )
        # Every process checks and reads the folder (it must be visible to all of them);
        # only process 0 creates and writes it, once all have looked.
        multi = _distributed.is_multiprocess()
        ckpt.open(create=not multi)
        if multi:
            _distributed.barrier("chainrunner-checkpoint-checked")
            if _distributed.is_main_process():
                ckpt.create()
        names = list(flat_dict(out_like[0]))
        treedef = jax.tree.structure(out_like[0])
        for chunk in ckpt.read_chunks():
            for group, sink in (("posterior", keep_main), ("warmup_posterior", keep_w)):
                if group in chunk and sink is not None:
                    at, values = chunk[group]
                    _, stats = chunk.get(group.replace("posterior", "sample_stats"), (at, {}))
                    draws = jax.tree.unflatten(treedef, [values[k] for k in names])
                    width = np.shape(values[names[0]])[1]
                    sink.write((draws, stats), at, slice(0, width))
        if not _distributed.all_equal(ckpt.draws_done):
            raise ValueError(
                f"run: checkpoint={os.fspath(checkpoint)!r} looks different from the JAX "
                "processes (they found different numbers of finished draws): with several "
                "processes the folder must be on a filesystem that every process sees."
            )
        if ckpt.chunks:
            first_draw = ckpt.draws_done
            saved = ckpt.read_state(state)  # n chains, as written
            state = _mesh.place(_mesh.pad(saved, n, layout.padded), mesh)
        extra_attrs["resumed_from_draw"] = first_draw
        _distributed.barrier("chainrunner-checkpoint-read")  # before process 0 writes on

    # -- the loop
    bar = _progress_bar(
        progress,
        num_warmup + num_samples,
        "warmup" if first_draw < warmup_draws else "sampling",
    )
    bar.update(first_draw * thinning)
    counts = {"divergences": 0}
    done = {"draws": first_draw, "state": state}

    def collect(pending):
        first, count, out_state, (draws, stats) = pending
        lo, hi = first, first + count
        parts = []
        if lo < warmup_draws and keep_w is not None:
            parts.append(("warmup_", keep_w, lo, slice(0, min(hi, warmup_draws) - lo)))
        if hi > warmup_draws:
            a = max(lo, warmup_draws)
            parts.append(("", keep_main, a - warmup_draws, slice(a - lo, hi - lo)))
        host = _distributed.to_host((draws, stats)) if parts else None
        for _, sink, at, src in parts:
            sink.write(host, at, src)
        if parts and parts[-1][0] == "" and "diverging" in host[1]:
            counts["divergences"] += int(np.sum(host[1]["diverging"][:n, parts[-1][3]]))
        if ckpt is not None:
            from ._arviz import flat_dict

            groups = {}
            for prefix, _, at, src in parts:
                cut = jax.tree.map(lambda x, src=src: x[:n, src], host)
                groups[prefix + "posterior"] = (at, flat_dict(cut[0]))
                groups[prefix + "sample_stats"] = (at, dict(cut[1]))
            ckpt_state = _mesh.unpad(out_state, n, layout.padded, mesh)
            if _distributed.is_multiprocess():
                # Gathered here, by every process (a collective); process 0 writes it.
                ckpt_state = _distributed.to_host(ckpt_state)
            if _distributed.is_main_process():
                ckpt.write_chunk_async(lo, hi, groups, ckpt_state)
        done["draws"], done["state"] = hi, out_state
        bar.update(count * thinning)
        if lo < warmup_draws <= hi:
            bar.set_description("sampling")
        postfix = {}
        if counts["divergences"]:
            postfix["divergences"] = counts["divergences"]
        if monitor and keep_main.filled >= 4:
            postfix.update(_monitor(keep_main.result()))
        if postfix:
            bar.set_postfix(postfix, refresh=False)

    t0 = time.perf_counter()
    pending = None
    interrupted = False
    try:
        for first in range(first_draw, total_draws, chunk_len):
            count = min(chunk_len, total_draws - first)
            start = np.int32(start_step + first * thinning)
            start, valid = _mesh.replicate((start, np.int32(count)), mesh)
            state, out = chunk_fn(state, chains, key, start, valid, params)
            if pending is not None:
                collect(pending)  # the next chunk is already running on the devices
            pending = (first, count, state, out)
        if pending is not None:
            collect(pending)
        jax.block_until_ready(state)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        bar.close()
        if ckpt is not None:
            ckpt.flush()  # every collected chunk is on disk before run returns
    sampling_time = time.perf_counter() - t0
    state = done["state"]
    steps_done = start_step + done["draws"] * thinning

    draws, stats = keep_main.result()
    w_draws, w_stats = keep_w.result() if keep_w is not None else (None, None)
    if cross is not None and cross.draws is not None:
        w_draws, w_stats = cross.draws, cross.stats
    groups = kernel_groups(kernel)
    log_likelihood = getattr(kernel, "log_likelihood_group", None)
    if log_likelihood is not None and not interrupted:
        groups["log_likelihood"] = log_likelihood(draws)
    attrs = {
        **_versions(),
        "num_chains": n,
        "num_devices": layout.num_devices,
        "chains_per_device": layout.per_device,
        "padded_chains": layout.padded - n,
        "mesh_shape": [layout.num_devices],
        "batch_size": "all" if b is None else b,
        "batch_size_choice": batch_choice,
        "chunk_size": chunk_len,
        "thinning": thinning,
        "num_warmup": num_warmup,
        "first_step": start_step,
        "seed": np.asarray(jax.random.key_data(rng_key)).tolist(),
        "compile_time": compile_time,
        "sampling_time": sampling_time,
        "layout": layout.describe(),
        **({"num_processes": jax.process_count()} if _distributed.is_multiprocess() else {}),
        **({"reinitialised_chains": reinit} if reinit else {}),
        **({"interrupted": True} if interrupted else {}),
        **extra_attrs,
    }
    trace = Trace(
        draws=draws,
        stats=stats,
        final_state=_mesh.unpad(state, n, layout.padded, mesh),
        num_steps=steps_done,
        warmup_draws=w_draws,
        warmup_stats=w_stats,
        attrs=attrs,
        groups=groups,
        kernel_params=None if kernel.params is None else _distributed.to_host(kernel.params),
    )
    if interrupted:
        remaining = start_step + (num_warmup + num_samples) - steps_done
        how = (
            "run the same call again (same checkpoint) to resume"
            if ckpt is not None
            else f"cr.run(kernel, rng_key, trace, {remaining}) continues it"
        )
        warnings.warn(
            f"run: interrupted after {steps_done - start_step} of {num_warmup + num_samples} "
            f"steps; returning the {done['draws']} draws finished so far (per chain); {how}.",
            _diagnostics.ChainrunnerWarning,
            stacklevel=2,
        )
    elif warn:
        _diagnostics.warn_if_needed(trace)
    return trace


def _monitor(draws: Any) -> dict[str, str]:
    """Max split-R-hat and min bulk ESS of the draws so far (for the progress bar)."""
    from ._arviz import flat_dict

    values = flat_dict(draws)
    num_chains = next(iter(values.values())).shape[0]
    rhat, bulk, _ = _diagnostics._arviz_stats(values, np.arange(num_chains))
    out = {}
    for name, found, pick in (("rhat", rhat, np.nanmax), ("ess", bulk, np.nanmin)):
        found = [v for v in found.values() if np.isfinite(v)]
        if found:
            out[name] = f"{pick(found):.3f}" if name == "rhat" else f"{pick(found):.0f}"
    return out


def _initial_state(
    kernel, mesh, layout, position, rng_key, chains, key, params, on_bad_init, init_jitter,
    on_traced=None,
):  # fmt: skip
    """Initialises every chain; handles non-finite starts as ``on_bad_init`` says.

    ``chains`` and ``key`` are the placed chain indices and the replicated ``rng_key``
    (as the loop program gets them); ``on_traced`` is passed to ``_compiled`` for the
    init program.
    """
    n, b = layout.num_chains, layout.batch_size
    fn_key = (kernel.functions, mesh, b)
    compile_time = 0.0
    reinit: list[int] = []
    origin = position  # every retry jitters the user's start afresh (no random walk)
    tries = np.zeros(n, np.int32)  # re-initialisations per chain (they change its init key)
    for attempt in range(MAX_REINIT + 1):
        args = (
            _mesh.place(_mesh.pad(position, n, layout.padded), mesh),
            chains,
            _mesh.place(tries[_chain_ids(n, layout.padded)], mesh),
            key,
            params,
        )
        init, dt = _compiled(
            ("init", *fn_key), lambda: _init_program(kernel, mesh, b), args, on_traced
        )
        on_traced = None
        compile_time += dt
        state, lp = init(*args)
        if kernel.logdensity is None:
            return state, compile_time, reinit
        lp = np.asarray(_distributed.to_host(lp))[:n]
        bad = np.flatnonzero(~np.isfinite(lp))
        if not bad.size:
            return state, compile_time, reinit
        message = (
            f"run: initial_position: the log density is not finite at the start of "
            f"chain(s) {bad.tolist()} (values {lp[bad].tolist()[:8]})."
        )
        hint = getattr(kernel, "init_error_hint", None)
        if on_bad_init == "raise":
            raise ValueError(
                f"{message} Start those chains inside the support of the target, or pass "
                'on_bad_init="reinit".' + (f" {hint}" if hint else "")
            )
        if on_bad_init == "warn":
            warnings.warn(
                f"{message} Running them anyway (on_bad_init='warn').",
                _diagnostics.ChainrunnerWarning,
                stacklevel=3,
            )
            return state, compile_time, reinit
        if attempt == MAX_REINIT:
            raise ValueError(
                f"{message} Still not finite after {MAX_REINIT} re-initialisations "
                "(on_bad_init='reinit'); start those chains inside the support of the target."
                + (f" {hint}" if hint else "")
            )
        reinit = sorted(set(reinit) | set(bad.tolist()))
        tries[bad] += 1
        position = _reinit(position, origin, rng_key, bad, tries, init_jitter)
    raise AssertionError("unreachable")


def _reinit(position, origin, rng_key, bad, tries, init_jitter):
    """New starts for the chains ``bad``: ``origin`` jittered with their new init keys.

    A chain's init key after ``t`` re-initialisations is its init key folded with
    1, 2, ..., ``t`` (``_retry_key``, as the init program derives it); its jitter uses
    ``fold_in(that key, 0)``. So the keys of a try derive from the chain's key only.
    """
    warnings.warn(
        f"run: re-initialising chain(s) {bad.tolist()} "
        "(non-finite log density at the start; on_bad_init='reinit').",
        _diagnostics.ChainrunnerWarning,
        stacklevel=4,
    )
    if position is None:  # the kernel initialises itself: the new init keys suffice
        return None
    jitter = _jitter_fn(init_jitter)
    mask = np.zeros(len(tries), bool)
    mask[bad] = True
    init_keys = jax.vmap(_retry_key)(chain_keys(rng_key, len(tries))[0], jnp.asarray(tries))

    def one(pos, org, key, is_bad):
        new = jitter(jax.random.fold_in(key, 0), org)
        return jax.tree.map(lambda a, b: jnp.where(is_bad, a, b), new, pos)

    return jax.vmap(one)(position, origin, init_keys, jnp.asarray(mask))


def kernel_groups(kernel: Kernel) -> dict:
    """Further ArviZ groups a kernel provides (see ``Kernel``); none by default."""
    groups = getattr(kernel, "groups", None)
    return dict(groups) if groups else {}


def resolve_kernel(kernel: Any, *, num_warmup: int) -> Kernel:
    """Anything ``run`` accepts -> a ``Kernel`` (adapters are imported lazily)."""
    module = type(kernel).__module__ or ""
    if module.startswith("numpyro.") or isinstance(kernel, types.FunctionType):
        from .adapters._numpyro import from_numpyro

        kernel = from_numpyro(kernel)
    build = getattr(kernel, "chainrunner_kernel", None)
    if build is not None:
        return build(num_warmup=num_warmup)
    return _kernel.as_kernel(kernel, "run")


def sample(
    kernel: Any,
    rng_key: jax.Array,
    initial_position: Any,
    num_samples: int,
    *,
    coords: dict | None = None,
    dims: dict | None = None,
    **options: Any,
) -> Any:
    """``run(...)`` then ``Trace.to_arviz(coords, dims)``.

    Args:
        kernel: as for ``run``.
        rng_key: as for ``run``.
        initial_position: as for ``run``.
        num_samples: as for ``run``.
        coords: ArviZ coordinates.
        dims: ArviZ dimensions per variable.
        **options: the keyword options of ``run``.

    Returns:
        ``az.InferenceData`` (arviz < 1) or ``xarray.DataTree`` (arviz >= 1).

    Examples:
        >>> import blackjax, jax, jax.numpy as jnp
        >>> import chainrunner as cr
        >>> nuts = blackjax.nuts(lambda x: -0.5 * jnp.sum(x**2), 0.8, jnp.ones(2))
        >>> data = cr.sample(nuts, jax.random.key(1), jnp.zeros((4, 2)), 100, progress=False)
        >>> data.posterior["x"].shape
        (4, 100, 2)
    """
    _diagnostics.preload_arviz()  # to_arviz needs it, whatever `warn` says
    return run(kernel, rng_key, initial_position, num_samples, **options).to_arviz(
        coords=coords, dims=dims
    )
