"""Run diagnostics: R-hat, ESS, divergences, stuck chains and non-finite values.

R-hat and ESS are ArviZ's (rank-normalised split R-hat, bulk and tail ESS; nested
R-hat as arviz-stats computes it), computed for every variable element at once by
``stopping._convergence``, which follows ArviZ step by step and is tested equal to it to
round-off under arviz 0.x and arviz >= 1. ArviZ itself loops over elements in Python and
JIT-compiles with numba on first use: 20x slower on a default run, 2x at 10,000 chains,
and importing it costs a first call about 2 s. Diagnostics never import ArviZ.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import sys
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core._naming import flat_dict
from ..core._threads import Background
from ..stopping._until import ess_shown, rhat_shown

if TYPE_CHECKING:
    from ._trace import Trace

RHAT_MAX = 1.01
"""R-hat above this flags a variable (Vehtari et al. 2021; ``arviz_stats.diagnose``)."""

ESS_PER_CHAIN = 100
"""Bulk or tail ESS below ``ESS_PER_CHAIN * chains`` flags a variable (same sources)."""

MIN_DRAWS = 4
"""Fewer draws per chain than this: R-hat and ESS are not computed (not flagged either)."""

ESS_SUPERCHAINS = 400
"""With superchains (many short chains), bulk or tail ESS below this in all is flagged."""

STUCK_ACCEPTANCE = 0.01
"""A chain whose mean ``acceptance_rate`` is below this is stuck."""


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# The package's own scripts (``python -m chainrunner``, ``chainrunner-demo``): a user's
# script, as far as a warning's line goes.
_SCRIPTS = tuple(_PACKAGE + name for name in ("_demo.py", "__main__.py"))
_preload: list[Background] = []


_ARVIZ_WANTED = contextvars.ContextVar("chainrunner_arviz_wanted", default=False)


@contextlib.contextmanager
def arviz_wanted() -> Iterator[None]:
    """Inside the block, ``preload_arviz`` starts ArviZ's import (``sample``: its
    ``to_arviz`` needs it, whatever ``warn`` says; ``run``'s diagnostics never do)."""
    token = _ARVIZ_WANTED.set(True)
    try:
        yield
    finally:
        _ARVIZ_WANTED.reset(token)


def preload_arviz() -> None:
    """Starts importing ArviZ on a daemon thread, once per process, inside ``arviz_wanted``.

    ``run`` calls this where its calling thread starts waiting for the sampling loop's
    program (compiled, or loaded from the cache, on the helper thread): importing ArviZ
    takes about a second of Python (arviz 1.x: 0.85 s after PyMC 6, most of it
    ``arviz_stats.loo``'s scipy), which then runs on the core that the init program's
    compile has left, while the interpreter lock is free (XLA compiles without it). Started
    with the run, it took the lock from the run's own tracing and lowering, the first
    call's critical path (eight schools, PyMC 6, 2 cores, whole first processes: 6.93-7.05
    s against 6.97-7.64 s; docs/compilation.md). The
    thread keeps the normal priority: at the lowest one the first call took longer, since
    the import then waits for the compilations and the run waits for the import. The first
    use of ArviZ waits for the import to finish (Python's import lock); if it failed, that
    use imports again and raises as usual.
    """
    if not _ARVIZ_WANTED.get() or _preload or "arviz" in sys.modules:
        return

    def load() -> None:
        import arviz  # noqa: F401  (a failure is raised again by the next `import arviz`)

    _preload.append(Background(load, "chainrunner-import-arviz"))


class ChainrunnerWarning(RuntimeWarning):
    """Issued after a run whose diagnostics found a problem (``run(..., warn=False)``: none)."""


