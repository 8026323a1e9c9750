"""The compiled programs: keys, the per-chain loop, and the init and chunk programs.

Keys: chain ``i`` gets ``split(fold_in(rng_key, i))`` = ``(init key, step key)`` and step
``t`` of it ``fold_in(step key, t)``, so neither the layout nor the chunking changes which
random numbers a chain sees. Both programs derive the keys themselves from the run's key
(replicated) and the chain indices (sharded): no separate key program.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap
from jax.extend.core import jaxpr_as_fun
from jax.sharding import Mesh

from ..core._kernel import Kernel
from ..core._lru import LRU
from ..core._settings import trace_settings
from ..layout import _mesh
from . import _ensemble
from ._compile import TRACE_LOCK, signature
from ._replay import replayed

# A chunk longer than the default 250 draws (``_loop.schedule``) stays so only while its
# outputs stay within this many bytes per device.
QUIET_CHUNK_BYTES = 64 * 2**20

# Number of times each program body has been traced (a trace precedes every compile).
# Tests read it to check the no-recompile promises.
trace_counts: dict[str, int] = {"init": 0, "chunk": 0}


def chain_key_pair(rng_key: jax.Array, chain: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Chain ``chain``'s ``(init_key, step_key)``: ``split(fold_in(rng_key, chain))``."""
    init_key, step_key = jax.random.split(jax.random.fold_in(rng_key, chain))
    return init_key, step_key


def chain_keys(rng_key: jax.Array, num_chains: int) -> tuple[jax.Array, jax.Array]:
    """Per-chain ``(init_key, step_key)`` of chains ``0..num_chains-1``, eagerly.

    The compiled programs derive the same keys themselves; this form serves
    re-initialisation.
    """
    chains = jnp.arange(num_chains, dtype=jnp.uint32)
    return jax.vmap(chain_key_pair, in_axes=(None, 0))(rng_key, chains)


def retry_key(init_key: jax.Array, tries: jax.Array) -> jax.Array:
    """The init key of a chain re-initialised ``tries`` times (``fold_in`` by try 1, 2, ...)."""
    return jax.lax.fori_loop(0, tries, lambda j, k: jax.random.fold_in(k, j + 1), init_key)


def draw_bytes(out_shape: Any) -> int:
    """Bytes of one draw's outputs (shape structs of a chain's draws and stats)."""
    return sum(
        math.prod(s.shape) * getattr(s.dtype, "itemsize", 8) for s in jax.tree.leaves(out_shape)
    )


