"""``batch_size="auto"``: the batch size a run samples with, chosen per run.

A device advances its chains one after another (``batch_size=1``) or together in
vmaps (``8``: vmaps of 8 chains; ``None``: one over all). Which is faster depends on
the model's step, the chains per device, the device and the JAX version
(``docs/batch-size.md``), and, for NUTS, on the phase of the run: in the first
draws of a warmup, trajectory lengths differ the most between chains, and a vmap,
which waits for the longest, is slowest there. So on CPU devices ``"auto"`` measures
in the middle of the warmup, at a chunk boundary (at the first draw of a run without
one; with one chain per device at the first boundary, ``_switch.switch_point``):

1. ``choose`` (the ``place`` stage): the run starts with ``1``, the program that
   compiles fastest, and is marked for ``settle``.
2. The first half of the warmup runs with ``1`` (with one chain per device, whose
   candidate is a vmap of one, the first chunk). Then (``_switch``) ``without_probe``
   keeps ``1`` where the pace of those draws already says a vmap's compile does not
   pay; otherwise ``1`` samples the probe draws (the run's own; ``span``), and
   ``settle`` decides from their pace: if a vmap's compile would be over
   ``COST_SHARE`` of the run's end-to-end time with ``1`` (the time so far, and the
   rest at that pace), ``1`` stays. Otherwise vmapped programs are compiled and sample
   the same draws from the same state (thrown away), and the run goes on with the
   fastest, its state moved to that layout.

A continued trace keeps its trace's batch size, and runs whose timing could not be
repeated (checkpoints, several processes, after a cross-chain warmup) keep ``1``.

The choice and its reason go to ``attrs["batch_size_choice"]``, and to a cache keyed on
the program and the run's length: the next identical call switches at the same draw to
the same batch size without timing, and gives the same draws (a kept ``1`` runs
``batch_size=1``'s chunks from the first draw: ``cached_one``). Accelerators take one
``vmap`` (their width is what keeps them busy); an ensemble takes its own width
(``_ensemble.auto_width``).
"""

from __future__ import annotations

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
# Probe a vmap only if its compile is at most this share of the run's end-to-end time
# (so far, and the rest with 1): a probe that finds nothing faster costs at most that.
COST_SHARE = 0.10
# Without a probe, 1 stays where the pace of the draws before the switch says a vmap's
# compile is over EARLY_MARGIN x COST_SHARE of the run (that pace is the less certain).
EARLY_MARGIN = 2.0
PROBE_SHARE = 0.02  # of the draws left (at least FIRST_PROBE, at most a chunk)
FIRST_PROBE = 2
WIDEST = 8  # with more chains per device, vmaps of WIDEST are tried first
_CHOICES = LRU(64)


class Choice(NamedTuple):
    """A run's batch size, why, whether ``settle`` still has to probe it, and whether
    it did."""

    batch_size: int | None
    reason: str
    probe: bool = False
    timed: bool = False  # ``settle`` timed the run (not a cached choice)


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
        return Choice(*_mesh.auto_batch_size("auto", mesh, n))
    if start.previous_batch_size is not None:  # continuing: one longer run's layout
        b = None if start.previous_batch_size == "all" else int(start.previous_batch_size)
        return Choice(b, f"auto: {start.previous_batch_size}, as the continued trace")
    why_not = _why_no_probe(plan, start)
    if why_not is not None:
        return Choice(1, f"auto: 1, chains one after another on CPU ({why_not})")
    return Choice(1, "auto: 1 (to be probed in the middle of the warmup)", probe=True)


def span(draws: int, chunk_len: int) -> int:
    """Probe draws for a run with ``draws`` sampling draws left."""
    return min(chunk_len, draws, max(FIRST_PROBE, round(PROBE_SHARE * draws)))


class Probe(NamedTuple):
    """What ``settle`` knows of the run at the probe (the middle of the warmup).

    Attributes:
        one_seconds: seconds ``batch_size=1`` took for the probe draws (the run's own).
        count: the probe draws.
        remaining: the run's draws after them.
        compile_time: seconds until the ``1`` program was compiled and initialised.
        per_device: chains per device.
        time: ``batch_size -> seconds`` the same draws from the same state take with
            that batch size (after compiling it); raises if it cannot be built.
        elapsed: seconds the run has taken before the probe (compile, draws).
    """

    one_seconds: float
    count: int
    remaining: int
    compile_time: float
    per_device: int
    time: Callable[[int | None], float]
    elapsed: float = 0.0


