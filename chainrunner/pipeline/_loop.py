"""The ``compile`` and ``loop`` stages: the chunk program, and the chunks run through it.

Each chunk is one call of the compiled chunk program (``chunk_len`` draws at most, a
run-time trip count for a shorter last one). The next chunk is dispatched before the
previous one is collected, so the host copies draws while the devices sample.
"""

from __future__ import annotations

import functools
import time
from typing import Any, NamedTuple

import jax
import numpy as np

from ..core._kernel import Kernel
from ..layout import _distributed, _mesh
from ..programs._compile import Ahead, compiled, in_this_context
from ..programs._programs import chunk_program
from ._plan import DEFAULT_CHUNK_SIZE

QUIET_CHUNK_SIZE = 2000
"""Draws per compiled call at most (``schedule``) with ``chunk_size=None``:
a run of 1000 warmup steps and 1000 draws (numpyro's and Stan's default) in one call."""
QUIET_STEPS = (500, 1000, QUIET_CHUNK_SIZE)
"""A longer chunk: the first of these that holds the run (or an eighth of it, under a
progress bar), so that runs of other lengths share a few programs."""
BAR_UPDATES = 8
"""Where a progress bar may show, a chunk holds at most an eighth of the run (at least
250 draws): the bar moves at least this many times."""


class Schedule(NamedTuple):
    """The lengths of the chunk loop.

    Attributes:
        first_step: global number of the loop's first kernel step.
        warmup_draws: leading draws of the loop that are warmup (0 after a cross-chain warmup).
        total_draws: draws the loop runs (warmup and kept), ``steps // thinning``.
        chunk_len: draws per compiled call (a longer chunk's: its compiled program's,
            ``fitted``; before it is compiled, at most ``cap``).
        grid: ``chunk_size`` (default 250) or the run, if shorter: the chunk of a run
            whose boundaries something needs.
        cap: draws per call the chunk programs are built with (at most).
        fit: a longer chunk's programs fit ``cap`` down to ``QUIET_CHUNK_BYTES`` of outputs
            per device, to no fewer than this many draws; ``None``: ``cap`` draws.
    """

    first_step: int
    warmup_draws: int
    total_draws: int
    chunk_len: int
    grid: int
    cap: int
    fit: int | None = None