def fitted_rows(cap: int, least: int, chains: int, out_shape: Any) -> int:
    """Rows of a longer chunk: ``cap``, fewer where ``chains`` chains' outputs
    (``out_shape``: one chain's draw, ``draw_shape``) would pass ``QUIET_CHUNK_BYTES``,
    never under ``least``."""
    per_draw = chains * draw_bytes(out_shape)
    if per_draw == 0:
        return cap
    return max(min(cap, least), min(cap, QUIET_CHUNK_BYTES // per_draw))


class StepTrace(NamedTuple):
    """One draw of one chain (``thinning`` kernel steps, then the extract), traced once:
    ``replay(state, keys) -> (state, (draws, stats))`` replays that trace (no second
    trace of the kernel's Python code), and ``draw`` is one draw's shape structs."""

    replay: Callable
    draw: Any


def advance_fn(kernel: Kernel, thinning: int, step: Callable | None = None) -> Callable:
    """``advance(state, keys) -> (state, (draws, stats))``: ``thinning`` kernel steps with
    ``keys`` (one per step), then the kernel's extract; ``step``: the kernel's step
    (``kernel.step`` unless given, e.g. replayed from its jaxpr)."""
    step = kernel.step if step is None else step

    def one_step(keys, j, state):
        return step(keys[j], state)[0]

    def advance(state, keys):
        if thinning > 1:
            state = jax.lax.fori_loop(0, thinning - 1, functools.partial(one_step, keys), state)
        state, info = step(keys[thinning - 1], state)
        return state, kernel.extract(state, info)

    return advance


def trace_step(
    kernel: Kernel, thinning: int, state: Any, key: Any, step: Callable | None = None
) -> StepTrace:
    """``advance_fn``'s one draw traced to a jaxpr for one chain of ``state`` (leading
    chain axis; arrays, tracers or shape structs), with keys like ``key``; ``step``: the
    kernel's step as ``advance_fn`` takes it.

    Works inside another trace: what the kernel closes over (its params) becomes the
    jaxpr's constants, replayed as they are.
    """
    one = jax.tree.map(lambda x: _struct(x, np.shape(x)[1:]), state)
    keys = _struct(key, (thinning,))
    advance = advance_fn(kernel, thinning, step)
    closed, shape = jax.make_jaxpr(advance, return_shape=True)(one, keys)
    fun, tree = jaxpr_as_fun(closed), jax.tree.structure(shape)

    def replay(state, keys):
        return jax.tree.unflatten(tree, fun(*jax.tree.leaves((state, keys))))

    return StepTrace(replay, shape[1])


def chunk_loop(
    kernel: Kernel, chunk_len: int, thinning: int, step: StepTrace | None = None
) -> Callable[[Any, jax.Array, jax.Array, jax.Array], tuple[Any, tuple[Any, dict]]]:
    """The inference loop of one chain for one chunk of at most ``chunk_len`` draws.

    Returns ``loop(state, step_key, start, n_valid) -> (state, (draws, stats))``.
    Draw ``i`` runs kernel steps ``start + i * thinning + j`` (``j < thinning``); step
    ``t`` uses the key ``fold_in(step_key, t)``, so neither the chunking nor the
    layout changes which random numbers a chain sees. Only the first ``n_valid``
    draws are run (a loop with a run-time trip count that does not depend on the
    chain, so under ``vmap`` it stays one loop); the outputs keep ``chunk_len`` rows
    and the rest are zeros. One compiled program thus serves every chunk, including
    a shorter last one, with no per-step branch (a ``lax.cond`` per draw measured
    ~17% slower for NUTS on CPU). ``step``: the draw already traced (``trace_step``),
    replayed here; else the step is traced here (twice: its shape, then the loop).
    """

    def step_keys(step_key, first, n):
        # Keys of steps first .. first + n - 1, derived in one vectorised call: the same
        # bits as one fold_in per step, without a hash (a small loop on CPU) in every step.
        return jax.vmap(jax.random.fold_in, (None, 0))(step_key, first + jnp.arange(n))

    advance = advance_fn(kernel, thinning) if step is None else step.replay

    def loop(state, step_key, start, n_valid):
        if step is None:
            out_shape = jax.eval_shape(advance, state, step_keys(step_key, start, thinning))[1]
        else:
            out_shape = step.draw
        # Without thinning, the chunk's keys at once (one per row: less memory than its
        # draws); with thinning, each draw's keys.
        chunk_keys = step_keys(step_key, start, chunk_len) if thinning == 1 else None

        def keys_of(i):
            if chunk_keys is not None:
                return jax.lax.dynamic_slice_in_dim(chunk_keys, i, 1)
            return step_keys(step_key, start + i * thinning, thinning)

        buffers = jax.tree.map(lambda s: jnp.zeros((chunk_len, *s.shape), s.dtype), out_shape)

        def body(i, carry):
            state, buffers = carry
            state, out = advance(state, keys_of(i))
            buffers = jax.tree.map(
                lambda b, o: jax.lax.dynamic_update_index_in_dim(b, o, i, 0), buffers, out
            )
            return state, buffers

        return jax.lax.fori_loop(0, n_valid, body, (state, buffers))

    if kernel.machine is None or thinning != 1:
        return loop
    return machine_loop(loop, kernel.machine(kernel.extract, chunk_len))


def machine_loop(loop: Callable, batched: Callable) -> Callable:
    """``loop`` (one chain's chunk), which under ``vmap`` runs as ``batched`` (a batch's
    chunk as a state machine, ``Kernel.machine``): the same draws, and no chain of the
    batch waits for the batch's longest transition. Unbatched (``batch_size=1``) it is ``loop``."""

    @custom_vmap
    def chunk(state, step_key, start, n_valid):
        return loop(state, step_key, start, n_valid)

    @chunk.def_vmap
    def rule(axis_size, in_batched, state, step_key, start, n_valid):
        state_batched, key_batched, start_batched, n_batched = in_batched
        # A vmap of one chain waits for no other: the plain loop, as ``batch_size=1`` runs
        # it (one chain per device then gives the same draws on any device count).
        if start_batched or n_batched or axis_size == 1:
            axes = tuple(jax.tree.map(lambda b: 0 if b else None, in_batched))
            out = jax.vmap(loop, in_axes=axes)(state, step_key, start, n_valid)
        else:
            state = jax.tree.map(
                lambda x, b: x if b else jnp.broadcast_to(x, (axis_size, *jnp.shape(x))),
                state, state_batched,
            )  # fmt: skip
            if not key_batched:
                step_key = jnp.broadcast_to(step_key, (axis_size,))
            out = batched(state, step_key, start, n_valid)
        return out, jax.tree.map(lambda _: True, out)

    return chunk


def apply_keep(kernel: Kernel, keep: Any) -> Kernel:
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
                what = "an array" if hasattr(draws, "shape") else f"a {type(draws).__name__}"
                raise ValueError(
                    f"run: keep={list(keep)} names draws, but this kernel's draws are "
                    f"{what}, not a dict of sites."
                )
            missing = [k for k in keep if k not in draws]
            if missing:
                raise ValueError(
                    f"run: keep names {missing}, which are not among the draws {sorted(draws)}."
                )
            return {k: draws[k] for k in keep}, stats

    return kernel._replace(extract=kept)


_DRAW_SHAPES = LRU(64)
_STEPS = LRU(64)
_INITS = LRU(64)


class KernelStep(NamedTuple):
    """One chain's kernel step, traced once (``kernel_step``): its jaxpr and what it returns."""

    jaxpr: Any
    """The step's ``ClosedJaxpr``: ``(rng_key, state, params) -> (state, info)``, leaves."""
    state: Any
    """Shape structs of the state the step returns."""
    info: Any
    """Shape structs of the step's info."""

    def call(
        self, rng_key: Any, state: Any, params: Any, unrolled: bool = False
    ) -> tuple[Any, Any]:
        """The step replayed from its jaxpr (no second trace of the kernel's Python);
        ``unrolled``: its threefry key derivations written out (``_replay``, for CPU)."""
        out = replayed(self.jaxpr, unrolled)(*jax.tree.leaves((rng_key, state, params)))
        return jax.tree.unflatten(jax.tree.structure((self.state, self.info)), out)


class KernelInit(NamedTuple):
    """One chain's kernel init, traced once (``kernel_step``): its jaxpr and its state."""

    jaxpr: Any
    """The init's ``ClosedJaxpr``: ``(position, rng_key, params) -> state``, leaves."""
    state: Any
    """Shape structs of the state the init returns."""

    def call(self, position: Any, rng_key: Any, params: Any, unrolled: bool = False) -> Any:
        """The init replayed from its jaxpr (no second trace of the kernel's Python);
        ``unrolled`` as in ``KernelStep.call``."""
        out = replayed(self.jaxpr, unrolled)(*jax.tree.leaves((position, rng_key, params)))
        return jax.tree.unflatten(jax.tree.structure(self.state), out)


def kernel_step(kernel: Kernel, position: Any, state: Any) -> KernelStep:
    """One chain's step traced (nothing compiled), from one chain's init where ``state`` is
    ``None``: the one trace of the kernel's step that ``draw_shape``, the batch-size rule
    (``_choose.step_flops``) and the chunk program (``sample_chunk``) all read.
    ``position``/``state``: the run's (leading chain axis), one of them ``None``. Cached
    per ``kernel`` object (``run`` makes one per call: a trace is replayed only in the
    call that made it, so what the kernel's Python reads, a global, a file, is read again
    by the next call), shapes and trace settings."""
    one = jax.tree.map(lambda x: _struct(x, np.shape(x)[1:]), (position, state))
    if state is None:
        one = (None, _init_of(kernel, one[0]).state)
    return _step_of(kernel, one[1], _struct(jax.random.key(0), ()), TRACE_LOCK)


def _init_key(kernel: Kernel, position: Any, settings: tuple) -> tuple:
    return (id(kernel), signature((position, kernel.params)), settings)


def _init_of(kernel: Kernel, position: Any) -> KernelInit:
    """The init traced for one chain's ``position`` structs (``None`` where the kernel
    draws its own), cached per ``kernel`` object like the step."""
    key = _init_key(kernel, position, _step_settings())
    found, init = _INITS.lookup(key, owner=kernel)
    return init if found else _INITS.put(key, _trace_init(kernel, position), owner=kernel)


def _outer_init(kernel: Kernel, position: Any, rng_key: Any, params: Any, unrolled: bool) -> Any:
    """Inside the init program's ``shard_map``: the init as ``kernel_step`` traced it
    outside any mesh, replayed, where it did (the batch-size rule traces it first); else
    the kernel's init, traced here."""
    one = jax.tree.map(lambda x: _struct(x, np.shape(x)), position)
    outside = (*trace_settings()[:-1], _NO_MESH)
    found, init = _INITS.lookup(_init_key(kernel, one, outside), owner=kernel)
    if found:
        return init.call(position, rng_key, params, unrolled)
    return kernel.bind(params).init(position, rng_key)


def _step_key(kernel: Kernel, state: Any, rng_key: Any, settings: tuple) -> tuple:
    return (id(kernel), signature((state, rng_key, kernel.params)), settings)


def _outer_step(kernel: Kernel, state: Any, rng_key: Any) -> KernelStep:
    """Inside a program's ``shard_map`` (``TRACE_LOCK`` held): the step as ``kernel_step``
    traced it outside any mesh, where it did; else traced here, under the program's mesh
    (a jaxpr traced there carries that mesh in its types: kept apart by its key)."""
    outside = (*trace_settings()[:-1], _NO_MESH)
    found, stepped = _STEPS.lookup(_step_key(kernel, state, rng_key, outside), owner=kernel)
    return stepped if found else _step_of(kernel, state, rng_key, contextlib.nullcontext())


_NO_MESH = "no mesh"


def _step_settings() -> tuple:
    """``trace_settings``, with one name for every context without a mesh."""
    settings = trace_settings()
    mesh = getattr(jax.sharding, "get_abstract_mesh", lambda: None)()
    if mesh is None or getattr(mesh, "empty", False):
        return (*settings[:-1], _NO_MESH)
    return settings


def _replay(
    stepped: KernelStep, params: Any, unrolled: bool, rng_key: Any, state: Any
) -> tuple[Any, Any]:
    return stepped.call(rng_key, state, params, unrolled)


def _struct(x: Any, shape: tuple) -> jax.ShapeDtypeStruct:
    aval = getattr(x, "aval", x)
    return jax.ShapeDtypeStruct(shape, aval.dtype, weak_type=getattr(aval, "weak_type", False))


def _trace_init(kernel: Kernel, position: Any) -> KernelInit:
    def init(position, rng_key, params):
        return kernel.bind(params).init(position, rng_key)

    rng_key = _struct(jax.random.key(0), ())
    with TRACE_LOCK:
        jaxpr, out = jax.make_jaxpr(init, return_shape=True)(position, rng_key, kernel.params)
    return KernelInit(jaxpr, out)


def _step_of(kernel: Kernel, state: Any, rng_key: Any, lock: Any) -> KernelStep:
    """The step traced for one chain's ``state`` and ``rng_key`` structs, under ``lock``
    (``TRACE_LOCK``, or a null context inside a trace that holds it). Never built under
    the cache's lock: a thread tracing a program (holding ``TRACE_LOCK``) looks it up too."""
    key = _step_key(kernel, state, rng_key, _step_settings())
    found, stepped = _STEPS.lookup(key, owner=kernel)
    if found:
        return stepped

    def step(rng_key, state, params):
        return kernel.bind(params).step(rng_key, state)

    with lock:
        jaxpr, out = jax.make_jaxpr(step, return_shape=True)(rng_key, state, kernel.params)
    return _STEPS.put(key, KernelStep(jaxpr, *out), owner=kernel)


def draw_shape(kernel: Kernel, keep: Any, position: Any, state: Any, n: int) -> Any:
    """Shape structs of one chain's draw and stats: what a chunk stores per draw.

    From an abstract trace (nothing compiled) of one chain's init (where ``state`` is
    ``None``), step (``kernel_step``) and extract, with ``keep`` applied, so bad ``keep=``
    names raise here; cached per kernel, ``keep`` and shapes. ``position``/``state`` are
    the run's (leading chain axis), one of them ``None``; ``n``: the real chains (an
    ensemble's walkers).
    """
    one = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x)[1:], x.dtype), (position, state))
    key = (kernel.functions, keep, n, signature((one, kernel.params)), trace_settings())
    return _DRAW_SHAPES.get(key, lambda: _draw_shape(kernel, keep, position, state, n))


