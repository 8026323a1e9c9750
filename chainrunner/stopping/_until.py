"""``until=``: runs that stop when the answer is good enough.

``cr.run(..., until=cr.Converged(...))`` makes ``num_samples`` a cap: after a chunk, on a
growing schedule of draw counts, the kept draws are checked against the targets, and the
run stops after the first chunk at which every variable meets them. The checks depend
only on the draws, so a run that stopped at ``N`` draws has exactly the first ``N`` draws of
a fixed run of ``N`` with the same key and layout, and a resumed run stops where the
uninterrupted one would.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import numpy as np

from . import _convergence


class Converged(NamedTuple):
    """Convergence targets for ``run(..., until=...)``.

    A run stops at the first check at which every element of every variable has
    rank-normalised split R-hat at most ``rhat`` and bulk ESS and tail ESS at least
    ``ess_bulk`` and ``ess_tail`` (summed over chains, as ArviZ reports them). In a run
    with ``superchains`` nested R-hat at most ``nested_rhat`` replaces the R-hat target:
    with many short chains classic R-hat stays high only because each chain is short.
    The defaults are those of Vehtari et al. (2021): R-hat below 1.01 and ESS of 400 (100
    per chain for four chains). Checks happen after the chunk at which the kept draws first reach
    ``min_draws``, then each time they have grown by the factor ``growth``: the checks
    cost about ``growth / (growth - 1)`` times one check at the final length.

    Attributes:
        rhat: the largest R-hat accepted.
        ess_bulk: the smallest bulk ESS accepted.
        ess_tail: the smallest tail ESS accepted.
        nested_rhat: the largest nested R-hat accepted (runs with ``superchains``;
            Margossian et al. 2024 suggest 1.01 to 1.005 for many short chains).
        min_draws: no check before this many kept draws per chain.
        growth: the factor between the draw counts of two checks (> 1).

    Examples:
        >>> import blackjax, jax, jax.numpy as jnp
        >>> import chainrunner as cr
        >>> nuts = blackjax.nuts(lambda x: -0.5 * jnp.sum(x**2), 0.9, jnp.ones(2))
        >>> trace = cr.run(nuts, jax.random.key(0), jnp.zeros((4, 2)), 10_000, chunk_size=50,
        ...                until=cr.Converged(ess_bulk=200, ess_tail=200), progress=False)
        >>> trace.attrs["stopped"], trace.num_draws < 10_000
        ('converged', True)
    """

    rhat: float = 1.01
    ess_bulk: float = 400.0
    ess_tail: float = 400.0
    nested_rhat: float = 1.01
    min_draws: int = 50
    growth: float = 1.25


def check_until(until: Any) -> Converged | None:
    """``until`` if it is ``None`` or a valid ``Converged``; else a clear error."""
    if until is None:
        return None
    if not isinstance(until, Converged):
        raise TypeError(f"run: until must be None or cr.Converged(...), got {until!r}.")
    for name in ("rhat", "nested_rhat"):
        value = getattr(until, name)
        if not (isinstance(value, (int, float)) and value >= 1.0):
            raise ValueError(f"run: until.{name} must be a number >= 1, got {value!r}.")
    for name in ("ess_bulk", "ess_tail"):
        value = getattr(until, name)
        if not (isinstance(value, (int, float)) and value >= 0):
            raise ValueError(f"run: until.{name} must be a number >= 0, got {value!r}.")
    if (
        isinstance(until.min_draws, bool)
        or not isinstance(until.min_draws, int)
        or (until.min_draws < 4)
    ):
        raise ValueError(f"run: until.min_draws must be an int >= 4, got {until.min_draws!r}.")
    if not (isinstance(until.growth, (int, float)) and until.growth > 1.0):
        raise ValueError(f"run: until.growth must be a number > 1, got {until.growth!r}.")
    return until


class Forgotten(NamedTuple):
    """Targets of ``run(..., warmup_until=...)``: warmup ends when chains forgot their start.

    Needs ``superchains``. After the kernel's own ``num_warmup`` adaptation steps, the
    adapted kernel runs on in windows of ``window`` kept draws; warmup ends after the
    first window whose nested R-hat (every element of every variable, computed on that
    window's draws alone) is at most ``nested_rhat``, or after ``max_draws`` such draws
    (then with a warning: the chains may still remember their starting points).

    Attributes:
        nested_rhat: the largest nested R-hat accepted (Margossian et al. 2024 suggest
            1.01 to 1.005 for many short chains).
        window: kept draws per check (>= 4: nested R-hat splits each chain in halves).
        max_draws: the most kept draws warmup adds after the adaptation (a multiple of
            ``window``).

    Examples:
        >>> import blackjax, jax, jax.numpy as jnp
        >>> import chainrunner as cr
        >>> nuts = blackjax.nuts(lambda x: -0.5 * jnp.sum(x**2), 0.9, jnp.ones(2))
        >>> x0 = jnp.repeat(jnp.array([[-10.0, 10.0], [10.0, -10.0]]), 32, axis=0)
        >>> trace = cr.run(nuts, jax.random.key(0), x0, 100, superchains=2, progress=False,
        ...                warmup_until=cr.Forgotten(window=20), warn=False)
        >>> trace.attrs["warmup_forgotten"], trace.attrs["burn_in_steps"] > 0
        (True, True)
    """

    nested_rhat: float = 1.01
    window: int = 50
    max_draws: int = 1000


def check_forgotten(value: Any) -> Forgotten | None:
    """``value`` if it is ``None`` or a valid ``Forgotten``; else a clear error."""
    if value is None:
        return None
    if not isinstance(value, Forgotten):
        raise TypeError(f"run: warmup_until must be None or cr.Forgotten(...), got {value!r}.")
    r = value.nested_rhat
    if not (isinstance(r, (int, float)) and not isinstance(r, bool) and r >= 1.0):
        raise ValueError(f"run: warmup_until.nested_rhat must be a number >= 1, got {r!r}.")
    for name, low in (("window", 4), ("max_draws", 1)):
        v = getattr(value, name)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
            raise ValueError(f"run: warmup_until.{name} must be an int >= {low}, got {v!r}.")
    if value.max_draws % value.window:
        raise ValueError(
            f"run: warmup_until.max_draws={value.max_draws} must be a multiple of "
            f"warmup_until.window={value.window} (warmup is added a window at a time)."
        )
    return value


def columns(draws: Any) -> tuple[np.ndarray, list[str]]:
    """Every element of every draw leaf as a float64 column: ``(chain, draw, k)`` and names.

    An element with one value in every chain and draw (the zeros of a Cholesky factor, a
    constant ``Deterministic``) has no R-hat or ESS (0 / 0) and says nothing about mixing:
    it is left out, unless every element is constant (then no chain moved at all, and
    the NaN diagnostics keep the run from counting as converged). An element constant
    within each chain but different between chains (stuck chains) stays.
    """
    from ..core._naming import flat_dict

    arrays, names = [], []
    for name, x in flat_dict(draws).items():
        x = np.asarray(x, dtype=np.float64)
        arrays.append(x.reshape(x.shape[0], x.shape[1], -1))
        names += [name] * arrays[-1].shape[2]
    x = np.concatenate(arrays, axis=2)
    moving = ~(x.min(axis=(0, 1)) == x.max(axis=(0, 1)))  # NaN compares unequal: kept
    if moving.any() and not moving.all():
        x = x[:, :, moving]
        names = [n for n, keep in zip(names, moving, strict=True) if keep]
    return x, names


class Status(NamedTuple):
    """One check: the worst value of each diagnostic, and whether all targets are met."""

    draws: int
    rhat: float
    ess_bulk: float
    ess_tail: float
    nested_rhat: float | None
    met: bool
    complete: bool = True

    def postfix(self, target: Converged) -> dict[str, str]:
        """For the progress bar: each diagnostic's worst value against its target."""
        out = {
            "rhat": f"{rhat_shown(self.rhat):.3f}/{target.rhat}",
            "ess": f"{ess_shown(min(self.ess_bulk, self.ess_tail)):.0f}/"
            f"{min(target.ess_bulk, target.ess_tail):.0f}",
        }
        if self.nested_rhat is not None:
            out["nRhat"] = f"{rhat_shown(self.nested_rhat):.3f}/{target.nested_rhat}"
        return out


def rhat_shown(value: float) -> float:
    """An R-hat as the bar and the warning show it: rounded up to 3 decimals (1.0104 reads
    1.011 against 1.01); a value that is not finite as it is.

    Examples:
        >>> rhat_shown(1.0104)
        1.011
    """
    return math.ceil(value * 1000) / 1000 if math.isfinite(value) else value


def ess_shown(value: float) -> float:
    """An ESS as the bar and the warning show it: rounded down (799.6 reads 799 against
    800); a value that is not finite as it is.

    Examples:
        >>> ess_shown(799.6)
        799
    """
    return math.floor(value) if math.isfinite(value) else value


def _worst(values: np.ndarray, largest: bool) -> float:
    if np.isnan(values).any():
        return math.inf if largest else 0.0  # not finite: never "met"
    return float(values.max() if largest else values.min())


def _misses(x: np.ndarray, target: Converged, superchains: np.ndarray | None) -> tuple:
    """``(status, how far each column misses its targets)``: 0 where a column meets them."""
    num_chains = x.shape[0]
    r, b, t, *nested_found = _convergence.rhat_and_ess(x, superchains)
    r = r if num_chains >= 2 else np.ones_like(r)
    nested = nested_found[0] if nested_found else None
    # Many short chains: classic R-hat stays high only because the chains are short;
    # nested R-hat is the diagnostic for that regime (Margossian et al. 2024) and replaces it.
    mixing, limit = (r, target.rhat) if nested is None else (nested, target.nested_rhat)
    with np.errstate(divide="ignore", invalid="ignore"):
        miss = np.nan_to_num(
            np.maximum.reduce([
                mixing / limit - 1.0,
                1.0 - b / max(target.ess_bulk, 1e-300),
                1.0 - t / max(target.ess_tail, 1e-300),
            ]),
            nan=np.inf,
        )  # fmt: skip
    rhat, bulk, tail = _worst(r, True), _worst(b, False), _worst(t, False)
    worst_nested = None if nested is None else _worst(nested, True)
    mixed = rhat <= target.rhat if nested is None else worst_nested <= target.nested_rhat
    met = mixed and bulk >= target.ess_bulk and tail >= target.ess_tail
    return Status(x.shape[1], rhat, bulk, tail, worst_nested, bool(met)), miss


def evaluate(
    draws: Any, target: Converged, superchains: np.ndarray | None, suspects: Any = None
) -> tuple[Status, np.ndarray]:
    """Checks ``draws`` (pytree of ``(chain, draw, ...)``) against ``target``.

    ``suspects``: columns (indices into every element of every variable) that missed
    at the last check (``"guess"``: those that cheap proxies say are likeliest to miss).
    They are checked first, alone: when one of them still misses, the check ends there
    (the run goes on either way, so the decision is the one a check of every column
    gives) and costs a fraction of a whole check. Otherwise every column is checked.

    Returns:
        ``(status, suspects for the next check)``; ``status.complete`` says whether it
        covers every column (else its values are those of the suspects).
    """
    x, _ = columns(draws)
    if not np.isfinite(x).all():  # a non-finite draw: not converged, whatever ranks say
        nested = None if superchains is None else math.inf
        return Status(x.shape[1], math.inf, 0.0, 0.0, nested, False), np.arange(0)
    if isinstance(suspects, str):  # "guess": the first check has no misses to go on
        suspects = _guess(x)
    if suspects is not None and 0 < len(suspects) < x.shape[2]:
        status, miss = _misses(x[:, :, suspects], target, superchains)
        if not status.met:
            return status._replace(complete=False), np.asarray(suspects)[_worst_first(miss)]
    status, miss = _misses(x, target, superchains)
    return status, _worst_first(miss)


def _guess(x: np.ndarray, keep: int = 2) -> np.ndarray:
    """The columns likeliest to miss, by cheap proxies: lag-1 autocorrelation (low ESS)
    plus the spread of the chain means over the variance (high R-hat)."""
    centred = x - x.mean(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        var = np.einsum("mnk,mnk->k", centred, centred) / (x.shape[0] * x.shape[1])
        lag1 = np.einsum("mnk,mnk->k", centred[:, 1:], centred[:, :-1])
        lag1 = lag1 / (x.shape[0] * (x.shape[1] - 1))
        badness = np.nan_to_num((lag1 + x.mean(axis=1).var(axis=0)) / var, nan=np.inf)
    return np.argsort(-badness, kind="stable")[:keep]


def _worst_first(miss: np.ndarray, keep: int = 2) -> np.ndarray:
    """The (at most ``keep``) columns that miss their targets most, worst first."""
    order = np.argsort(-miss, kind="stable")[:keep]
    return order[miss[order] > 0]


class Until:
    """The check schedule of one run: when to check, and the last status."""

    def __init__(self, target: Converged, superchains: np.ndarray | None):
        self.target = target
        self.superchains = superchains
        self.next_check = target.min_draws
        self.last: Status | None = None
        self.stopped_at: int | None = None
        self._suspects: Any = "guess"
        self._last_draws: Any = None

    def after_chunk(self, filled: int, result: Any) -> bool:
        """Called after each chunk with the kept draws so far; ``True``: stop here."""
        if self.stopped_at is not None or filled < self.next_check:
            return self.stopped_at is not None
        self._last_draws = result
        self.last, self._suspects = evaluate(
            result(), self.target, self.superchains, self._suspects
        )
        self.next_check = max(filled + 1, math.ceil(filled * self.target.growth))
        if self.last.met:
            self.stopped_at = filled
        return self.last.met

    def attrs(self, interrupted: bool = False) -> dict[str, Any]:
        """Why and when the run stopped, and the last check's values (over every column)."""
        why = "converged" if self.stopped_at is not None else "cap"
        out: dict[str, Any] = {"stopped": "interrupted" if interrupted else why}
        last = self.last
        if last is not None and not last.complete:  # the values of every column, once
            draws = jax.tree.map(lambda a: a[:, : last.draws], self._last_draws())
            last = evaluate(draws, self.target, self.superchains)[0]
        if last is not None:
            out.update(
                until_checked_at_draw=last.draws,
                until_rhat=last.rhat,
                until_ess_bulk=last.ess_bulk,
                until_ess_tail=last.ess_tail,
            )
            if last.nested_rhat is not None:
                out["until_nested_rhat"] = last.nested_rhat
        return out


def superchain_ids(num_chains: int, superchains: int | None) -> np.ndarray | None:
    """Chain ``c``'s superchain: ``c // (num_chains // superchains)``."""
    if superchains is None:
        return None
    return np.arange(num_chains) // (num_chains // superchains)
