"""``batch_size="auto"``: the batch size a run samples with, chosen per run.

A device advances its chains one after another (``batch_size=1``) or together in one
``vmap`` (``None``). Which is faster depends on the model's step, the chains per
device, the device and the JAX version (``docs/batch-size.md``), so on CPU devices
``"auto"`` measures it:

1. ``choose`` (the ``place`` stage): a cached choice for the same program and run length
   is used as it is; otherwise the run starts with ``1``, the program that compiles
   fastest, and is marked for a probe.
2. ``settle`` (after the chunk program is compiled): the run's first draws with ``1``,
   timed, give its sampling time. If that is short next to the compile a ``vmap`` would
   add, ``1`` stays (the compile dominates; its end to end time wins) and goes on after
   those draws. Otherwise the run is also placed, initialised and compiled with one
   ``vmap`` (with many chains per device: vmaps of ``WIDEST`` first, then one ``vmap``
   of all where the run pays for two compiles), each candidate samples the same first
   draws, and the fastest samples the rest of the run after its own (the others' are
   thrown away). A candidate that fails to build leaves the run to ``1``.

A continued trace keeps its trace's batch size, and runs whose timing could not be
repeated (checkpoints, several processes, after a cross-chain warmup) keep ``1``.

The choice and its reason go to ``attrs["batch_size_choice"]``, and to a cache keyed on
the program and the run's length: the next identical call samples at once, with the
same draws. Draws of a run equal those of a run with its chosen ``batch_size`` given,
bitwise. Accelerators take one ``vmap`` (their width is what keeps them busy); an
ensemble takes its own width (``_ensemble.auto_width``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
from jax.sharding import Mesh

from . import _distributed, _ensemble, _mesh
from ._compile import signature
from ._lru import LRU

# A vmapped NUTS program compiles in about 1.75x the time of the one-chain program
# (docs/batch-size.md, both JAX versions); compile times under a second are noise.
VMAP_COMPILE_RATIO = 1.75
MIN_COMPILE_S = 1.0
# Probe a vmap only if sampling with 1 would take this many times its compile: a probe
# that finds nothing faster then costs the run at most a tenth more, end to end.
WORTH = 10.0
PROBE_SHARE = 0.01  # of the run's draws, per candidate (at least FIRST_PROBE)
FIRST_PROBE = 2
WIDEST = 8  # with more chains per device, vmaps of WIDEST are tried too
_CHOICES = LRU(64)


class Choice(NamedTuple):
    """A run's batch size, why, and whether ``settle`` still has to probe it."""

    batch_size: int | None
    reason: str
    probe: bool = False


def forget() -> None:
    """Forgets every cached choice (the next run of each program probes again)."""
    _CHOICES.clear()


def cache_key(plan: Any, start: Any, mesh: Mesh) -> tuple:
    """What a cached choice is for: the program and what it runs on (shapes and dtypes of
    the start and of the kernel's parameters, e.g. a model's data), the mesh, the chains
    and the run's length."""
    start_from = start.position if start.state is None else start.state
    return (
        start.kernel.functions, signature((start_from, start.kernel.params)), mesh,
        start.num_chains, plan.num_warmup, plan.num_samples, plan.thinning, plan.chunk_size,
        plan.keep, jax.config.jax_enable_x64,
    )  # fmt: skip


def _why_no_probe(plan: Any, start: Any) -> str | None:
    if start.cross_chain:
        return "after a cross-chain warmup"
    if plan.checkpoint is not None:
        return "a checkpointed run: a resumed run must find the same layout"
    if _distributed.is_multiprocess():
        return "several processes must agree without timing"
    return None


def choose(plan: Any, start: Any, mesh: Mesh) -> Choice:
    """The batch size a run starts with (the ``place`` stage)."""
    n = start.num_chains
    if plan.batch_size != "auto":
        return Choice(plan.batch_size, "given")
    if start.kernel.ensemble is not None:
        return Choice(*_ensemble.auto_width(n))
    if mesh.devices.flat[0].platform != "cpu":  # accelerators: one vmap
        return Choice(*_mesh.auto_batch_size("auto", mesh))
    if math.ceil(n / mesh.shape[_mesh.AXIS]) == 1:
        return Choice(1, "auto: one chain per device")
    if start.previous_batch_size is not None:  # continuing: one longer run's layout
        b = None if start.previous_batch_size == "all" else int(start.previous_batch_size)
        return Choice(b, f"auto: {start.previous_batch_size}, as the continued trace")
    why_not = _why_no_probe(plan, start)
    if why_not is not None:
        return Choice(1, f"auto: 1, chains one after another on CPU ({why_not})")
    found, cached = _CHOICES.lookup(cache_key(plan, start, mesh))
    if found:
        return Choice(cached[0], f"{cached[1]} (measured by an earlier run of this program)")
    return Choice(1, "auto: 1 (to be probed)", probe=True)