def _draw_shape(kernel: Kernel, keep: Any, position: Any, state: Any, n: int) -> Any:
    """``draw_shape``, uncached."""
    if kernel.ensemble is not None:
        extract_of = functools.partial(_kept_extract, kernel, keep)
        with TRACE_LOCK:
            return _ensemble.draw_shape(kernel, extract_of, position, state, n)
    stepped = kernel_step(kernel, position, state)

    def extract(state, info, params):
        return apply_keep(kernel.bind(params), keep).extract(state, info)

    with TRACE_LOCK:
        return jax.eval_shape(extract, stepped.state, stepped.info, kernel.params)


def _kept_extract(kernel: Kernel, keep: Any, params: Any) -> Callable:
    return apply_keep(kernel.bind(params), keep).extract


def check_keep_names(kernel: Kernel, keep: Any, position: Any, state: Any, n: int) -> None:
    """Raises ``apply_keep``'s error for ``keep`` names now, before anything compiles."""
    if keep is not None and not callable(keep):
        draw_shape(kernel, keep, position, state, n)


def unrolled_random(mesh: Mesh) -> bool:
    """Whether programs on ``mesh`` replay the kernel's threefry random numbers written out
    (``_replay``): on CPU, where JAX's own are rolled loops. Accelerators keep JAX's."""
    return mesh.devices.flat[0].platform == "cpu"


