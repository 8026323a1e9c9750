"""The host side of the chunk loop: buffers, the collector of chunks, the progress bar.

Each chunk's draws and stats are copied from the devices into preallocated numpy
buffers (one copy of the draws), passed to the checkpoint writer, counted for the
progress bar, and, with ``monitor=True``, summarised by R-hat and ESS.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, NamedTuple

import jax
import numpy as np

from ..core._naming import flat_dict
from ..layout import _distributed, _mesh
from ..output._diagnostics import monitor_values


class Sink:
    """Host arrays ``(chain, draw, ...)`` filled chunk by chunk.

    Which draws were written is recorded, and ``result`` returns only the filled prefix:
    memory that no chunk filled is never returned as draws (a gap before a filled draw
    is an error, not draws).
    """

    def __init__(self, num_chains: int, num_draws: int, like: Any):
        self.n = num_chains
        self.written = np.zeros(num_draws, bool)
        self.arrays = jax.tree.map(
            lambda x: np.empty((num_chains, num_draws, *x.shape[2:]), x.dtype), like
        )

    @property
    def filled(self) -> int:
        """Draws ``0..filled-1`` are all written."""
        missing = np.flatnonzero(~self.written)
        return int(missing[0]) if missing.size else len(self.written)

    def write(self, tree: Any, at: int, src: slice) -> None:
        """Writes rows ``src`` of ``tree``'s draw axis (chains ``:n``) at draw ``at``."""
        width = src.stop - src.start

        def put(dst, x):
            dst[:, at : at + width] = x[: self.n, src]

        jax.tree.map(put, self.arrays, tree)
        self.written[at : at + width] = True

    def result(self) -> Any:
        """The arrays cut to the filled draws (a view: no copy)."""
        filled = self.filled
        if self.written[filled:].any():
            raise RuntimeError(
                f"run: draws {filled}..{int(np.flatnonzero(self.written)[-1])} of the host "
                "buffers are not contiguous (a chunk was never written); refusing to return "
                "memory that no chunk filled."
            )
        return jax.tree.map(lambda a: a[:, :filled], self.arrays)


def shows_progress(progress: bool | None) -> bool:
    """Whether ``progress_bar`` shows a bar: ``progress=None``: in a terminal or a
    notebook (as tqdm decides); never on processes other than 0."""
    if not _distributed.is_main_process():
        return False  # with several processes only process 0 shows one
    if progress is not None:
        return bool(progress)
    from tqdm.auto import tqdm

    notebook = sys.modules.get("tqdm.notebook")  # tqdm.auto imports it in a notebook only
    if notebook is not None and issubclass(tqdm, notebook.tqdm_notebook):
        return True  # tqdm's notebook bars show with disable=None
    return bool(getattr(sys.stderr, "isatty", lambda: False)())  # tqdm's own test


def progress_bar(progress: bool | None, total: int, desc: str) -> Any:
    """A tqdm bar, shown where ``shows_progress`` says."""
    from tqdm.auto import tqdm

    disable = not shows_progress(progress)
    # Every chunk's update is drawn (mininterval=0, miniters=1): a run has tens of
    # chunks, and the rate then comes from the chunks' own seconds, not the compile's.
    return tqdm(total=total, desc=desc, unit="step", disable=disable, dynamic_ncols=True,
                mininterval=0, miniters=1)  # fmt: skip


#: seconds between two redraws of a bar that no update moved (compiling, a long chunk).
TICK = 0.5


class Ticker:
    """Redraws a shown bar every ``TICK`` seconds from a helper thread, until ``stop``.

    tqdm redraws on updates only: while a run compiles or a long chunk runs, its elapsed
    time would stand still and a new description ("warmup") would not show.
    """

    def __init__(self, bar: Any):
        self.bar, self._done = bar, threading.Event()
        self._thread = None
        if not getattr(bar, "disable", True):
            self._thread = threading.Thread(target=self._tick, name="chainrunner-bar", daemon=True)
            self._thread.start()

    def _tick(self) -> None:
        while not self._done.wait(TICK):
            self.bar.refresh()

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()


def start_clock(bar: Any) -> None:
    """The bar's rate and time left count from now (the loop's first step): the compile
    before it is in the elapsed time, never in the steps per second."""
    if not getattr(bar, "disable", True):
        bar.last_print_t, bar.last_print_n = time.time(), bar.n


class Part(NamedTuple):
    """A slice of a chunk bound for one sink: rows ``src`` go to draw ``at``."""

    prefix: str  # "" or "warmup_"
    sink: Sink
    at: int
    src: slice


