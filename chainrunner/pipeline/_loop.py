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
from ..programs._compile import Ahead, compiled, in_this_context, signature
from ..programs._programs import chunk_program, draw_shape, fitted_rows
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
    """The lengths of the chunk loop, decided before anything compiles.

    Attributes:
        first_step: global number of the loop's first kernel step.
        warmup_draws: leading draws of the loop that are warmup (0 after a cross-chain warmup).
        total_draws: draws the loop runs (warmup and kept), ``steps // thinning``.
        chunk_len: draws per compiled call (the rows of the chunk program's outputs);
            where ``fit``, the most: the chunk program fits them to the draw's size
            (``_programs.chunk_program``), and its compiled ``Chunks.sched`` says them.
        thinning: kernel steps per draw.
        fit: whether the rows are still to be fitted to the draw's size.
    """

    first_step: int
    warmup_draws: int
    total_draws: int
    chunk_len: int
    thinning: int = 1
    fit: bool = False

    def after_burn_in(self, loop_draws: int, sample_draws: int) -> Schedule:
        """The sampling loop after ``warmup_until``'s burn-in ran ``loop_draws`` draws:
        its first step after the whole warmup, no warmup draws left in it."""
        return self._replace(
            first_step=self.first_step + loop_draws * self.thinning,
            warmup_draws=0,
            total_draws=sample_draws,
        )


def schedule(plan: Any, start: Any, layout: Any, kernel: Kernel, state: Any) -> Schedule:
    """The loop's lengths; a cross-chain warmup runs the warmup before the loop.

    ``chunk_size=None`` gives chunks of 250 draws where something needs their boundaries
    (``monitor``, checkpoints, convergence checks, several processes). Otherwise the
    chunk is the first of 250, 500, 1000 and 2000 draws that holds the run
    (``QUIET_STEPS``), or, where a progress bar may show (``progress`` not ``False``),
    an eighth of it (``BAR_UPDATES``: the bar moves at least 8 times); a continued
    trace's chunk, if longer: its program again. Fewer draws (not under 250) where a
    device's outputs would pass ``QUIET_CHUNK_BYTES``: the chunk program's own trace of
    one step gives the draw's size (``fit``; an ensemble's from an abstract trace of
    ``kernel`` on ``state``, ``_programs.draw_shape``), before anything compiles. Every
    boundary costs a
    short run a millisecond or more (``docs/long-runs.md``). Whether a terminal is
    attached never changes the chunks, so a notebook, a terminal and a pipe compile the
    same programs.
    """
    loop_warmup = 0 if start.cross_chain else plan.num_warmup
    total = (loop_warmup + plan.num_samples) // plan.thinning
    grid = min(total, plan.chunk_size or DEFAULT_CHUNK_SIZE)
    chunk_len, fit = grid, False
    if plan.chunk_size is None and total > grid and not needs_boundaries(plan):
        cap = max(_longer_chunk(plan, total, grid), start.previous_chunk_size or 0)
        chunk_len, fit = cap, cap > grid
        if fit and kernel.ensemble is not None:  # (its program takes the rows as given)
            position = start.position if state is None else None
            draw = draw_shape(kernel, plan.keep, position, state, layout.num_chains)
            chunk_len = fitted_rows(cap, DEFAULT_CHUNK_SIZE, layout.per_device, draw)
            fit = False
    return Schedule(
        first_step=start.first_step + plan.num_warmup - loop_warmup,
        warmup_draws=loop_warmup // plan.thinning,
        total_draws=total,
        chunk_len=chunk_len,
        thinning=plan.thinning,
        fit=fit,
    )