class Candidate(NamedTuple):
    """A batch size's run: placement, loop program (and the seconds its compile took),
    initial state, and what its probe draws left (``warm``) and took (``seconds``)."""

    placed: Any
    loop: Any
    init: Any
    warm: Any
    compile_time: float = 0.0
    seconds: float = 0.0


class Probe(NamedTuple):
    """What ``settle`` needs of the run.

    Attributes:
        one: the run with ``batch_size=1``, compiled and initialised.
        build: ``batch_size -> Candidate``: the run with another batch size.
        advance: ``(candidate, count) -> candidate`` with the run's next ``count`` draws
            sampled and kept, their seconds added to ``seconds``; ``count=0`` makes the
            program's first call (buffers, threads), untimed.
        compile_time: seconds until ``one`` was compiled.
        total_draws: draws of the run's loop.
        chunk_len: draws per call of the chunk program (a probe's most).
    """

    one: Candidate
    build: Callable[[int | None], Candidate]
    advance: Callable[[Candidate, int], Candidate]
    compile_time: float
    total_draws: int
    chunk_len: int


def _widths(per_device: int) -> tuple[int | None, ...]:
    """The batch sizes tried against ``1``, in order: one vmap over a device's chains;
    with more than ``WIDEST``, vmaps of ``WIDEST`` first (their trajectories wait for
    fewer others: faster on 21 of the 32 such rows of the grid), then one vmap of all."""
    return (None,) if per_device <= WIDEST else (WIDEST, None)


def _named(width: int | None) -> str:
    return "all, one vmap" if width is None else f"{width}, vmaps of {width} chains"


def settle(key: tuple, probe: Probe) -> tuple[Choice, Candidate]:
    """Probes ``1`` against vmaps; returns the choice and the run it chose.

    Probe draws are the run's first draws: the chosen candidate keeps its own, and the
    run goes on after them. A second width is tried only if the run is long enough to
    pay for a second compile too.
    """
    span = min(probe.chunk_len, probe.total_draws,
               max(FIRST_PROBE, round(PROBE_SHARE * probe.total_draws)))  # fmt: skip
    half = probe.advance(probe.advance(probe.one, 0), span // 2)
    one = probe.advance(half, span - span // 2)
    # the second half's pace: the first draws of a warmup misjudge the rest the most
    estimate = one.seconds + (one.seconds - half.seconds) / (span - span // 2) * (
        probe.total_draws - span
    )
    extra = VMAP_COMPILE_RATIO * max(probe.compile_time, MIN_COMPILE_S)
    if estimate < WORTH * extra:
        reason = (
            f"auto: 1, chains one after another (sampling with 1: about {estimate:.2g} s, "
            f"under {WORTH:g}x the {extra:.2g} s a vmapped program would add to compile)"
        )
        _CHOICES.put(key, (1, reason))
        return Choice(1, reason), one
    runs = {1: one}
    failed = ""
    for k, width in enumerate(_widths(probe.one.placed.layout.per_device)):
        if k and estimate < 2 * WORTH * extra:  # a second compile must pay too
            break
        try:
            runs[width] = probe.advance(probe.advance(probe.build(width), 0), span)
        except Exception as e:  # a kernel that cannot be vmapped still runs with 1
            failed = f"; batch_size={width} failed: {type(e).__name__}: {e}"[:300]
            break
    best = min(runs, key=lambda b: runs[b].seconds)
    others = ", ".join(f"{runs[b].seconds:.3g} s with batch_size={b}" for b in runs if b != best)
    reason = f"auto: {_named(best) if best != 1 else '1, chains one after another'} " \
             f"({span} probe draws: {runs[best].seconds:.3g} s" \
             f"{', against ' + others if others else ''}{failed})"  # fmt: skip
    _CHOICES.put(key, (best, reason))
    return Choice(best, reason), runs[best]
