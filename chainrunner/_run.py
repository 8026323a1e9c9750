"""``run`` and ``sample``: keys, chunks, progress, host transfer, caching."""

from __future__ import annotations

import time
import types
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from . import _kernel, _mesh
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


def _lru_get(cache: OrderedDict, key: tuple, build: Callable[[], Any]) -> tuple[Any, bool]:
    if key in cache:
        cache.move_to_end(key)
        return cache[key], False
    value = cache[key] = build()
    while len(cache) > _CACHE_MAX:
        cache.popitem(last=False)
    return value, True


def _signature(args: Any) -> tuple:
    leaves, treedef = jax.tree.flatten(args)
    return (treedef, *((np.shape(x), x.dtype, getattr(x, "sharding", None)) for x in leaves))


def _compiled(program_key: tuple, build: Callable[[], Callable], args: tuple) -> tuple[Any, float]:
    """The compiled executable for ``args``; returns it and the seconds spent compiling."""
    program, _ = _lru_get(_PROGRAMS, program_key, build)
    key = (program_key, _signature(args))
    if key in _EXECUTABLES:
        _EXECUTABLES.move_to_end(key)
        return _EXECUTABLES[key], 0.0
    t0 = time.perf_counter()
    executable, _ = _lru_get(_EXECUTABLES, key, lambda: program.lower(*args).compile())
    return executable, time.perf_counter() - t0


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


_derive = jax.jit(
    jax.vmap(lambda key, i: tuple(jax.random.split(jax.random.fold_in(key, i))), in_axes=(None, 0))
)


def chain_keys(rng_key: jax.Array, num_chains: int) -> tuple[jax.Array, jax.Array]:
    """Per-chain ``(init_key, step_key)``: chain ``i``'s from ``fold_in(rng_key, i)`` only."""
    return _derive(rng_key, jnp.arange(num_chains, dtype=jnp.uint32))


# -- compiled programs ------------------------------------------------------------------


def _init_program(kernel: Kernel, mesh: Mesh, batch_size: int | None) -> Callable:
    def body(position, init_key, params):
        trace_counts["init"] += 1
        k = kernel.bind(params)  # params are replicated, closed over (not mapped)

        def one(args):
            position, key = args
            state = k.init(position, key)
            lp = k.logdensity(state) if k.logdensity is not None else None
            return state, jnp.zeros(()) if lp is None else jnp.asarray(lp)

        return _mesh.local_map(one, batch_size)((position, init_key))

    return _mesh.shard_chains(body, mesh, num_chained=2, num_replicated=1)


def _chunk_program(
    kernel: Kernel, mesh: Mesh, batch_size: int | None, chunk_len: int, thinning: int
) -> Callable:
    def body(state, step_key, start, n_valid, params):
        trace_counts["chunk"] += 1
        loop = _kernel.chunk_loop(kernel.bind(params), chunk_len, thinning)

        def one_chain(args):
            return loop(*args, start, n_valid)

        return _mesh.local_map(one_chain, batch_size)((state, step_key))

    return _mesh.shard_chains(body, mesh, num_chained=2, num_replicated=3)


# -- host side --------------------------------------------------------------------------


class _Sink:
    """Host arrays ``(chain, draw, ...)`` filled chunk by chunk (one copy of the draws)."""

    def __init__(self, num_chains: int, num_draws: int):
        self.n = num_chains
        self.num_draws = num_draws
        self.arrays: Any = None

    def write(self, tree: Any, lo: int, src: slice) -> None:
        if self.arrays is None:
            self.arrays = jax.tree.map(
                lambda x: np.empty((self.n, self.num_draws, *x.shape[2:]), x.dtype), tree
            )
        width = src.stop - src.start

        def put(dst, x):
            dst[:, lo : lo + width] = x[: self.n, src]

        jax.tree.map(put, self.arrays, tree)


def _progress_bar(progress: bool | None, total: int, desc: str):
    from tqdm.auto import tqdm

    # disable=None: on in a terminal, off otherwise.
    disable = None if progress is None else not progress
    return tqdm(total=total, desc=desc, unit="step", disable=disable, dynamic_ncols=True)


