"""``run`` and ``sample``: the pipeline of stages.

``run`` reads as its stages, each a function of its inputs that returns a value:

1. ``plan``: every argument check, eager, before any JAX work (``_plan``).
2. ``resolve``: the kernel's ``Adapter`` (``adapters.as_adapter``).
3. ``start``: fresh or continued, the kernel for the run (``_start.starting_point``).
4. ``place``: mesh, layout (``batch_size="auto"`` decided once, from the call's facts:
   ``_choose``), chain ids, key and parameters on the mesh (``_start.place``). The
   plan, adapter, start and placement are the run's context (``Run``) from here on.
5. ``initialise`` (``_init``), with the loop compiling on a second thread meanwhile;
   then the adapter's cross-chain warmup, where it has one, chunk by chunk
   (``_warmup``: the bar, Ctrl-C, its checkpoint).
6. ``schedule``: the loop's lengths, the chunk length included (``_loop.schedule``),
   decided before the loop compiles (the compile-ahead thread makes the same call first).
7. ``compile`` the chunk program (``_loop.compile_loop``, cached in ``_compile``);
   ``warmup_until``: the burn-in windows (``_forget``).
8. ``resume`` from a checkpoint (``_checkpoint``), then ``loop``: the chunks
   (``_loop.run_chunks``, the one chunk runner) into the host buffers (``_host.Collector``).
9. ``assemble`` the ``Trace``, and ``report`` (diagnostics or the interruption notice).
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh

from ..adapters import as_adapter
from ..core._kernel import Adapter
from ..core._settings import x64_scope
from ..core._words import reject_pm_sample_words
from ..layout import _distributed, _mesh
from ..layout._blas import blas_threads
from ..output import _checkpoint
from ..output._diagnostics import (
    ChainrunnerWarning,
    arviz_wanted,
    caller_stacklevel,
    preload_arviz,
    warn_if_needed,
)
from ..output._trace import Trace
from ..programs._programs import check_keep_names
from ..programs._store import jax_cache
from ..stopping._convergence import tail_probs
from ..stopping._until import Converged, Forgotten, Until, superchain_ids
from . import _diagnose, _forget, _loop, _plan, _start
from ._host import Collector, Ticker, progress_bar
from ._init import Initialised, initialise
from ._warmup import Warm, empty_draws, warm_up


class Run(NamedTuple):
    """What every stage after ``place`` needs, built once: the run's context."""

    plan: _plan.Plan
    adapter: Adapter
    start: _start.Start
    placed: _start.Placement