def _widths(per_device: int) -> tuple[int | None, ...]:
    """The batch sizes tried against ``1``, in order: one vmap over a device's chains
    (with one chain per device, a vmap of one: XLA may lay its step out better); with
    more than ``WIDEST``, vmaps of ``WIDEST`` first (their trajectories wait for fewer
    others: faster on 21 of the 32 such rows of the grid), then one vmap of all."""
    return (None,) if per_device <= WIDEST else (WIDEST, None)


def _named(width: int | None) -> str:
    return "all, one vmap" if width is None else f"{width}, vmaps of {width} chains"


def _compile_cost(compile_time: float) -> float:
    """Seconds a vmapped program would take to compile, from the ``1`` program's."""
    return VMAP_COMPILE_RATIO * max(compile_time, MIN_COMPILE_S)


def cached_one(key: tuple) -> Choice | None:
    """``1``, where an earlier run of the same call kept it (its draws are ``1``'s however
    that run was chunked, so this one runs ``batch_size=1``'s chunks from the start),
    else ``None``."""
    found, cached = _CHOICES.lookup(key)
    if found and cached[0] == 1:
        return Choice(1, f"{cached[1]} (measured by an earlier run of this program)")
    return None


def without_probe(
    key: tuple, pace: float | None, remaining: int, elapsed: float, compile_time: float
) -> Choice | None:
    """``1`` without a probe, or ``None`` (probe).

    A cached ``1`` stays (its draws are ``1``'s, however the earlier run was chunked). A
    run whose draws so far (``pace`` seconds each, ``None``: none yet) say that a
    vmap's compile is over ``EARLY_MARGIN`` times ``COST_SHARE`` of its end-to-end time
    keeps ``1`` (cached): its chunks are then those of ``batch_size=1``.
    """
    if _CHOICES.lookup(key)[0]:  # a cached vmap: probed, ``settle`` takes it from the cache
        return cached_one(key)
    if pace is None:
        return None
    estimate = elapsed + pace * remaining
    extra = _compile_cost(compile_time)
    if extra <= EARLY_MARGIN * COST_SHARE * estimate:
        return None
    share = EARLY_MARGIN * COST_SHARE
    return _one_stays(key, estimate, extra, share, " at the pace of its draws so far")


def _one_stays(
    key: tuple, estimate: float, extra: float, share: float, basis: str = "", timed: bool = False
) -> Choice:
    """``1``, cached under ``key``: a vmap's compile (``extra`` seconds) is over ``share``
    of the run's end-to-end time with ``1`` (``estimate``, from ``basis``)."""
    reason = (
        f"auto: 1, chains one after another (the run with 1: about {estimate:.2g} s end to "
        f"end{basis}; a vmapped program would add {extra:.2g} s to compile, over "
        f"{share:.0%} of it)"
    )
    _CHOICES.put(key, (1, reason))
    return Choice(1, reason, timed=timed)


def settle(key: tuple, probe: Probe) -> Choice:
    """The batch size the rest of the run samples with (cached under ``key``).

    A second width is tried only if the run is long enough to pay for a second compile.
    """
    found, cached = _CHOICES.lookup(key)
    if found:
        return Choice(cached[0], f"{cached[1]} (measured by an earlier run of this program)")
    rest = probe.one_seconds / probe.count * probe.remaining
    estimate = probe.elapsed + probe.one_seconds + rest  # the run, end to end, with 1
    extra = _compile_cost(probe.compile_time)
    if extra > COST_SHARE * estimate:
        return _one_stays(key, estimate, extra, COST_SHARE, timed=True)
    times: dict[int | None, float] = {1: probe.one_seconds}
    failed = ""
    for k, width in enumerate(_widths(probe.per_device)):
        if k and 2 * extra > COST_SHARE * estimate:  # both compiles within the share
            break
        try:
            times[width] = probe.time(width)
        except Exception as e:  # a kernel that cannot be vmapped still runs with 1
            failed = f"; batch_size={width} failed: {type(e).__name__}: {e}"[:300]
            break
    best = min(times, key=lambda b: times[b])
    others = ", ".join(f"{times[b]:.3g} s with batch_size={b}" for b in times if b != best)
    reason = f"auto: {_named(best) if best != 1 else '1, chains one after another'} " \
             f"({probe.count} probe draws: {times[best]:.3g} s" \
             f"{', against ' + others if others else ''}{failed})"  # fmt: skip
    _CHOICES.put(key, (best, reason))
    return Choice(best, reason, timed=True)