def _versions() -> dict[str, str]:
    from . import __version__

    return {"chainrunner_version": __version__, "jax_version": jax.__version__}


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
    batch_size: int | None = None,
    chunk_size: int | None = None,
    progress: bool | None = None,
    keep_warmup: bool = False,
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
            runs during them, for numpyro kernels).
        num_chains: number of chains; inferred from ``initial_position`` if ``None``.
        thinning: keep every ``thinning``-th step; must divide ``num_samples`` and
            ``num_warmup``.
        mesh: a mesh with a ``'chain'`` axis; ``None``: ``chain_mesh`` over
            ``min(num_chains, len(jax.devices()))`` devices.
        batch_size: chains advanced together on one device (``lax.map``); ``None``:
            all of a device's chains in one ``vmap``.
        chunk_size: draws per compiled call (default ``min(total draws, 250)``); also
            how often the progress bar moves.
        progress: a progress bar; ``None``: on in a terminal only.
        keep_warmup: keep warmup draws and stats in ``Trace.warmup_draws`` / ``warmup_stats``.

    Returns:
        A ``Trace`` with numpy ``draws`` and ``stats`` ``(chain, draw, ...)`` and the
        sharded ``final_state``.

    Raises:
        TypeError, ValueError: for bad arguments, before any compilation.
        ValueError: also if some chains start at a non-finite log density (their
            indices are listed), before the sampling loop is compiled.

    Example:
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
    if not isinstance(keep_warmup, bool):
        raise TypeError(f"run: keep_warmup must be True or False, got {keep_warmup!r}.")
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
        mesh = _mesh.chain_mesh(min(n, len(jax.devices())))
    layout = _mesh.make_layout(n, mesh, batch_size)
    b = layout.batch_size
    total_draws = (num_warmup + num_samples) // thinning
    warmup_draws = num_warmup // thinning
    chunk_len = min(total_draws, chunk_size or DEFAULT_CHUNK_SIZE)
    params = _mesh.replicate(kernel.params, mesh) if kernel.params is not None else None
    fn_key = (kernel.functions, mesh, b)

    # -- keys and initial states
    compile_time = 0.0
    init_key, step_key = chain_keys(rng_key, n)
    step_key = _mesh.place(_mesh.pad(step_key, n, layout.padded), mesh)
    if previous is None:
        args = _mesh.place(_mesh.pad((position, init_key), n, layout.padded), mesh)
        args = (*args, params)
        init, dt = _compiled(("init", *fn_key), lambda: _init_program(kernel, mesh, b), args)
        compile_time += dt
        state, lp = init(*args)
        if kernel.logdensity is not None:
            lp = np.asarray(lp)[:n]
            bad = np.flatnonzero(~np.isfinite(lp))
            if bad.size:
                raise ValueError(
                    f"run: initial_position: the log density is not finite at the start of "
                    f"chain(s) {bad.tolist()} (values {lp[bad].tolist()[:8]}). Start those "
                    "chains inside the support of the target."
                    + (f" {hint}" if (hint := getattr(kernel, "init_error_hint", None)) else "")
                )
    else:
        state = _mesh.place(_mesh.pad(state, n, layout.padded), mesh)

    # -- the loop
    def chunk_args(first: int, count: int) -> tuple:
        start = np.int32(start_step + first * thinning)
        return (state, step_key, start, np.int32(count), params)

    sig_args = _mesh.replicate(chunk_args(0, chunk_len)[2:4], mesh)
    chunk_fn, dt = _compiled(
        ("chunk", *fn_key, chunk_len, thinning),
        lambda: _chunk_program(kernel, mesh, b, chunk_len, thinning),
        (state, step_key, *sig_args, params),
    )
    compile_time += dt

    keep = _Sink(n, num_samples // thinning)
    keep_w = _Sink(n, warmup_draws) if keep_warmup and warmup_draws else None
    bar = _progress_bar(
        progress, num_warmup + num_samples, "warmup" if warmup_draws else "sampling"
    )
    divergences = 0

    def collect(pending):
        nonlocal divergences
        first, count, out = pending
        draws, stats = out
        lo, hi = first, first + count
        parts = []
        if lo < warmup_draws and keep_w is not None:
            parts.append((keep_w, lo, slice(0, min(hi, warmup_draws) - lo)))
        if hi > warmup_draws:
            a = max(lo, warmup_draws)
            parts.append((keep, a - warmup_draws, slice(a - lo, hi - lo)))
        if parts:
            draws, stats = jax.device_get((draws, stats))
            for sink, at, src in parts:
                sink.write((draws, stats), at, src)
            if "diverging" in stats and hi > warmup_draws:
                divergences += int(np.sum(stats["diverging"][:n, parts[-1][2]]))
        bar.update(count * thinning)
        if lo < warmup_draws <= hi:
            bar.set_description("sampling")
        if divergences:
            bar.set_postfix(divergences=divergences, refresh=False)

    t0 = time.perf_counter()
    pending = None
    try:
        for first in range(0, total_draws, chunk_len):
            count = min(chunk_len, total_draws - first)
            start, valid = _mesh.replicate(chunk_args(first, count)[2:4], mesh)
            state, out = chunk_fn(state, step_key, start, valid, params)
            if pending is not None:
                collect(pending)  # the next chunk is already running on the devices
            pending = (first, count, out)
        collect(pending)
        jax.block_until_ready(state)
    finally:
        bar.close()
    sampling_time = time.perf_counter() - t0

    def finish(sink):
        if sink is None:
            return None, None
        return sink.arrays

    draws, stats = finish(keep)
    w_draws, w_stats = finish(keep_w)
    groups = kernel_groups(kernel)
    log_likelihood = getattr(kernel, "log_likelihood_group", None)
    if log_likelihood is not None:
        groups["log_likelihood"] = log_likelihood(draws)
    attrs = {
        **_versions(),
        "num_chains": n,
        "num_devices": layout.num_devices,
        "chains_per_device": layout.per_device,
        "padded_chains": layout.padded - n,
        "mesh_shape": [layout.num_devices],
        "batch_size": "all" if b is None else b,
        "chunk_size": chunk_len,
        "thinning": thinning,
        "num_warmup": num_warmup,
        "first_step": start_step,
        "seed": np.asarray(jax.random.key_data(rng_key)).tolist(),
        "compile_time": compile_time,
        "sampling_time": sampling_time,
        "layout": layout.describe(),
    }
    return Trace(
        draws=draws,
        stats=stats,
        final_state=_mesh.unpad(state, n, layout.padded, mesh),
        num_steps=start_step + num_warmup + num_samples,
        warmup_draws=w_draws,
        warmup_stats=w_stats,
        attrs=attrs,
        groups=groups,
    )


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

    Example:
        >>> import blackjax, jax, jax.numpy as jnp
        >>> import chainrunner as cr
        >>> nuts = blackjax.nuts(lambda x: -0.5 * jnp.sum(x**2), 0.8, jnp.ones(2))
        >>> data = cr.sample(nuts, jax.random.key(1), jnp.zeros((4, 2)), 100, progress=False)
        >>> data.posterior["x"].shape
        (4, 100, 2)
    """
    return run(kernel, rng_key, initial_position, num_samples, **options).to_arviz(
        coords=coords, dims=dims
    )