def init_program(kernel: Kernel, mesh: Mesh, batch_size: int | None, n: int) -> Callable:
    """``(position, chain, tries, rng_key, params) -> (state, lp)``, over the mesh.

    ``n`` is the number of real chains; an ensemble's program depends on it.
    """
    if kernel.ensemble is not None:
        return _ensemble.init_program(kernel, mesh, batch_size, n, trace_counts)

    unrolled = unrolled_random(mesh)

    def init_chains(position, chain, tries, rng_key, params):  # (the name JAX's logs give)
        trace_counts["init"] += 1
        k = kernel.bind(params)  # params are replicated, closed over (not mapped)

        def one(args):
            position, chain, tries = args
            init_key = retry_key(chain_key_pair(rng_key, chain)[0], tries)
            state = _outer_init(kernel, position, init_key, params, unrolled)
            lp = k.logdensity(state) if k.logdensity is not None else None
            return state, jnp.zeros(()) if lp is None else jnp.asarray(lp)

        return _mesh.local_map(one, batch_size)((position, chain, tries))

    return _mesh.shard_chains(init_chains, mesh, num_chained=3, num_replicated=2)


def chunk_program(
    kernel: Kernel, mesh: Mesh, batch_size: int | None, chunk_len: int, thinning: int, keep: Any,
    n: int, least: int | None = None,
) -> Callable:  # fmt: skip
    """``(state, chain, rng_key, start, n_valid, params) -> (state, (draws, stats))``.

    The outputs have ``chunk_len`` rows per chain, or, where ``least`` is given, as many
    as fit ``QUIET_CHUNK_BYTES`` per device (``fitted_rows``, never under ``least``): the
    one trace of the step (``trace_step``) gives the draw's size, and the loop replays
    it. So the rows follow from the call's shapes alone, before anything compiles; the
    program's outputs say them (``_loop.compile_loop``). ``n`` is the number of real
    chains; an ensemble's program depends on it.
    """
    if kernel.ensemble is not None:
        return _ensemble.chunk_program(
            kernel, mesh, batch_size, n, chunk_len, thinning,
            functools.partial(_kept_extract, kernel, keep), trace_counts,
        )  # fmt: skip

    unrolled = unrolled_random(mesh)

    def sample_chunk(state, chain, rng_key, start, n_valid, params):
        trace_counts["chunk"] += 1
        k = apply_keep(kernel.bind(params), keep)
        one = jax.tree.map(lambda x: _struct(x, np.shape(x)[1:]), state)
        # The step's one trace (``kernel_step``: the rule and the draw's shape read it too)
        stepped = _outer_step(kernel, one, _struct(rng_key, ()))
        replay = functools.partial(_replay, stepped, params, unrolled)
        step = trace_step(k, thinning, state, rng_key, replay)
        rows = chunk_len
        if least is not None:
            rows = fitted_rows(chunk_len, least, jax.tree.leaves(state)[0].shape[0], step.draw)
        loop = chunk_loop(k, rows, thinning, step)

        def one_chain(args):
            state, chain = args
            return loop(state, chain_key_pair(rng_key, chain)[1], start, n_valid)

        return _mesh.local_map(one_chain, batch_size)((state, chain))

    return _mesh.shard_chains(sample_chunk, mesh, num_chained=2, num_replicated=4)