@dataclasses.dataclass(frozen=True, eq=False)
class Diagnostics:
    """What ``diagnose`` found: the numbers, and one sentence per problem.

    R-hat and ESS are computed per element of every variable, by ArviZ, on the
    chains whose draws are all finite; each variable is then summarised by its worst
    element: the largest R-hat, the smallest ESS. Variables whose R-hat or ESS is
    undefined (a constant, or a single chain for R-hat) get no entry in ``rhat``, or
    ``nan``, and are never flagged.

    Attributes:
        num_chains: chains in the trace.
        num_draws: draws per chain.
        rhat: variable -> largest rank-normalised split R-hat over its elements
            (what ``az.rhat(method="rank")`` gives); empty with one usable chain or
            fewer than ``MIN_DRAWS`` draws.
        ess_bulk: variable -> smallest bulk ESS over its elements
            (``az.ess(method="bulk")``'s); empty with fewer than ``MIN_DRAWS`` draws.
        ess_tail: variable -> smallest tail ESS (``az.ess(method="tail")``'s).
        ess_threshold: ``ESS_PER_CHAIN`` times the chains used; a lower ESS is flagged.
        divergences: divergent transitions per chain, shape ``(num_chains,)``; ``None``
            when the kernel reports no ``diverging`` stat.
        stuck_chains: chains that never moved (every draw equal to the first) or whose
            mean ``acceptance_rate`` is below ``STUCK_ACCEPTANCE``.
        nonfinite: chain -> index of its first draw with a non-finite value (in the
            draws or in the ``lp`` stat). These chains are left out of R-hat and ESS.
        messages: one short sentence per problem; empty when healthy.
        nested_rhat: variable -> largest rank-normalised nested R-hat (Margossian et al.
            2024), for runs with ``superchains`` (what ``arviz_stats.rhat_nested``
            gives, to round-off); empty otherwise. It replaces R-hat in ``messages`` then,
            and the ESS threshold is ``ESS_SUPERCHAINS`` in all.
        superchains: the number of superchains, or ``None``.

    Examples:
        >>> import numpy as np
        >>> import chainrunner as cr
        >>> from chainrunner.output._diagnostics import diagnose
        >>> draws = np.random.default_rng(0).normal(size=(4, 500))
        >>> d = diagnose(cr.Trace(draws=draws, stats={}, final_state=None))
        >>> d.ok, d.messages, round(d.rhat["x"], 1)
        (True, [], 1.0)
    """

    num_chains: int
    num_draws: int
    rhat: dict[str, float]
    ess_bulk: dict[str, float]
    ess_tail: dict[str, float]
    ess_threshold: float
    divergences: np.ndarray | None
    stuck_chains: list[int]
    nonfinite: dict[int, int]
    messages: list[str]
    nested_rhat: dict[str, float] = dataclasses.field(default_factory=dict)
    superchains: int | None = None

    @property
    def ok(self) -> bool:
        """``True`` when no problem was found (``messages`` is empty)."""
        return not self.messages

    def __str__(self) -> str:
        head = f"chainrunner: {self.num_chains} chain(s) x {self.num_draws} draw(s)"
        if self.ok:
            return f"{head}: no problems found."
        lines = [f"{head}: {len(self.messages)} problem(s)."]
        lines += [f"- {m}" for m in self.messages]
        lines.append("Details: trace.diagnostics; silence with run(..., warn=False).")
        return "\n".join(lines)


def _float_leaves(trace: Trace) -> dict[str, np.ndarray]:
    return flat_dict(trace.draws)


def _first_nonfinite(values: dict[str, np.ndarray], num_chains: int) -> dict[int, int]:
    first = np.full(num_chains, np.iinfo(np.int64).max)
    for x in values.values():
        if not np.issubdtype(x.dtype, np.inexact) or x.ndim < 2:
            continue
        bad = ~np.isfinite(x.reshape(x.shape[0], x.shape[1], -1)).all(axis=2)
        has = bad.any(axis=1)
        first = np.where(has, np.minimum(first, bad.argmax(axis=1)), first)
    return {int(c): int(first[c]) for c in np.flatnonzero(first < np.iinfo(np.int64).max)}