def _longer_chunk(plan: Any, total: int, grid: int) -> int:
    """The first of ``grid`` and ``QUIET_STEPS`` that holds ``total`` draws, or an eighth
    of them where a bar may show (``progress`` not ``False``)."""
    holds = total if plan.progress is False else -(-total // BAR_UPDATES)
    return next((c for c in (grid, *QUIET_STEPS) if c >= holds), QUIET_CHUNK_SIZE)


def warmup_chunk(plan: Any) -> int:
    """Steps per chunk of a cross-chain warmup: ``schedule``'s rule for its draws
    (``chunk_size``, else 250 where something needs the boundaries, else the first of
    250, 500, 1000 and 2000 that holds the warmup or an eighth of it), times ``thinning``.

    Without a ``chunk_size``, the longest chunk of at most that many draws, and at least
    half of it, that divides the warmup: every chunk is then one program (a 300-step
    warmup runs as 2 x 150, not 250 + 50, which would compile a second program).
    """
    total = plan.num_warmup // plan.thinning
    grid = min(total, plan.chunk_size or DEFAULT_CHUNK_SIZE)
    if plan.chunk_size is None and total > grid and not needs_boundaries(plan):
        grid = _longer_chunk(plan, total, grid)
    chunk = min(grid, total)
    if plan.chunk_size is None:
        chunk = next((c for c in range(chunk, (chunk - 1) // 2, -1) if total % c == 0), chunk)
    return chunk * plan.thinning


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


def compile_loop(
    kernel: Kernel, plan: Any, placed: Any, sched: Schedule, state: Any, params: Any,
    on_traced: Any = None,
) -> tuple[Chunks, float]:  # fmt: skip
    """The chunk program for ``state`` (arrays or shape structs) and ``params`` (on the
    mesh), compiled and bound to the run's chains, key and ``params``; seconds spent."""
    mesh, b = placed.mesh, placed.layout.batch_size
    zero = chunk_scalars(0, 0, mesh)
    n, least = placed.layout.num_chains, DEFAULT_CHUNK_SIZE if sched.fit else None
    program, seconds = compiled(
        "chunk",
        chunk_program(kernel, mesh, b, sched.chunk_len, sched.thinning, plan.keep, n, least),
        (state, placed.chains, placed.key, *zero, params),
        on_traced,
        placed.options,
    )
    rows = [x.shape[1] for x in jax.tree.leaves(program.out_info[1])]
    fitted = sched._replace(chunk_len=rows[0] if rows else sched.chunk_len, fit=False)
    return Chunks(program, placed, params, fitted, signature((state, params)), sched), seconds


class Chunks(NamedTuple):
    """The compiled chunk program, bound to the run's chain ids, key and parameters.

    ``chunks(state, first_step, count) -> (state, (draws, stats))`` runs ``count`` draws
    from kernel step ``first_step``.
    """

    program: Any
    placed: Any
    params: Any
    sched: Schedule  # with the program's rows (fitted)
    signature: tuple
    asked: Schedule  # the schedule it was compiled for

    def compiled_for(self, sched: Schedule, state: Any, params: Any) -> bool:
        """Whether this program runs ``sched`` from ``state`` with ``params`` (the same
        shapes, dtypes and shardings: a state's shape structs say it too)."""
        return sched == self.asked and signature((state, params)) == self.signature

    def __call__(self, state: Any, first_step: int, count: int) -> tuple[Any, Any]:
        p = self.placed
        start, valid = chunk_scalars(first_step, count, p.mesh)
        return self.program(state, p.chains, p.key, start, valid, self.params)

    @property
    def out_info(self) -> Any:
        """The program's outputs: ``(state, (draws, stats))`` as shape structs."""
        return self.program.out_info

    @property
    def digest(self) -> str:
        """The digest of the program's lowered text: what names it in every process."""
        return self.program.digest


@functools.lru_cache(maxsize=256)
def chunk_scalars(start: int, count: int, mesh: Any) -> tuple[jax.Array, jax.Array]:
    """A chunk's first step and draw count, replicated on the mesh.

    Cached: a repeated run's chunks start at the same steps, and two host-to-device
    copies per chunk are a measurable part of a short run's fixed cost.
    """
    return _mesh.replicate((np.int32(start), np.int32(count)), mesh)


def compile_ahead(kernel: Kernel, plan: Any, start: Any, placed: Any) -> Any:
    """An ``on_traced`` hook for the init program that compiles the loop on a second thread.

    XLA compiles one program mostly on one core: the loop compiles while the init
    compiles and runs. The helper thread first works out the run's ``schedule`` (the
    same call the main thread makes after the init: its abstract trace of one step is
    cached, so the main thread's costs nothing), then compiles. The hook keeps the
    ``Ahead`` it starts in ``hook.ahead`` (``None`` when this thread's jax settings keep
    the compile on the calling thread).
    """

    def hook(init_out: Any) -> None:
        sharding = _mesh.chain_sharding(placed.mesh)
        like = jax.tree.map(
            lambda s: jax.ShapeDtypeStruct(
                s.shape, s.dtype, sharding=sharding, weak_type=s.weak_type
            ),
            init_out[0],
        )

        def go(traced: Any) -> Any:
            sched = schedule(plan, start, placed.layout, kernel, like)
            return compile_loop(kernel, plan, placed, sched, like, placed.params, traced)

        go = in_this_context(go)
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
    chunks: Chunks, state: Any, sched: Schedule, collector: Any, first: int, end: int | None = None
) -> LoopResult:
    """Runs loop draws ``first..end-1`` (``end``: the whole loop) chunk by chunk into
    ``collector``: the one chunk runner of sampling, warmup and burn-in.

    Each chunk is dispatched before the previous one is collected, so the host copies
    draws while the devices sample. Ctrl-C stops after the chunks already collected;
    the collector then holds them. The collector has ``collect(at, count, state, out)``,
    ``check_due(draws)``, ``stop`` and receives ``draws_done`` and ``state``.
    """
    end = sched.total_draws if end is None else end
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
            state, out = chunks(state, sched.first_step + at * sched.thinning, count)
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