class Collector:
    """Receives each finished chunk: host buffers, checkpoint, progress, monitor.

    Attributes:
        main: the sink of the kept draws.
        warmup: the sink of kept warmup draws, or ``None``.
        draws_done: draws of the loop finished and collected so far.
        state: the kernel state after them (on the devices).
    """

    def __init__(
        self, plan: Any, sched: Any, placed: Any, out_like: Any, bar: Any, ckpt: Any,
        until: Any = None,
    ):  # fmt: skip
        n = placed.layout.num_chains
        self.plan, self.sched, self.placed, self.bar, self.ckpt = plan, sched, placed, bar, ckpt
        self.main = Sink(n, plan.num_samples // plan.thinning, out_like)
        wd = sched.warmup_draws
        self.warmup = Sink(n, wd, out_like) if plan.keep_warmup and wd else None
        self.divergences = 0
        self.draws_done, self.state = 0, None
        self._monitor_at, self._postfix = 4, {}
        self.until = until
        self.stop = False

    def parts(self, lo: int, hi: int) -> list[Part]:
        """Where loop draws ``lo..hi-1`` go (warmup and/or main sink)."""
        wd, parts = self.sched.warmup_draws, []
        if lo < wd and self.warmup is not None:
            parts.append(Part("warmup_", self.warmup, lo, slice(0, min(hi, wd) - lo)))
        if hi > wd:
            a = max(lo, wd)
            parts.append(Part("", self.main, a - wd, slice(a - lo, hi - lo)))
        return parts

    def collect(self, first: int, count: int, state: Any, out: Any) -> None:
        """Takes the chunk of loop draws ``first..first+count-1`` and the state after it."""
        lo, hi = first, first + count
        parts = self.parts(lo, hi)
        host = _distributed.to_host(out) if parts else None
        if not parts:  # warmup not kept: nothing to copy, but the bar waits for the chunk
            jax.block_until_ready(state)
        for part in parts:
            part.sink.write(host, part.at, part.src)
        # The chunk is collected: the buffers, draws_done and state agree from here on,
        # whatever interrupts what follows (a Ctrl-C while the checkpoint writer waits).
        self.draws_done, self.state = hi, state
        if parts and parts[-1].prefix == "" and "diverging" in host[1]:
            src = parts[-1].src
            self.divergences += int(np.sum(host[1]["diverging"][: self.main.n, src]))
        if self.ckpt is not None:
            self._checkpoint(lo, hi, parts, host, state)
        if self.until is not None and hi > self.sched.warmup_draws:
            self.stop = self.until.after_chunk(self.main.filled, lambda: self.main.result()[0])
        self._progress(lo, hi, count)

    def check_due(self, hi: int) -> bool:
        """Whether collecting loop draws up to ``hi`` runs an ``until`` check."""
        u, wd = self.until, self.sched.warmup_draws
        return u is not None and u.stopped_at is None and hi - wd >= u.next_check

    def replay(self, restored: int) -> None:
        """The ``until`` checks of the chunks restored from a checkpoint, in order.

        The uninterrupted run checked after each of these chunks; a resumed run checks the
        same draws at the same points, so it stops where that run stopped.
        """
        if self.until is None:
            return
        wd, step = self.sched.warmup_draws, self.sched.chunk_len
        ends = list(range(step, restored + 1, step))
        if restored and (not ends or ends[-1] != restored):
            ends.append(restored)  # a shorter last chunk
        for end in ends:
            if end > wd and not self.stop:
                filled = end - wd
                view = lambda f=filled: jax.tree.map(lambda a: a[:, :f], self.main.result()[0])  # noqa: E731
                self.stop = self.until.after_chunk(filled, view)
        self.draws_done = restored

    def _checkpoint(self, lo: int, hi: int, parts: list[Part], host: Any, state: Any) -> None:
        n, layout = self.main.n, self.placed.layout
        groups = {}
        for part in parts:
            cut = jax.tree.map(lambda x, src=part.src: x[:n, src], host)
            groups[part.prefix + "posterior"] = (part.at, flat_dict(cut[0]))
            groups[part.prefix + "sample_stats"] = (part.at, dict(cut[1]))
        state = _mesh.unpad(state, n, layout.padded, self.placed.mesh)
        if _distributed.is_multiprocess():
            state = _distributed.to_host(state)  # a collective: every process gathers
        if _distributed.is_main_process():
            self.ckpt.write_chunk_async(lo, hi, groups, state)

    def begin(self, first: int) -> None:
        """The loop starts at draw ``first``: the bar's rate counts from now, and it says
        which chunk runs."""
        start_clock(self.bar)
        self._chunk_word(first)
        self.bar.set_postfix(self._postfix)

    def _chunk_word(self, done: int) -> None:
        """Which chunk runs now, of how many (``chunk 3/8``): the bar moves once a chunk,
        and between two moves it says what it waits for."""
        size, total = self.sched.chunk_len, self.sched.total_draws
        if done < total:
            self._postfix["chunk"] = f"{done // size + 1}/{-(-total // size)}"
        else:
            self._postfix.pop("chunk", None)

    def _progress(self, lo: int, hi: int, count: int) -> None:
        """The bar after a chunk: its words first, then the update that draws them."""
        self._chunk_word(hi)
        if lo < self.sched.warmup_draws <= hi:
            self.bar.set_description("sampling", refresh=False)
        if self.divergences:
            self._postfix["divergences"] = self.divergences
        # R-hat and ESS need every draw so far: computed when the draws have doubled
        # since the last time, so that on average a chunk costs what a chunk costs.
        if self.plan.monitor and self.main.filled >= self._monitor_at:
            self._postfix.update(monitor_values(self.main.result()[0]))  # the draws
            self._monitor_at = 2 * self.main.filled
        if self.until is not None and self.until.last is not None:
            self._postfix.update(self.until.last.postfix(self.until.target))
        self.bar.set_postfix(self._postfix, refresh=False)
        self.bar.update(count * self.plan.thinning)