def _stuck(draws: dict[str, np.ndarray], stats: dict[str, np.ndarray], num_chains: int) -> list:
    stuck = np.zeros(num_chains, bool)
    num_draws = next(iter(draws.values())).shape[1] if draws else 0
    if num_draws >= 2:
        still = np.ones(num_chains, bool)
        for x in draws.values():
            same = x == x[:, :1]
            if np.issubdtype(x.dtype, np.inexact):
                same |= np.isnan(x) & np.isnan(x[:, :1])
            still &= same.reshape(num_chains, -1).all(axis=1)
        stuck |= still
    acc = stats.get("acceptance_rate")
    if acc is not None and np.size(acc):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-nan chains
            mean = np.nanmean(np.asarray(acc, float).reshape(num_chains, -1), axis=1)
        stuck |= mean < STUCK_ACCEPTANCE
    return np.flatnonzero(stuck).tolist()


def _worst(values: np.ndarray, reduce: Any) -> float:
    if values.size == 0 or np.all(np.isnan(values)):
        return float("nan")
    return float(reduce(values))


def _stats(
    draws: dict[str, np.ndarray], chains: np.ndarray, superchains: np.ndarray | None = None
) -> tuple[dict[str, float], ...]:
    """R-hat (max) and bulk/tail ESS (min) per variable, on ``chains``; with
    ``superchains`` (each chain's group), nested R-hat (max) fourth, from the same ranks.

    ArviZ's rank-normalised split R-hat and bulk and tail ESS, computed for every
    variable element at once by ``stopping._convergence`` (equal to ArviZ's to round-off,
    tested): ArviZ loops over elements in Python (and JIT-compiles with numba, where it
    is installed, on first use: 0.4 s of a first call), 20x slower on 4 chains x 1000
    draws, 2x on 10,000 chains x 200 draws.
    """
    from ..stopping._convergence import rhat_and_ess

    columns, names = [], []
    for name, x in draws.items():
        x = x[chains] if chains.size < x.shape[0] else x
        x = np.asarray(x, dtype=np.float64)
        columns.append(x.reshape(x.shape[0], x.shape[1], -1))
        names += [name] * columns[-1].shape[2]
    if not columns:
        return ({},) * (3 if superchains is None else 4)
    with np.errstate(all="ignore"):
        rhat, bulk, tail, *nested = rhat_and_ess(np.concatenate(columns, axis=2), superchains)
    owner = np.array(names)
    per = {n: owner == n for n in dict.fromkeys(names)}
    out = (
        {n: _worst(rhat[m], np.nanmax) for n, m in per.items()} if chains.size >= 2 else {},
        {n: _worst(bulk[m], np.nanmin) for n, m in per.items()},
        {n: _worst(tail[m], np.nanmin) for n, m in per.items()},
    )
    return (
        out if not nested else (*out, {n: _worst(nested[0][m], np.nanmax) for n, m in per.items()})
    )


def _superchain_ids(num_chains: int, superchains: int | None) -> np.ndarray | None:
    """Each chain's superchain (nested R-hat's groups), or ``None`` without superchains."""
    if not superchains:
        return None
    from ..stopping._until import superchain_ids

    return superchain_ids(num_chains, superchains)


def _chains(chains: list[int] | np.ndarray, limit: int = 8) -> str:
    chains = [int(c) for c in chains]
    text = ", ".join(map(str, chains[:limit]))
    return text + (f", ... ({len(chains)} in all)" if len(chains) > limit else "")


def _names(values: dict[str, float], limit: int = 4, fmt: str = "{:.3g}") -> str:
    items = list(values.items())
    text = ", ".join(f"{n} ({fmt.format(v)})" for n, v in items[:limit])
    return text + (f", ... ({len(items)} variables)" if len(items) > limit else "")