def schedule(
    plan: Any, first_step: int, cross_chain: bool, previous: int | None = None
) -> Schedule:
    """The loop's lengths; a cross-chain warmup runs the warmup before the loop.

    ``chunk_size=None`` gives chunks of 250 draws where something needs their boundaries
    (``monitor``, checkpoints, convergence checks, several processes). Otherwise the
    chunk is the first of 250, 500, 1000 and 2000 draws that holds the run
    (``QUIET_STEPS``), or, where a progress bar may show (``progress`` not ``False``),
    an eighth of it (``BAR_UPDATES``: the bar moves at least 8 times); ``previous``, a
    continued trace's chunk, if longer: its program again. Fewer draws where a device's
    outputs would pass ``QUIET_CHUNK_BYTES`` (every boundary costs a short run a
    millisecond or more: ``docs/long-runs.md``). Whether a terminal is attached never
    changes the chunks, so a notebook, a terminal and a pipe compile the same programs.
    """
    loop_warmup = 0 if cross_chain else plan.num_warmup
    total = (loop_warmup + plan.num_samples) // plan.thinning
    grid = min(total, plan.chunk_size or DEFAULT_CHUNK_SIZE)
    longer = plan.chunk_size is None and total > grid and not needs_boundaries(plan)
    cap = grid
    if longer:
        holds = total if plan.progress is False else -(-total // BAR_UPDATES)
        cap = next((c for c in (grid, *QUIET_STEPS) if c >= holds), QUIET_CHUNK_SIZE)
        cap = max(cap, previous or 0)
    return Schedule(
        first_step=first_step + plan.num_warmup - loop_warmup,
        warmup_draws=loop_warmup // plan.thinning,
        total_draws=total,
        chunk_len=cap,
        grid=grid,
        cap=cap,
        fit=DEFAULT_CHUNK_SIZE if cap > grid else None,
    )


def needs_boundaries(plan: Any) -> bool:
    """Whether something needs the run's chunk boundaries every 250 draws: the
    monitor, checkpoints, ``until`` or ``warmup_until``; several processes (each must
    build the same program, and only one shows a bar) count too."""
    return (
        plan.monitor
        or plan.checkpoint is not None
        or plan.until is not None
        or plan.warmup_until is not None
        or _distributed.is_multiprocess()
    )


def fitted(sched: Schedule, loop: Any) -> Schedule:
    """``sched`` with the draws per call of ``loop``, a compiled chunk program."""
    leaves = jax.tree.leaves(loop.out_info[1])  # (chain, draw, ...)
    return sched._replace(chunk_len=leaves[0].shape[1] if leaves else sched.cap)


def compile_loop(
    kernel: Kernel, plan: Any, placed: Any, sched: Schedule, state: Any, on_traced=None
) -> tuple[Any, float]:
    """The compiled chunk program for ``state`` (arrays or shape structs), and seconds spent."""
    mesh, b = placed.mesh, placed.layout.batch_size
    zero = chunk_scalars(0, 0, mesh)
    n = placed.layout.num_chains
    key = ("chunk", kernel.functions, mesh, b, sched.cap, sched.fit, plan.thinning, plan.keep)
    key += (n,) if kernel.ensemble is not None or sched.fit is not None else ()
    return compiled(
        key,
        lambda: chunk_program(kernel, mesh, b, sched.cap, plan.thinning, plan.keep, n, sched.fit),
        (state, placed.chains, placed.key, *zero, placed.params),
        on_traced,
    )


@functools.lru_cache(maxsize=256)
def chunk_scalars(start: int, count: int, mesh: Any) -> tuple[jax.Array, jax.Array]:
    """A chunk's first step and draw count, replicated on the mesh.

    Cached: a repeated run's chunks start at the same steps, and two host-to-device
    copies per chunk are a measurable part of a short run's fixed cost.
    """
    return _mesh.replicate((np.int32(start), np.int32(count)), mesh)


def compile_ahead(kernel: Kernel, plan: Any, placed: Any, sched: Schedule) -> Any:
    """An ``on_traced`` hook for the init program that compiles the loop on a second thread.

    XLA compiles one program mostly on one core: the loop compiles while the init
    compiles and runs. The hook keeps the ``Ahead`` it starts in ``hook.ahead`` (``None``
    when this thread's jax settings keep the compile on the calling thread).
    """

    def hook(init_out: Any) -> None:
        sharding = _mesh.chain_sharding(placed.mesh)
        like = jax.tree.map(
            lambda s: jax.ShapeDtypeStruct(
                s.shape, s.dtype, sharding=sharding, weak_type=s.weak_type
            ),
            init_out[0],
        )
        go = in_this_context(lambda traced: compile_loop(kernel, plan, placed, sched, like, traced))
        if go is not None:
            hook.ahead = Ahead(go, "chainrunner-compile-loop")

    hook.ahead = None
    return hook


class LoopResult(NamedTuple):
    """What the chunk loop did: its time, and whether Ctrl-C stopped it."""

    sampling_time: float
    interrupted: bool


def _chunk_starts(first: int, total: int, chunk_len: int) -> list[int]:
    """Where the chunks from draw ``first`` start: on the run's grid of ``chunk_len``
    draws (a run resumed mid-chunk runs up to the grid first), so that ``until`` checks
    fall on the same draws whatever ran before."""
    if first >= total:
        return []
    return [first, *range((first // chunk_len + 1) * chunk_len, total, chunk_len)]


def run_chunks(
    loop: Any, state: Any, placed: Any, plan: Any, sched: Schedule, collector: Any, first: int
) -> LoopResult:
    """Runs draws ``first..total_draws-1`` chunk by chunk into ``collector``.

    Each chunk is dispatched before the previous one is collected, so the host copies
    draws while the devices sample. Ctrl-C stops after the chunks already collected;
    the collector then holds them.
    """
    end = sched.total_draws
    t0 = time.perf_counter()
    pending = None
    collector.draws_done, collector.state = first, state
    if collector.stop:  # a resumed run that had already converged
        return LoopResult(0.0, False)
    try:
        for at in _chunk_starts(first, end, sched.chunk_len):
            if pending is not None and collector.check_due(pending[0] + pending[1]):
                # A convergence check follows the chunk: collect it before starting the
                # next, which would be thrown away if the check stops the run.
                collector.collect(*pending)
                pending = None
                if collector.stop:
                    break
            count = min(sched.chunk_len - at % sched.chunk_len, end - at)
            first_step = sched.first_step + at * plan.thinning
            start, valid = chunk_scalars(first_step, count, placed.mesh)
            state, out = loop(state, placed.chains, placed.key, start, valid, placed.params)
            if pending is not None:
                collector.collect(*pending)  # the next chunk is already running
                if collector.stop:  # converged: the chunk in flight is not kept
                    pending = None
                    break
            pending = (at, count, state, out)
        if pending is not None:
            collector.collect(*pending)
        jax.block_until_ready(state)
    except KeyboardInterrupt:
        return LoopResult(time.perf_counter() - t0, True)
    return LoopResult(time.perf_counter() - t0, False)
