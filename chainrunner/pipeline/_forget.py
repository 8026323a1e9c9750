"""``warmup_until=``: a warmup of adaptive length, ended by nested R-hat.

Chains of a superchain start from one point; until they have forgotten it, the chains of
one superchain agree more with each other than with the chains of another, and nested
R-hat on a window of their draws is high. Margossian et al. (2024, "Nested R-hat", the
adaptive warmup length) end warmup at the first window whose nested R-hat is below a
threshold. Here the kernel's own adaptation runs first (``num_warmup`` steps, exactly as
without the option: window adaptation inside the loop, or ChEES/MEADS before it); then
the adapted kernel runs on in windows of ``window`` draws until a window's nested R-hat
is at most the target. The last ``window`` draws of an in-loop adaptation are checked
first, so a long enough adaptation adds no steps. The windows are warmup: sampling starts
after the first window that passes, with the step numbering carried on, so a run that
burned in ``B`` steps equals, for a kernel without adaptation, a fixed run with
``num_warmup`` larger by ``B``.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, NamedTuple

import jax
import numpy as np

from ..layout import _distributed
from ..output._diagnostics import ChainrunnerWarning, caller_stacklevel
from ..stopping import _convergence
from ..stopping._until import Forgotten, columns
from ._loop import Chunks, Schedule, run_chunks


def forgotten_value(draws: Any, superchains: np.ndarray) -> float:
    """The largest nested R-hat over every element of ``draws``; inf if any is not finite."""
    x, _ = columns(draws)
    if not np.isfinite(x).all():
        return math.inf
    values = _convergence.nested_rhat(x, superchains)
    return math.inf if np.isnan(values).any() else float(values.max())


class BurnIn(NamedTuple):
    """What the adaptive warmup did."""

    state: Any
    loop_draws: int  # loop draws run: the in-loop adaptation's and the added windows'
    added_draws: int  # draws added after the adaptation
    nested_rhat: float  # the last window's
    forgotten: bool
    kept: Any  # (draws, stats) of every warmup draw when keep_warmup, else None

    def attrs(self, target: Forgotten, thinning: int) -> dict[str, Any]:
        """``warmup_forgotten``, ``burn_in_steps``, ``burn_in_nested_rhat``."""
        return {
            "warmup_until": [float(target.nested_rhat), target.window, target.max_draws],
            "warmup_forgotten": self.forgotten,
            "burn_in_steps": self.added_draws * thinning,
            "burn_in_nested_rhat": self.nested_rhat,
        }


class Windows:
    """Runs loop draws ``at..at+count-1`` through ``_loop.run_chunks`` and brings the real
    chains' draws to the host."""

    def __init__(self, chunks: Chunks, num_chains: int, sched: Schedule):
        self.chunks, self.num_chains, self.sched = chunks, num_chains, sched

    def run(self, state: Any, at: int, count: int, bar: Any = None) -> tuple[Any, Any]:
        """``(state after, (draws, stats))`` of the real chains, ``(chain, count, ...)``;
        ``bar`` moves after each chunk. Ctrl-C stops the run (no partial warmup)."""
        window = _Window(self.num_chains, self.sched.thinning, bar)
        looped = run_chunks(self.chunks, state, self.sched, window, at, at + count)
        if looped.interrupted:
            raise KeyboardInterrupt
        return window.state, jax.tree.map(lambda *xs: np.concatenate(xs, axis=1), *window.outs)


class _Window:
    """The collector of a window: each chunk's real chains on the host, in order."""

    stop = False

    def __init__(self, n: int, thinning: int, bar: Any):
        self.n, self.thinning, self.bar, self.outs = n, thinning, bar, []
        self.draws_done, self.state = 0, None

    def check_due(self, draws: int) -> bool:
        return False

    def collect(self, first: int, count: int, state: Any, out: Any) -> None:
        host = _distributed.to_host(out)
        self.outs.append(jax.tree.map(lambda x: x[: self.n, :count], host))
        self.draws_done, self.state = first + count, state
        if self.bar is not None:
            self.bar.update(count * self.thinning)


def burn_in(
    windows: Windows, state: Any, adapt_draws: int, target: Forgotten,
    superchains: np.ndarray, keep: bool, bar: Any,
) -> BurnIn:  # fmt: skip
    """The in-loop adaptation (``adapt_draws`` loop draws), then windows until forgotten."""
    w, kept, value = target.window, [], math.inf
    if adapt_draws:
        state, out = windows.run(state, 0, adapt_draws, bar)
        if keep:
            kept.append(out)
        if adapt_draws >= w:
            value = forgotten_value(jax.tree.map(lambda x: x[:, -w:], out[0]), superchains)
    added = 0
    bar.set_description("burn-in")
    while value > target.nested_rhat and added < target.max_draws:
        state, out = windows.run(state, adapt_draws + added, w, bar)
        added += w
        if keep:
            kept.append(out)
        value = forgotten_value(out[0], superchains)
        bar.set_postfix({"nRhat": f"{value:.3f}/{target.nested_rhat}"})
    joined = jax.tree.map(lambda *xs: np.concatenate(xs, axis=1), *kept) if kept else None
    forgotten = value <= target.nested_rhat
    if not forgotten:
        why = (
            f"is still {value:.4g} > {target.nested_rhat}"
            if math.isfinite(value)
            else "is not finite (a draw is not finite, or some chain did not move within "
            "the window)"
        )
        warnings.warn(
            f"run: warmup_until: after {added} added warmup draws nested R-hat {why}: the "
            "chains may remember where their superchains started; sampling anyway "
            "(attrs['warmup_forgotten'] is False). Raise warmup_until.max_draws or num_warmup.",
            ChainrunnerWarning,
            stacklevel=caller_stacklevel(),
        )
    return BurnIn(state, adapt_draws + added, added, value, forgotten, joined)


def join_warmup(first: Any, second: Any) -> Any:
    """Warmup ``(draws, stats)`` of a cross-chain warmup followed by the added windows.

    Draws concatenate along the draw axis; a stat only one part has is NaN in the other
    (as float), so nothing either part recorded is dropped.
    """
    if first is None or first[0] is None:
        return second
    if second is None:
        return first
    draws = jax.tree.map(lambda a, b: np.concatenate([a, b], axis=1), first[0], second[0])
    lengths = [jax.tree.leaves(part[0])[0].shape[1] for part in (first, second)]
    stats = {}
    for name in [*first[1], *(k for k in second[1] if k not in first[1])]:
        have = next(part[1][name] for part in (first, second) if name in part[1])
        pieces = [
            part[1][name]
            if name in part[1]
            else np.full((have.shape[0], n, *have.shape[2:]), np.nan)
            for part, n in zip((first, second), lengths, strict=True)
        ]
        same = all(name in part[1] for part in (first, second))
        stats[name] = np.concatenate(
            pieces if same else [np.asarray(p, float) for p in pieces], axis=1
        )
    return draws, stats