def _messages(
    flagged: dict, ess_bulk: dict, ess_tail: dict, threshold: float, divergences: Any,
    stuck: list, nonfinite: dict,
) -> list[str]:  # fmt: skip
    """One sentence per problem found; ``flagged``: ``{"R-hat > 1.01": {name: value}}``."""
    messages: list[str] = []
    ((what, rhat),) = flagged.items()
    # rounded up: an R-hat of 1.0104 over 1.01 reads 1.011, not 1.01
    high = {n: rhat_shown(v) for n, v in rhat.items() if v > RHAT_MAX}
    if high:
        messages.append(
            f"{what} for {_names(high, fmt='{:.4g}')}: the chains disagree; run longer, or "
            "look for several modes."
        )
    # floored: an ESS of 799.6 under a threshold of 800 reads 799, not 800
    low = {
        n: ess_shown(float(np.fmin(ess_bulk[n], ess_tail[n])))
        for n in ess_bulk
        if ess_bulk[n] < threshold or ess_tail[n] < threshold
    }
    if low:
        messages.append(
            f"ESS below {threshold:.0f} ({ESS_PER_CHAIN} per chain) for "
            f"{_names(low, fmt='{:.0f}')} (smaller of bulk and tail): run longer."
        )
    if divergences is not None and divergences.any():
        where = np.flatnonzero(divergences)
        counts = ", ".join(f"{c}: {divergences[c]}" for c in where[:8])
        messages.append(
            f"{int(divergences.sum())} divergent transition(s) in {where.size} chain(s) "
            f"(chain: count {counts}{', ...' if where.size > 8 else ''}); use a smaller "
            "step size or reparametrise."
        )
    if stuck:
        messages.append(
            f"stuck chain(s) {_chains(stuck)}: no movement or acceptance rate near zero; "
            "check the step size and the starting points."
        )
    if nonfinite:
        firsts = ", ".join(f"{c} at draw {i}" for c, i in list(nonfinite.items())[:8])
        messages.append(
            f"non-finite values in {len(nonfinite)} chain(s) ({firsts}"
            f"{', ...' if len(nonfinite) > 8 else ''}); left out of R-hat and ESS."
        )
    return messages


def diagnose(trace: Trace) -> Diagnostics:
    """Checks a trace for the usual signs of a failed run.

    The checks, each one sentence in ``messages`` when it fails:

    - R-hat above ``RHAT_MAX`` (1.01): the chains disagree (``az.rhat``'s rank-normalised
      split R-hat; needs two chains and ``MIN_DRAWS`` draws).
    - bulk or tail ESS below ``ESS_PER_CHAIN`` (100) times the number of chains, the
      rule of Vehtari et al. (2021) that ``arviz_stats.diagnose`` applies (``az.ess``
      with ``method="bulk"`` and ``"tail"``).
    - divergent transitions (the ``diverging`` stat), counted per chain.
    - stuck chains: no movement at all, or mean ``acceptance_rate`` below 0.01.
    - non-finite values in the draws or the ``lp`` stat: the chains and the first bad
      draw of each. Those chains are left out of R-hat and ESS.

    Integer and boolean draws are diagnosed as floats. ``Trace.diagnostics`` caches
    this, and ``run`` warns with the same report unless ``warn=False``.

    Args:
        trace: a ``Trace`` (``draws``: pytree of ``(chain, draw, ...)`` arrays;
            ``stats``: dict of ``(chain, draw)`` arrays).

    Returns:
        A ``Diagnostics``; ``str()`` of it is the short report.

    Examples:
        >>> import numpy as np
        >>> import chainrunner as cr
        >>> from chainrunner.output._diagnostics import diagnose
        >>> rng = np.random.default_rng(0)
        >>> draws = rng.normal(size=(4, 400)) + np.arange(4)[:, None]  # 4 chains, 4 places
        >>> stats = {"diverging": np.zeros((4, 400), bool)}
        >>> stats["diverging"][2, :3] = True
        >>> d = diagnose(cr.Trace(draws=draws, stats=stats, final_state=None))
        >>> d.ok, d.divergences.tolist()
        (False, [0, 0, 3, 0])
        >>> print(d.messages[0])  # doctest: +ELLIPSIS
        R-hat > 1.01 for x (1.575): the chains disagree; ...
    """
    draws = {k: np.asarray(v) for k, v in _float_leaves(trace).items()}
    stats = {k: np.asarray(v) for k, v in (trace.stats or {}).items()}
    shapes = [x.shape for x in (*draws.values(), *stats.values()) if x.ndim >= 2]
    num_chains, num_draws = shapes[0][:2] if shapes else (0, 0)

    lp = {"lp": stats["lp"]} if "lp" in stats else {}
    nonfinite = _first_nonfinite({**draws, **lp}, num_chains)
    good = np.array([c for c in range(num_chains) if c not in nonfinite], dtype=int)
    stuck = _stuck(draws, stats, num_chains) if num_chains else []

    rhat: dict[str, float] = {}
    ess_bulk: dict[str, float] = {}
    ess_tail: dict[str, float] = {}
    superchains = (trace.attrs or {}).get("superchains")
    nested: dict[str, float] = {}
    if num_draws >= MIN_DRAWS and good.size:
        # nested R-hat needs every chain (whole superchains), from the same ranks
        ids = _superchain_ids(num_chains, superchains) if good.size == num_chains else None
        rhat, ess_bulk, ess_tail, *found = _stats(draws, good, ids)
        nested = found[0] if found else {}
    threshold = float(ESS_SUPERCHAINS if superchains else ESS_PER_CHAIN * good.size)

    divergences = None
    if "diverging" in stats:
        divergences = stats["diverging"].reshape(num_chains, -1).astype(bool).sum(axis=1)

    flagged = (
        {f"nested R-hat > {RHAT_MAX}": nested} if superchains else {f"R-hat > {RHAT_MAX}": rhat}
    )
    messages = _messages(flagged, ess_bulk, ess_tail, threshold, divergences, stuck, nonfinite)
    return Diagnostics(
        num_chains=int(num_chains),
        num_draws=int(num_draws),
        rhat=rhat,
        ess_bulk=ess_bulk,
        ess_tail=ess_tail,
        ess_threshold=threshold,
        divergences=divergences,
        stuck_chains=stuck,
        nonfinite=nonfinite,
        messages=messages,
        nested_rhat=nested,
        superchains=superchains,
    )