class Sampled(NamedTuple):
    """What the resume and loop stages produced."""

    collector: Collector
    resumed_from: int | None
    repaired: list[str]
    sampling_time: float
    interrupted: bool


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
    until: Converged | None = None,
    superchains: int | None = None,
    warmup_until: Forgotten | None = None,
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
            a device's chains in one ``vmap`` (even one chain); ``"auto"`` (the default):
            ``None`` on GPU/TPU (1 with one chain per device); on CPU ``1``, or vmaps
            where the kernel's step is matrix work (flops counted from its trace) and the run long
            enough to pay their compile ([choosing batch_size](batch-size.md)). Decided before the
            first draw from facts of the call, never a timing: the same call gives the
            same draws in every process. The choice and the facts are in
            ``attrs["batch_size_choice"]``; pin ``batch_size`` for the same draws
            across JAX versions.
        chunk_size: draws per compiled call; also how often the progress bar moves,
            checkpoints are written and ``until`` checks. ``None``: ``min(total draws,
            250)`` where something needs the boundaries (``monitor``, ``checkpoint``,
            ``until``, ``warmup_until``, several processes); otherwise 250, 500, 1000 or
            2000, the first that holds the run (``progress=False``) or an eighth of it
            (a bar may show: it moves at least 8 times; a terminal never changes the
            chunks); a continued trace's, if longer; fewer where a device's outputs
            would pass about 64 MiB, at least 250 ([long runs](long-runs.md)).
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
        until: ``cr.Converged(...)``: stop after the first chunk at which the kept draws
            meet the convergence targets (R-hat, bulk and tail ESS, nested R-hat);
            ``num_samples`` is then the cap. ``attrs["stopped"]`` says why the run
            stopped (``"converged"`` or ``"cap"``). See ``cr.Converged``.
        superchains: group the chains into this many superchains of equal size (chain
            ``c`` in superchain ``c // (num_chains // superchains)``); the chains of a
            superchain start from the same point (its first chain's initial position
            and init key), and ``trace.diagnostics`` reports nested R-hat (Margossian et
            al. 2024), which ``until`` can target.
        warmup_until: ``cr.Forgotten(...)`` (needs ``superchains``): after the
            ``num_warmup`` adaptation steps, warmup goes on in windows of draws until
            a window's nested R-hat says the chains have forgotten where their
            superchains started (Margossian et al. 2024's adaptive warmup length).
            ``attrs["burn_in_steps"]`` records the steps added, ``attrs["warmup_forgotten"]``
            whether the target was met. See ``cr.Forgotten``.

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
    plan = _plan.plan(
        rng_key, num_samples, num_warmup=num_warmup, num_chains=num_chains,
        thinning=thinning, mesh=mesh, batch_size=batch_size, chunk_size=chunk_size,
        progress=progress, keep_warmup=keep_warmup, keep=keep, checkpoint=checkpoint,
        monitor=monitor, warn=warn, on_bad_init=on_bad_init, init_jitter=init_jitter,
        until=until, superchains=superchains, warmup_until=warmup_until,
    )  # fmt: skip
    adapter = as_adapter(kernel, "run")
    with x64_scope(adapter):  # (a PyMC model's 64 bits, for this call only)
        return _stages(plan, adapter, initial_position)


def _stages(plan: _plan.Plan, adapter: Adapter, initial_position: Any) -> Trace:
    """``run``'s stages, in order (module docstring)."""
    start = _start.starting_point(plan, adapter, initial_position)
    ctx = Run(plan, adapter, start, _start.place(plan, start))
    with _progress(plan) as bar, blas_threads(ctx.placed.mesh), jax_cache():
        with _kernel_errors(start):
            if not start.cross_chain:  # (a cross-chain kernel's step needs adapted params)
                check_keep_names(
                    start.kernel, plan.keep, start.position, start.state, start.num_chains
                )
            init, ahead = _initialise(ctx)
            warm = warm_up(ctx, init.state, bar)
            sched = _schedule(ctx, warm)
            if warm.stopped_after is not None:  # Ctrl-C in a cross-chain warmup
                sched, sampled, compile_time = _stopped_in_warmup(ctx, sched, warm, bar)
            else:
                chunks, compile_time = _compile(ctx, sched, warm, ahead)
                sched = chunks.sched  # (a longer chunk's rows, fitted to the draw's size)
        if warm.stopped_after is None:
            warm, sched = _burn_in(ctx, sched, warm, chunks, bar)
            sampled = _sample(ctx, sched, warm, chunks, bar)
        trace = _assemble(ctx, sched, init, warm, sampled, compile_time + init.compile_time)
        _checks(plan, trace, sampled, bar)
    _report(ctx, sched, trace, sampled)
    return trace


@contextlib.contextmanager
def _progress(plan: _plan.Plan) -> Iterator[Any]:
    """The run's one progress bar, from its first call on: ``compiling`` (or loading the
    compiled programs) until the first chunk runs, then ``warmup`` (of any kind: a
    cross-chain warmup too) and ``sampling``, then ``diagnostics``. A run that fails or is
    interrupted clears its bar (the error or the notice says where it stopped)."""
    bar = progress_bar(plan.progress, plan.num_warmup + plan.num_samples, "compiling")
    ticker = Ticker(bar)  # the elapsed time runs while nothing updates the bar
    try:
        yield bar
    except BaseException:
        bar.leave = False
        raise
    finally:
        ticker.stop()
        bar.close()


def _checks(plan: _plan.Plan, trace: Trace, sampled: Sampled, bar: Any) -> None:
    """The diagnostics the report will read, computed under the bar (it says so)."""
    if sampled.interrupted:
        bar.leave = False  # the notice says how far the run got
    elif plan.warn:
        bar.set_description("diagnostics")
        bar.refresh()
        _ = trace.diagnostics  # cached on the trace: the report reads it


@contextlib.contextmanager
def _kernel_errors(start: _start.Start) -> Iterator[None]:
    """An error the kernel raised, traced on one chain: the mistake behind it where
    ``_diagnose`` finds it (a non-scalar log density, no chain axis, a mass matrix of
    another size, mixed precisions), else a note saying what chainrunner passed it."""
    try:
        yield
    except (TypeError, ValueError) as e:
        if str(e).startswith("run:"):  # chainrunner's own errors say it already
            raise
        found = None
        if start.position is not None:
            found = _diagnose.diagnose(start.kernel, start.position, start.num_chains, e)
        if found is not None:
            raise found from e
        e.add_note(_start.one_chain_note(start))
        raise


def _schedule(ctx: Run, warm: Warm) -> _loop.Schedule:
    """The loop's lengths, decided before the loop compiles (``_loop.schedule``), from the
    kernel and the state sampling starts from (the compile-ahead makes the same call with
    that state's shape structs; its trace of one step is cached). After a cross-chain
    warmup, ``keep=`` names are checked now: the adapted kernel's step needs its params."""
    plan, _, start, placed = ctx
    if start.cross_chain:
        check_keep_names(warm.kernel, plan.keep, None, warm.state, start.num_chains)
    return _loop.schedule(plan, start, placed.layout, warm.kernel, warm.state)


def _initialise(ctx: Run) -> tuple[Initialised, Any]:
    """Initial states on the mesh; a fresh run compiles the loop meanwhile (``Ahead``)."""
    plan, adapter, start, placed = ctx
    layout = placed.layout
    if start.state is not None:  # continued: the trace's final state
        state = _mesh.place(_mesh.pad(start.state, layout.num_chains, layout.padded), placed.mesh)
        return Initialised(state, 0.0, []), None
    hook = None if start.cross_chain else _loop.compile_ahead(start.kernel, plan, start, placed)
    try:
        init = initialise(start.kernel, plan, placed, start.position, adapter.init_error_hint, hook)
    except BaseException as e:
        ahead = getattr(hook, "ahead", None)
        if ahead is not None:
            ahead.traced.wait()  # its compile goes on, and lands in the cache
            if ahead.job.failed() is not None:
                e.add_note(f"The sampling loop's compile failed too: {ahead.job.failed()!r}")
        raise
    return init, getattr(hook, "ahead", None)


def _stopped_in_warmup(
    ctx: Run, sched: _loop.Schedule, warm: Warm, bar: Any
) -> tuple[_loop.Schedule, Sampled, float]:
    """A run stopped by Ctrl-C in its cross-chain warmup: no draw sampled, the chains'
    state and the parameters after the warmup steps done (``Warm.stopped_after``), the
    last of them the trace's last step."""
    sched = sched._replace(first_step=ctx.start.first_step + warm.stopped_after)
    collector = Collector(ctx.plan, sched, ctx.placed, empty_draws(ctx, warm), bar, None)
    collector.state = warm.state
    return sched, Sampled(collector, None, [], 0.0, True), 0.0


def _burn_in(
    ctx: Run, sched: _loop.Schedule, warm: Warm, chunks: _loop.Chunks, bar: Any
) -> tuple[Warm, _loop.Schedule]:
    """``warmup_until``: the in-loop adaptation, then windows until the chains forgot their start.

    Returns what sampling starts from and the sampling schedule (its first step after the
    whole warmup, no warmup draws left in the loop).
    """
    plan, _, start, _ = ctx
    target = plan.warmup_until
    if target is None:
        return warm, sched
    windows = _forget.Windows(chunks, start.num_chains, sched)
    ids = superchain_ids(start.num_chains, plan.superchains)
    bar.reset(total=(sched.warmup_draws + target.max_draws) * plan.thinning)
    bar.set_description("warmup")
    out = _forget.burn_in(
        windows, warm.state, sched.warmup_draws, target, ids, plan.keep_warmup, bar
    )
    kept = _forget.join_warmup((warm.draws, warm.stats), out.kept) or (None, None)
    attrs = {**(warm.attrs or {}), **out.attrs(target, plan.thinning)}
    sched = sched.after_burn_in(out.loop_draws, plan.num_samples // plan.thinning)
    return warm._replace(state=out.state, draws=kept[0], stats=kept[1], attrs=attrs), sched


def _compile(ctx: Run, sched: _loop.Schedule, warm: Warm, ahead: Any) -> tuple[_loop.Chunks, float]:
    """The compiled chunk program: the helper thread's, where it compiled this one (the
    seconds spent waiting for it), else compiled here. ArviZ's import, where the call
    wants it, starts now (``preload_arviz``)."""
    preload_arviz()
    if ahead is not None:
        t0 = time.perf_counter()
        chunks, _ = ahead.job.result()  # raises here whatever the helper thread raised
        if chunks.compiled_for(sched, warm.state, warm.params):
            return chunks, time.perf_counter() - t0
    return _loop.compile_loop(warm.kernel, ctx.plan, ctx.placed, sched, warm.state, warm.params)


def describe(ctx: Run, sched: _loop.Schedule) -> dict[str, Any]:
    """The run's plan and layout: in the trace's attrs, and the checkpoint's identity."""
    plan, _, start, placed = ctx
    layout = placed.layout
    return {
        "seed": np.asarray(jax.random.key_data(plan.rng_key)).tolist(),
        "num_chains": layout.num_chains,
        "num_devices": layout.num_devices,
        "chains_per_device": layout.per_device,
        "padded_chains": layout.padded - layout.num_chains,
        "batch_size": "all" if layout.batch_size is None else layout.batch_size,
        "chunk_size": sched.chunk_len,
        "thinning": plan.thinning,
        "num_warmup": plan.num_warmup,
        "num_samples": plan.num_samples,
        "first_step": start.first_step,
        "keep_warmup": plan.keep_warmup,
        **({"superchains": plan.superchains} if plan.superchains is not None else {}),
        **({"until": [float(v) for v in plan.until]} if plan.until is not None else {}),
        **({"until_tail_probs": tail_probs()} if plan.until is not None else {}),
    }


def _open_checkpoint(ctx: Run, sched: _loop.Schedule, warm: Warm, chunks: _loop.Chunks) -> Any:
    """The run's checkpoint folder, opened (and checked against this run), or ``None``."""
    plan = ctx.plan
    if plan.checkpoint is None:
        return None
    config = {
        **describe(ctx, sched),
        "fingerprint": _checkpoint.fingerprint(
            chunks.digest, _distributed.to_host(warm.kernel.params)
        ),
        "state": _checkpoint.describe_state(warm.state),
    }
    ckpt = _checkpoint.open_for_run(plan.checkpoint, config)
    if ckpt.repaired:
        found = "; ".join(f"{name}: {problem}" for name, problem in ckpt.repaired)
        warnings.warn(
            f"run: checkpoint={ckpt.path!r} had damaged files ({found}); they were not "
            f"used: resuming from draw {ckpt.draws_done}, the draws after it are computed "
            "again (the same draws as an uninterrupted run).",
            ChainrunnerWarning,
            stacklevel=caller_stacklevel(),
        )
    return ckpt


def _restore(
    ckpt: Any, collector: Collector, placed: _start.Placement, state: Any, chunks: _loop.Chunks
) -> tuple[int, Any]:
    """``(first draw, state)``: a checkpoint's finished chunks, restored into ``collector``."""
    if ckpt is None:
        return 0, state
    sinks = {"posterior": collector.main, "warmup_posterior": collector.warmup}
    first = _checkpoint.restore(ckpt, sinks, chunks.out_info[1])
    if ckpt.chunks:
        layout = placed.layout
        saved = ckpt.read_state(state)  # n chains, as written
        state = _mesh.place(_mesh.pad(saved, layout.num_chains, layout.padded), placed.mesh)
    _distributed.barrier("chainrunner-checkpoint-read")  # before process 0 writes on
    return first, state


def _sample(ctx: Run, sched: _loop.Schedule, warm: Warm, chunks: _loop.Chunks, bar: Any) -> Sampled:
    """Resumes from the checkpoint (if any), then runs the chunks into a ``Collector``."""
    plan, _, start, placed = ctx
    total = sched.first_step - start.first_step + sched.total_draws * plan.thinning
    if plan.warmup_until is not None:  # after the burn-in: the bar counts the whole run
        bar.reset(total=total)
        bar.update(sched.first_step - start.first_step)
    bar.set_description("warmup" if sched.warmup_draws else "sampling")
    ckpt = None
    try:
        ckpt = _open_checkpoint(ctx, sched, warm, chunks)
        out_like = chunks.out_info[1]
        collector = Collector(plan, sched, placed, out_like, bar, ckpt, _until(plan, start))
        first, state = _restore(ckpt, collector, placed, warm.state, chunks)
        collector.replay(first)
        if 0 < sched.warmup_draws <= first:
            bar.set_description("sampling")
        bar.update(first * plan.thinning)
        collector.begin(first)  # steps per second from the first step on, not the compile
        looped = _loop.run_chunks(chunks, state, sched, collector, first)
    finally:
        stopped = _flush(ckpt)  # every collected chunk is on disk before run returns
    resumed = first if ckpt is not None else None
    repaired = [name for name, _ in ckpt.repaired] if ckpt is not None else []
    interrupted = looped.interrupted or stopped
    return Sampled(collector, resumed, repaired, looped.sampling_time, interrupted)


def _flush(ckpt: Any) -> bool:
    """Waits for the checkpoint's last write; a Ctrl-C meanwhile waits on (returns True)."""
    if ckpt is None:
        return False
    try:
        ckpt.flush()
    except KeyboardInterrupt:
        ckpt.flush()  # the write in flight finishes: nothing is left half-committed
        return True
    return False


def _until(plan: _plan.Plan, start: _start.Start) -> Until | None:
    """The convergence check schedule of the run, if it has targets."""
    if plan.until is None:
        return None
    return Until(plan.until, superchain_ids(start.num_chains, plan.superchains))


def _assemble(
    ctx: Run, sched: _loop.Schedule, init: Initialised, warm: Warm, sampled: Sampled,
    compile_time: float,
) -> Trace:  # fmt: skip
    """The ``Trace``: draws and stats on the host, the final state on the mesh, attrs."""
    from .._version import __version__

    plan, adapter, _, placed = ctx
    c, layout = sampled.collector, placed.layout
    draws, stats = c.main.result()
    w_draws, w_stats = c.warmup.result() if c.warmup is not None else (None, None)
    if warm.draws is not None:
        w_draws, w_stats = warm.draws, warm.stats
    attrs = {
        "chainrunner_version": __version__,
        "jax_version": jax.__version__,
        **describe(ctx, sched),
        "batch_size_choice": placed.batch_choice,
        "mesh_shape": [layout.num_devices],
        "layout": layout.describe(),
        "compile_time": compile_time,
        "sampling_time": sampled.sampling_time,
        **({"num_processes": jax.process_count()} if _distributed.is_multiprocess() else {}),
        **({"reinitialised_chains": init.reinitialised} if init.reinitialised else {}),
        **({"interrupted": True} if sampled.interrupted else {}),
        **_resumed(sampled.resumed_from, sched, plan.thinning),
        **({"checkpoint_repaired": sampled.repaired} if sampled.repaired else {}),
        **(warm.attrs or {}),
        **({"warmup_steps_done": warm.stopped_after} if warm.stopped_after is not None else {}),
        **(c.until.attrs(sampled.interrupted) if c.until is not None else {}),
        **adapter.attrs(),
    }
    params = None if warm.kernel.params is None else _distributed.to_host(warm.kernel.params)
    final_state = _mesh.unpad(c.state, layout.num_chains, layout.padded, placed.mesh)
    return Trace(
        draws=draws,
        stats=stats,
        final_state=final_state,
        num_steps=sched.first_step + c.draws_done * plan.thinning,
        warmup_draws=w_draws,
        warmup_stats=w_stats,
        attrs=attrs,
        groups=adapter.groups(draws, complete=not sampled.interrupted),
        kernel_params=params,
        adapted_parameters=adapter.adapted(final_state, params),
        dims=adapter.dims(),
        coords=adapter.coords(),
    )


def _resumed(first: int | None, sched: _loop.Schedule, thinning: int) -> dict[str, int]:
    """Where a checkpointed run resumed: ``resumed_from_draw``, the posterior draws that
    were on disk (warmup not counted), and ``resumed_from_step``, the loop's steps (warmup
    included, thinning counted)."""
    if first is None:
        return {}
    return {
        "resumed_from_draw": max(0, first - sched.warmup_draws),
        "resumed_from_step": first * thinning,
    }


def _report(ctx: Run, sched: _loop.Schedule, trace: Trace, sampled: Sampled) -> None:
    """Warns about an interruption (how to go on), or about what the diagnostics found."""
    plan, _, start, _ = ctx
    if "warmup_steps_done" in trace.attrs:
        _warn_stopped_in_warmup(plan, trace.attrs["warmup_steps_done"])
    elif sampled.interrupted:
        total = sched.first_step - start.first_step + sched.total_draws * plan.thinning
        done = trace.num_steps - start.first_step
        how = (
            "run the same call again (same checkpoint) to resume"
            if plan.checkpoint is not None
            else f"cr.run(kernel, rng_key, trace, {total - done}) continues it"
        )
        warnings.warn(
            f"run: interrupted after {done} of {total} steps; returning the "
            f"{trace.num_draws} draws finished so far (per chain); {how}.",
            ChainrunnerWarning,
            stacklevel=caller_stacklevel(),
        )
    elif plan.warn:
        warn_if_needed(trace)


def _warn_stopped_in_warmup(plan: _plan.Plan, done: int) -> None:
    """The notice of a run stopped by Ctrl-C in its cross-chain warmup: what it returns."""
    kept = "the warmup draws so far, " if plan.keep_warmup else ""
    again = (
        "the same call again (same checkpoint) resumes the warmup"
        if plan.checkpoint is not None
        else "the same call again runs the whole warmup"
    )
    warnings.warn(
        f"run: interrupted in the cross-chain warmup after {done} of {plan.num_warmup} "
        f"warmup steps; no draws were sampled. The trace holds {kept}the chains' states and "
        "the parameters adapted so far (cr.adapted_parameters(trace)): "
        f"cr.run(kernel, rng_key, trace, n) samples on with them; {again}.",
        ChainrunnerWarning,
        stacklevel=caller_stacklevel(),
    )


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

    Raises:
        TypeError: for a keyword of ``pm.sample`` (``tune=``, ``chains=``, ...), with
            chainrunner's word for it (``num_warmup=``, ``num_chains=``, ...); and as ``run``.

    Examples:
        >>> import blackjax, jax, jax.numpy as jnp
        >>> import chainrunner as cr
        >>> nuts = blackjax.nuts(lambda x: -0.5 * jnp.sum(x**2), 0.8, jnp.ones(2))
        >>> data = cr.sample(nuts, jax.random.key(1), jnp.zeros((4, 2)), 100, progress=False)
        >>> data.posterior["x"].shape
        (4, 100, 2)
    """
    reject_pm_sample_words("sample", options)
    with arviz_wanted():  # imported while the loop compiles (preload_arviz)
        trace = run(kernel, rng_key, initial_position, num_samples, **options)
    return trace.to_arviz(coords=coords, dims=dims)
