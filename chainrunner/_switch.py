"""Stage 7a: ``batch_size="auto"`` settled in the middle of the run's warmup.

A run whose batch size ``place`` left open starts with ``batch_size=1``. A run that
ends before its switch point, or whose call an earlier run kept at ``1``, runs
``batch_size=1``'s chunks throughout (``where``). Otherwise, at the chunk boundary in
the middle of its warmup (``switch_point``: at its first draw without one; at the
first boundary with one chain per device), ``early`` keeps ``1`` where the draws so
far already say a vmap's compile does not pay. Otherwise ``1`` samples the
probe draws (the run's own, collected as a chunk), and ``_choose.settle`` decides from
their pace whether vmapped programs are worth compiling. Each one tried samples the same draws
from the same state (thrown away: they are the same trajectories, only batched
differently). The run goes on with the fastest, its state moved to that batch size's
layout: the same chains, keys and step numbers, so the draws are those of a run of
``1`` up to the switch continued with the chosen batch size.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from . import _choose, _loop, _mesh, _start
from ._kernel import Kernel


class Switched(NamedTuple):
    """Where the run goes on: placement and chunk program of the chosen batch size, the
    state in its layout, the draw it goes on from, and the seconds the probe cost (the
    kept draws not counted) and the kept draws took."""

    placed: _start.Placement
    loop: Any
    state: Any
    at: int
    probe_time: float | None  # None: a cached choice, nothing timed
    kept_time: float


def switch_point(sched: _loop.Schedule, placed: _start.Placement) -> int:
    """The loop draw where ``auto`` probes: the middle of the warmup (the first draw of a
    run without one). By then NUTS's trajectory lengths are near those of sampling; in
    its first draws they differ the most between chains, and a vmap, which waits for
    the longest, is slowest there (``bench_pace.py``). With one chain per device the
    candidate is a vmap of that one chain, which waits for no other: the same
    trajectories at a pace relative to ``1`` that does not change with the phase, so
    it is probed at once and the whole run gains.

    The switch comes at the first boundary of the chunk grid (``chunk_size``, default
    250 draws, also in a quiet run of longer chunks: ``_loop.schedule``) at or after
    that draw: where ``1`` stays, the run's chunks are then those of ``batch_size=1``
    (each boundary costs a short run a few milliseconds), and a run of one chunk of
    that grid is not probed at all.
    """
    target = 1 if placed.layout.per_device == 1 else sched.warmup_draws // 2
    return -(-target // sched.grid) * sched.grid


def where(
    plan: Any, start: _start.Start, placed: _start.Placement, sched: _loop.Schedule
) -> tuple[_start.Placement, int | None]:
    """The placement a run starts its chunks with and its switch point (``None``: no
    switch). A run of ``"auto"`` that cannot reach its switch point, or whose call an
    earlier run kept at ``1``, is a run of ``batch_size=1`` from the start: the same
    chunks, each dispatched before the last is collected, nothing timed."""
    if not placed.probe:
        return placed, None
    at = switch_point(sched, placed)
    if at >= sched.total_draws:
        why = (
            "auto: 1, chains one after another (not probed: the run is over before its "
            f"switch point, the chunk boundary at draw {at})"
        )
        return placed._replace(batch_choice=why, probe=False), None
    cached = _choose.cached_one(_choose.cache_key(plan, start, placed.mesh))
    if cached is not None:
        return placed._replace(batch_choice=cached.reason, probe=False), None
    return placed, at


def early(
    plan: Any, start: _start.Start, placed: _start.Placement, sched: _loop.Schedule, at: int,
    elapsed: float, compile_time: float, pace: float | None,
) -> _start.Placement | None:  # fmt: skip
    """The placement of a run that keeps ``1`` without a probe at loop draw ``at``, or
    ``None`` (probe): ``pace`` (seconds per draw of the draws before ``at``, ``None``:
    none ran) already says a vmap's compile does not pay, or the same call kept ``1``."""
    key = _choose.cache_key(plan, start, placed.mesh)
    choice = _choose.without_probe(key, pace, sched.total_draws - at, elapsed, compile_time)
    return None if choice is None else placed._replace(batch_choice=choice.reason, probe=False)


def relayout(state: Any, n: int, src: _start.Placement, dst: _start.Placement) -> Any:
    """``state`` (padded for ``src``'s layout) padded and placed for ``dst``'s."""
    if src.layout.padded == dst.layout.padded:
        return state
    real = _mesh.unpad(state, n, src.layout.padded, src.mesh)
    return _mesh.place(_mesh.pad(real, n, dst.layout.padded), dst.mesh)


def settle(
    plan: Any, start: _start.Start, kernel: Kernel, placed: _start.Placement,
    sched: _loop.Schedule, loop: Any, collector: Any, at: int, compile_time: float,
    elapsed: float,
) -> Switched:  # fmt: skip
    """Probes at loop draw ``at`` (``collector.state``) and switches to the chosen batch size."""
    key = _choose.cache_key(plan, start, placed.mesh)
    t0 = time.perf_counter()
    state, n = collector.state, start.num_chains
    count = _choose.span(sched.total_draws - at, sched.grid)
    kept, after, out = _loop.run_chunk(loop, state, placed, plan.thinning, sched, at, count)
    collector.collect(at, count, after, out)  # the run's own draws
    built: dict[int | None, tuple[_start.Placement, Any, Any]] = {}

    def build(width: int | None) -> tuple[_start.Placement, Any, Any]:
        """Placement, compiled chunk program and the probe's start state for ``width``."""
        if width not in built:
            p = _start.place(plan, start, _choose.Choice(width, ""), placed.mesh)
            moved = relayout(state, n, placed, p)
            program = _loop.compile_loop(kernel, plan, p, sched, moved)[0]
            if _loop.fitted(sched, program).chunk_len != sched.chunk_len:  # a chunk's rows
                raise RuntimeError(f"run: batch_size={width} built another chunk length")
            built[width] = (p, program, moved)
        return built[width]

    def time_width(width: int | None) -> float:
        p, wide, moved = build(width)
        _loop.run_chunk(wide, moved, p, plan.thinning, sched, at, 0)  # first call: untimed
        return _loop.run_chunk(wide, moved, p, plan.thinning, sched, at, count)[0]

    probe = _choose.Probe(kept, count, sched.total_draws - at - count, compile_time,
                          placed.layout.per_device, time_width, elapsed)  # fmt: skip
    if collector.stop:  # until= met on the probe draws: nothing left to choose for
        choice = _choose.Choice(1, "auto: 1 (the run stopped at its probe draws)")
    else:
        choice = _choose.settle(key, probe)
    p, go_on, moved = placed, loop, after
    if choice.batch_size != 1:
        p, go_on, _ = build(choice.batch_size)
        moved = relayout(after, n, placed, p)
    spent = time.perf_counter() - t0 - kept if choice.timed else None
    return Switched(p._replace(batch_choice=choice.reason, probe=False), go_on, moved,
                    at + count, spent, kept)  # fmt: skip