def caller_stacklevel() -> int:
    """The ``stacklevel`` that points a warning at the user's line, out of chainrunner.

    Call it in the function that calls ``warnings.warn``: it counts the frames up to the
    first one outside the chainrunner package, so a warning raised inside ``run``
    points at the line that called ``run`` (or ``sample``, or any public function). The
    demo (``python -m chainrunner``) is a script of the user's: its own line is named.
    """
    frame, level = sys._getframe(1), 1
    while frame is not None and _inside(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    return level


def _inside(filename: str) -> bool:
    return filename.startswith(_PACKAGE) and not filename.startswith(_SCRIPTS)


def warn_if_needed(trace: Trace, *, stacklevel: int | None = None) -> None:
    """Warns once, with the short report, if ``diagnose(trace)`` found a problem.

    Args:
        trace: a ``Trace``.
        stacklevel: as for ``warnings.warn``; the default points at the first
            caller outside chainrunner (the line that called ``run`` or ``sample``).

    Examples:
        >>> import warnings
        >>> import numpy as np
        >>> import chainrunner as cr
        >>> from chainrunner.output._diagnostics import warn_if_needed
        >>> stuck = cr.Trace(draws=np.zeros((2, 10)), stats={}, final_state=None)
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn_if_needed(stuck)
        >>> caught[0].category.__name__, "stuck chain(s) 0, 1" in str(caught[0].message)
        ('ChainrunnerWarning', True)
    """
    diagnostics = getattr(trace, "diagnostics", None)
    if not isinstance(diagnostics, Diagnostics):
        diagnostics = diagnose(trace)
    if not diagnostics.ok:
        level = caller_stacklevel() if stacklevel is None else stacklevel
        warnings.warn(str(diagnostics), ChainrunnerWarning, stacklevel=level)


def monitor_values(draws: Any) -> dict[str, str]:
    """Max split-R-hat and min bulk and tail ESS of ``draws`` (a pytree), for the progress
    bar: the same figures, named as they are, as the report at the end of the run."""
    values = flat_dict(draws)
    num_chains = next(iter(values.values())).shape[0]
    rhat, bulk, tail = _stats(values, np.arange(num_chains))
    out = {}
    for name, found, pick in (
        ("rhat", rhat, np.nanmax), ("ess_bulk", bulk, np.nanmin), ("ess_tail", tail, np.nanmin)
    ):  # fmt: skip
        found = [v for v in found.values() if np.isfinite(v)]
        if found:
            out[name] = f"{pick(found):.3f}" if name == "rhat" else f"{pick(found):.0f}"
    return out
