"""The ``warmup`` stage of a cross-chain warmup: its chunks, their checkpoint and Ctrl-C.

A cross-chain warmup (ChEES, MEADS, pooled Fisher, blackjax's tuners) comes from the
adapter as ``WarmupChunks``; this stage runs its chunks one after the other, moving the
bar after each. With a ``checkpoint`` folder, a warmup that can say what it computes
(``WarmupChunks.fingerprint``) writes its state after every chunk
(``_checkpoint.WARMUP`` files), and the same call again resumes after the last one
written, bit for bit. Ctrl-C stops it after the chunks finished (``Warm.stopped_after``).
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import jax
import numpy as np

from ..core._kernel import Kernel, WarmupChunks, WarmupRequest
from ..core._naming import flat_dict
from ..layout import _distributed, _mesh
from ..output import _checkpoint
from ..programs._programs import draw_shape
from . import _loop, _start


class Warm(NamedTuple):
    """After initialisation and any cross-chain warmup: what sampling starts from.

    ``params``: the sampling kernel's parameters on the mesh (the placement's, unless a
    cross-chain warmup adapted them). ``stopped_after``: the warmup steps done when Ctrl-C
    stopped a cross-chain warmup (``None``: it ran to its end).
    """

    kernel: Kernel
    state: Any
    params: Any
    draws: Any = None
    stats: dict | None = None
    attrs: dict | None = None
    stopped_after: int | None = None


def warm_up(ctx: Any, state: Any, bar: Any) -> Warm:
    """The adapter's cross-chain warmup, where the run has one; else the initial state.

    It runs chunk by chunk (``WarmupChunks``), the bar moving after each; its kept draws
    and stats are the chunks', joined and thinned. Ctrl-C stops it after the chunks
    already finished (``Warm.stopped_after``), with the parameters adapted in them; in
    the first chunk, it stops the run (nothing was adapted).
    """
    plan, adapter, start, placed = ctx
    if not start.cross_chain:
        return Warm(start.kernel, state, placed.params)
    t0 = time.perf_counter()
    request = WarmupRequest(
        plan.rng_key, state, start.num_chains, plan.num_warmup, placed.mesh, plan.keep_warmup,
        plan.batch_size, _loop.warmup_chunk(plan),
    )  # fmt: skip
    warmup = adapter.cross_chain_warmup(request)
    bar.set_description(warmup.label)
    bar.refresh()
    total = warmup.length or plan.num_warmup
    ckpt = _open(ctx, warmup)
    carry, kept, done = _restore(ctx, ckpt, warmup)
    resumed = moved = _moved(done, total, plan.num_warmup)
    if moved:
        bar.update(moved)
    try:
        for first in range(done, total, warmup.chunk):
            count = min(warmup.chunk, total - first)
            carry, draws, stats = warmup.step(carry, first, count)
            kept.append((draws, stats))
            if ckpt is not None:
                _write(ctx, ckpt, first, count, carry, (draws, stats))
            done = first + count
            before, moved = moved, _moved(done, total, plan.num_warmup)
            bar.update(moved - before)
    except KeyboardInterrupt:
        if not done:
            raise
    finally:
        _flush(ckpt)
    stopped = None if done == total else moved
    return _warm(ctx, warmup.finish(carry), kept, stopped, resumed, time.perf_counter() - t0)


def _moved(done: int, total: int, num_warmup: int) -> int:
    """The bar's warmup steps after ``done`` of a warmup's ``total`` steps (``num_warmup``
    of them on the bar)."""
    return done if total == num_warmup else done * num_warmup // total


def _warm(ctx: Any, out: Any, kept: list, stopped: int | None, resumed: int,
          seconds: float) -> Warm:  # fmt: skip
    """What sampling starts from after a warmup that ended in ``out``: ``stopped``
    after that many of ``num_warmup`` steps by Ctrl-C, or ``None``, whole (``resumed``
    of its steps read from the checkpoint)."""
    plan, placed = ctx.plan, ctx.placed
    draws, stats = _joined(kept, plan.thinning)
    attrs = {**(out.attrs or {}), "warmup_time": seconds}
    if resumed:
        attrs["warmup_resumed_from_step"] = resumed
    params = _start.replicate_params(out.kernel, placed.mesh)
    return Warm(out.kernel, out.state, params, draws, stats, attrs, stopped)


def _joined(kept: list[tuple[Any, Any]], thinning: int) -> tuple[Any, Any]:
    """The chunks' warmup ``(draws, stats)`` joined along the draws and thinned (draw
    ``i``: the state after step ``(i + 1) * thinning``); ``(None, None)`` if not kept."""
    if not kept or kept[0][0] is None:
        return None, None
    joined = jax.tree.map(lambda *xs: np.concatenate(xs, axis=1), *kept)
    return jax.tree.map(lambda x: x[:, thinning - 1 :: thinning], joined)


def _open(ctx: Any, warmup: WarmupChunks) -> _checkpoint.Checkpoint | None:
    """The warmup's checkpoint files (``_checkpoint.WARMUP``) in the run's folder, checked
    against this warmup; ``None`` without a folder, for a warmup that runs as one step or
    cannot say what it computes, and in a folder of a run written without them (its
    sampling checkpoint decides: resumed after the warmup runs again, or refused)."""
    plan, _, start, placed = ctx
    total = warmup.length or plan.num_warmup
    if plan.checkpoint is None or warmup.fingerprint is None or warmup.chunk >= total:
        return None
    folder = str(plan.checkpoint)
    if _checkpoint.written_without_warmup(folder):
        return None
    layout = placed.layout
    config = {
        "seed": np.asarray(jax.random.key_data(plan.rng_key)).tolist(),
        "num_chains": layout.num_chains,
        "num_devices": layout.num_devices,
        "padded_chains": layout.padded - layout.num_chains,
        "batch_size": plan.batch_size,
        "chunk_size": warmup.chunk,
        "thinning": plan.thinning,
        "num_warmup": plan.num_warmup,
        "first_step": start.first_step,
        "keep_warmup": plan.keep_warmup,
        "fingerprint": warmup.fingerprint(),
        "state": _checkpoint.describe_state(warmup.start()),
    }
    return _checkpoint.open_for_run(folder, config, _checkpoint.WARMUP)


def _restore(ctx: Any, ckpt: Any, warmup: WarmupChunks) -> tuple[Any, list, int]:
    """``(carry, kept chunks, steps done)``: the warmup's start, or where its checkpoint
    left it (the state after its last intact chunk, the kept draws of its chunks)."""
    carry = warmup.start()
    if ckpt is None or not ckpt.chunks:
        return carry, [], 0
    plan, _, start, placed = ctx
    carry = _mesh.place(ckpt.read_state(carry), placed.mesh)
    kept = []
    if plan.keep_warmup:  # the draws have the sampling kernel's structure (positions)
        out = warmup.finish(carry)
        like = draw_shape(out.kernel, None, None, out.state, start.num_chains)[0]
        names, treedef = list(flat_dict(like)), jax.tree.structure(like)
        for chunk in ckpt.read_chunks():
            _, draws = chunk["warmup_posterior"]
            _, stats = chunk["warmup_sample_stats"]
            kept.append((jax.tree.unflatten(treedef, [draws[k] for k in names]), stats))
    else:
        kept = [(None, None)] * len(ckpt.chunks)
    _distributed.barrier("chainrunner-warmup-checkpoint-read")  # before process 0 writes on
    return carry, kept, ckpt.draws_done


def _write(ctx: Any, ckpt: Any, first: int, count: int, carry: Any, kept: tuple) -> None:
    """The warmup's state after steps ``first .. first + count - 1``, and their kept
    draws, written (on a writer thread) by process 0."""
    draws, stats = kept
    groups = {}
    if draws is not None:
        groups = {"warmup_posterior": (first, flat_dict(draws)),
                  "warmup_sample_stats": (first, dict(stats))}  # fmt: skip
    carry = _distributed.to_host(carry)  # a collective with several processes
    if _distributed.is_main_process():
        ckpt.write_chunk_async(first, first + count, groups, carry)


def _flush(ckpt: Any) -> None:
    """Waits for the last write; a Ctrl-C meanwhile waits on (nothing half-committed)."""
    if ckpt is None:
        return
    try:
        ckpt.flush()
    except KeyboardInterrupt:
        ckpt.flush()
        raise


def empty_draws(ctx: Any, warm: Warm) -> Any:
    """Shape structs ``(0, 0, ...)`` of the run's draws and stats (no draw sampled)."""
    plan, _, start, _ = ctx
    one = draw_shape(warm.kernel, plan.keep, None, warm.state, start.num_chains)
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct((0, 0, *x.shape), x.dtype), one)
