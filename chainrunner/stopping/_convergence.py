"""R-hat, nested R-hat and ESS for many variables at once: what ``until=`` checks.

ArviZ computes these one variable element at a time (a Python loop per element: about
0.1 s for 4 chains x 1000 draws x 10 elements on one core), which is too slow to check a
run after its chunks. The functions here compute the same quantities for every element
in one vectorised pass, following ArviZ (arviz 0.x's ``_rhat_rank``, ``_ess_bulk``,
``_ess_tail``; arviz-stats' ``rhat_nested``, Margossian et al. 2024) step for step;
``tests/test_until.py`` checks them against ArviZ to round-off. ``diagnose`` (what a run
reports) still calls ArviZ itself.

Arrays are ``(chain, draw, k)``: ``k`` columns, one per variable element.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
from typing import Any

import numpy as np
from scipy import special
from scipy.fft import next_fast_len


def split(x: np.ndarray) -> np.ndarray:
    """Each chain's halves as two chains (the middle draw of an odd count dropped)."""
    half = x.shape[1] // 2
    return np.concatenate([x[:, :half], x[:, x.shape[1] - half :]], axis=0)


def average_ranks(flat: np.ndarray) -> np.ndarray:
    """Ranks (1-based, ties averaged) of each column: ``scipy.stats.rankdata(method="average")``.

    One argsort per column, vectorised (scipy loops over columns). Continuous draws have
    few ties, if any (a folded draw may equal another): they are averaged where they are,
    run by run; many ties (discrete values, stuck chains) take a vectorised pass.
    """
    return _ranked(flat)[0].T


def _ranked(flat: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ranks, values in order, order)`` of each column of ``flat`` (``(size, k)``),
    each ``(k, size)``: ``average_ranks``, and what the tail quantiles, the median and the
    folded ranks need from the same sort."""
    cols = np.ascontiguousarray(flat.T)  # sorting along contiguous memory: ~3x faster
    n = cols.shape[1]
    order = np.argsort(cols, axis=1)  # ties are averaged: any order within them will do
    values = np.take_along_axis(cols, order, axis=1)
    tied = values[:, 1:] == values[:, :-1]  # position p+1 ties with p
    rank_at = np.broadcast_to(np.arange(1.0, n + 1), values.shape)
    rows, at = np.nonzero(tied)
    if rows.size > _FEW_TIES:
        rank_at = _tied_ranks(values, tied)
    elif rows.size:
        rank_at = rank_at.copy()
        _average_runs(rank_at, rows, at)
    ranks = np.empty(values.shape)
    np.put_along_axis(ranks, order, rank_at, axis=1)
    return ranks, values, order


def _folded_ranks(values: np.ndarray, order: np.ndarray, median: np.ndarray) -> Any:
    """Ranks (1-based) of ``|x - median|`` per column, ``(size, k)``, from the columns'
    values in order (``_ranked``), or ``None`` where two distances tie.

    No second sort: the distances below the median, read leftwards, and those above it,
    read rightwards, are two ascending runs; each distance's rank is its place in its run
    plus how many of the other run are smaller (a binary search). Ties (equal draws, or a
    draw as far below the median as another is above) need averaged ranks: the caller
    then ranks the distances afresh.
    """
    k, n = values.shape
    ranks = np.empty((k, n))
    for c in range(k):
        v, m = values[c], median[c]
        cut = int(np.searchsorted(v, m, side="left"))
        below, above = (m - v[:cut])[::-1], v[cut:] - m
        if (below[1:] == below[:-1]).any() or (above[1:] == above[:-1]).any():
            return None
        low, high = np.searchsorted(above, below, "left"), np.searchsorted(above, below, "right")
        if (low != high).any():
            return None
        at = np.empty(n)
        at[:cut] = (np.arange(below.size) + low + 1.0)[::-1]
        at[cut:] = np.arange(above.size) + np.searchsorted(below, above, "left") + 1.0
        ranks[c, order[c]] = at
    return ranks.T


_FEW_TIES = 10_000


def _average_runs(rank_at: np.ndarray, rows: np.ndarray, at: np.ndarray) -> None:
    """Averages ``rank_at`` over each run of tied positions (``at``: position p ties with
    p + 1, in row ``rows``), in place."""
    new_run = np.ones(rows.size, bool)
    new_run[1:] = (rows[1:] != rows[:-1]) | (at[1:] != at[:-1] + 1)
    starts = np.flatnonzero(new_run)
    ends = np.append(starts[1:], rows.size) - 1
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        row, first, last = rows[a], at[a], at[b] + 1  # positions first..last are tied
        rank_at[row, first : last + 1] = (first + last) / 2 + 1


def _tied_ranks(values: np.ndarray, tied: np.ndarray) -> np.ndarray:
    """The average rank at every sorted position, vectorised (for many ties)."""
    n = values.shape[1]
    starts = np.ones(values.shape, bool)
    starts[:, 1:] = ~tied
    pos = np.arange(n)[None, :]
    ends = np.ones(values.shape, bool)
    ends[:, :-1] = starts[:, 1:]
    first = np.maximum.accumulate(np.where(starts, pos, 0), axis=1)
    last = np.minimum.accumulate(np.where(ends, pos, n)[:, ::-1], axis=1)[:, ::-1]
    return (first + last) / 2 + 1


def z_scale(x: np.ndarray) -> np.ndarray:
    """Rank-normalised values (average ranks, Blom's offset, normal quantiles), per column."""
    m, n, k = x.shape
    return _normal_scores(average_ranks(x.reshape(m * n, k)), x.shape)


def _normal_scores(rank: np.ndarray, shape: tuple) -> np.ndarray:
    """Blom's normal scores of ranks ``(size, k)`` among ``size``, shaped ``shape``."""
    size = rank.shape[0]
    return special.ndtri((rank - 0.375) / (size - 0.75 + 1)).reshape(shape)


def _median(ordered: np.ndarray) -> np.ndarray:
    """``np.median`` of each column from its values in order (``(k, size)``)."""
    size = ordered.shape[1]
    if size % 2:
        return ordered[:, size // 2].copy()
    return (ordered[:, size // 2 - 1] + ordered[:, size // 2]) / 2.0


def _rhat(x: np.ndarray) -> np.ndarray:
    """Basic R-hat of each column (chains already split)."""
    n = x.shape[1]
    between = n * np.var(x.mean(axis=1), axis=0, ddof=1)
    within = np.mean(np.var(x, axis=1, ddof=1), axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt((between / within + n - 1) / n)


def rhat(x: np.ndarray) -> np.ndarray:
    """Rank-normalised split R-hat of each column (``az.rhat(method="rank")``)."""
    s = split(x)
    folded = np.abs(s - np.median(s.reshape(-1, s.shape[2]), axis=0))
    return np.maximum(_rhat(z_scale(s)), _rhat(z_scale(folded)))


def _autocov(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(mean over chains of the autocovariances (n, k), each chain's variance (m, k))``.

    ESS needs no chain's own autocovariances but at lag 0: the FFT is linear, so the
    chains' power spectra are averaged before the one inverse FFT per column.
    """
    n = x.shape[1]
    m = next_fast_len(2 * n)
    y = np.ascontiguousarray(np.moveaxis(x - x.mean(axis=1, keepdims=True), 1, 2))
    f = np.fft.rfft(y, n=m, axis=2)
    power = np.square(f.real)
    power += np.square(f.imag)
    mean = np.fft.irfft(power.mean(axis=0), n=m, axis=1)[:, :n] / n
    return mean.T, np.einsum("ckn,ckn->ck", y, y) / n


def _tau(rho: np.ndarray, n: int) -> np.ndarray:
    """Geyer's initial positive, then monotone, sequence: the integrated autocorrelation.

    ``rho`` is ``(n, k)``, ``rho[0] = 1``. The loops of ArviZ's ``_ess`` in closed form:
    pairs ``P_j = rho[2j] + rho[2j+1]`` are summed while positive (at most up to the
    loop's bound), made non-increasing, and the even term of the last pair is added.
    """
    jcap = max(int(np.ceil((n - 2) / 2)) - 1, 0)
    pairs = rho[0 : 2 * jcap + 1 : 2] + rho[1 : 2 * jcap + 2 : 2]  # P_0 .. P_jcap
    pairs = pairs[: jcap + 1]
    nonpositive = pairs <= 0
    first = np.where(nonpositive.any(axis=0), nonpositive.argmax(axis=0), jcap + 1)
    last = np.minimum(jcap, first)  # the loop's last pair, per column
    j = np.arange(pairs.shape[0])[:, None]
    kept = np.where(j < last, np.minimum.accumulate(np.where(j < last, pairs, np.inf), axis=0), 0)
    even = rho[2 * last, np.arange(rho.shape[1])]
    last_pair = pairs[last, np.arange(rho.shape[1])]
    term = np.where((last == 0) | (last_pair >= 0) | (even > 0), even, 0.0)
    return -1.0 + 2.0 * kept.sum(axis=0) + term


def ess(x: np.ndarray) -> np.ndarray:
    """Effective sample size of each column of ``x`` (ArviZ's ``_ess``)."""
    m, n, _ = x.shape
    acov_mean, variances = _autocov(x)
    mean_var = variances.mean(axis=0) * n / (n - 1.0)
    var_plus = mean_var * (n - 1.0) / n
    if m > 1:
        var_plus = var_plus + np.var(x.mean(axis=1), axis=0, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = 1.0 - (mean_var - acov_mean) / var_plus
    rho[0] = 1.0
    size = m * n
    tau = np.maximum(_tau(rho, n), 1 / np.log10(size))
    out = size / tau
    out = np.where(np.isnan(rho).any(axis=0), np.nan, out)
    constant = (x.max(axis=(0, 1)) - x.min(axis=(0, 1))) < np.finfo(float).resolution
    return np.where(constant, float(size), out)


def ess_bulk(x: np.ndarray) -> np.ndarray:
    """Bulk ESS of each column (``az.ess(method="bulk")``)."""
    return ess(z_scale(split(x)))


def _type7(flat: np.ndarray, probs: tuple[float, float], ordered: bool = False) -> np.ndarray:
    """R's type 7 quantiles of each column with ``mquantiles``'s arithmetic, vectorised;
    ``ordered``: the columns are sorted already."""
    x = flat if ordered else np.sort(flat, axis=0)
    n = x.shape[0]
    p = np.asarray(probs)
    aleph = n * p + (1.0 - p)  # mquantiles: n * p + alphap + p * (1 - alphap - betap)
    k = np.floor(aleph.clip(1, n - 1)).astype(int)
    gamma = (aleph - k).clip(0, 1)[:, None]
    return (1.0 - gamma) * x[k - 1] + gamma * x[k]


def tail_quantiles(flat: np.ndarray, ordered: bool = False) -> np.ndarray:
    """The two quantiles of tail ESS, per column, as the installed ArviZ computes them.

    arviz 0.x: the 5 % and 95 % quantiles, R's type 7 as ``mquantiles`` computes them (the
    same value to the last bit, which decides on which side of it a draw equal to it
    falls). arviz >= 1 (arviz-stats): ``1 - p`` and ``p`` with
    ``p = rcParams["stats.ci_prob"]`` (0.89 by default), by ``numpy.quantile``.
    """
    low, high = tail_probs()
    if _arviz_base() is None:  # arviz 0.x
        return _type7(flat, (low, high), ordered)
    return np.quantile(flat, [low, high], axis=0)  # (sorted columns select at once)


def tail_probs() -> list[float]:
    """The probabilities of the tail-ESS quantiles of the installed ArviZ."""
    base = _arviz_base()
    if base is None:
        return [0.05, 0.95]
    p = float(base.rcParams["stats.ci_prob"])
    return sorted((p, 1 - p))


@functools.cache
def _arviz_base() -> Any:
    """``arviz_base`` (arviz >= 1), or ``None``: looked up once (a failed import is not
    cached by Python, and costs a search of ``sys.path`` every time)."""
    try:
        import arviz_base
    except ImportError:
        return None
    return arviz_base


def _tail_indicators(x: np.ndarray, ordered: np.ndarray | None = None) -> np.ndarray:
    """The two tail-quantile indicators of each column, split: ``(2m, n // 2, 2k)``;
    ``ordered``: each column of ``x`` in order, ``(k, m n)``, where known."""
    if ordered is None:
        low, high = tail_quantiles(x.reshape(-1, x.shape[2]))
    else:
        low, high = tail_quantiles(ordered.T, ordered=True)
    return split(np.concatenate([x <= low, x <= high], axis=2).astype(float))


def ess_tail(x: np.ndarray) -> np.ndarray:
    """Tail ESS of each column: the smaller of the two tail-quantile ESS (ArviZ's)."""
    both = ess(_tail_indicators(x))
    k = x.shape[2]
    return np.minimum(both[:k], both[k:])


def rhat_and_ess(x: np.ndarray, superchains: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    """``(rhat(x), ess_bulk(x), ess_tail(x))`` at once: each rank and FFT computed once;
    with ``superchains`` (chain ``c``'s group), ``nested_rhat(x, superchains)`` fourth,
    from the same ranks.

    Columns are independent: large arrays are cut into blocks of about ``_BLOCK_VALUES``
    values, computed on a thread per core (numpy's sorts and FFTs release the GIL); the
    same numbers as one pass, whatever the core count. Small blocks also keep the
    temporaries small enough to be reused rather than mapped afresh from the system:
    measured, ``diagnose`` of 10,000 chains x 200 draws x 10 columns with nested R-hat, the
    first call in a process, took 4.8 s in blocks of a column, 6.6 s in two blocks of five.
    """
    k = x.shape[2]
    blocks = min(k, -(-x.size // _BLOCK_VALUES))
    if blocks <= 1:
        return _rhat_and_ess(x, superchains)
    cuts = np.array_split(np.arange(k), blocks)
    with concurrent.futures.ThreadPoolExecutor(min(blocks, os.cpu_count() or 1)) as pool:
        parts = list(pool.map(lambda cols: _rhat_and_ess(x[:, :, cols], superchains), cuts))
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(len(parts[0])))


_BLOCK_VALUES = 1_000_000  # values of x per block (one thread does smaller arrays whole)


def _rhat_and_ess(x: np.ndarray, superchains: np.ndarray | None) -> tuple[np.ndarray, ...]:
    """``rhat_and_ess`` on one thread."""
    k = x.shape[2]
    s = split(x)
    ranks, ordered, order = _ranked(s.reshape(-1, k))
    z = _normal_scores(ranks.T, s.shape)
    folded_ranks, whole = None, None
    if np.isnan(ordered[:, -1]).any():  # nan sorts last: np.median's nan, and no reuse
        median = np.median(s.reshape(-1, k), axis=0)
    else:  # an even draw count splits into every draw: x's values in order too
        median, whole = _median(ordered), (ordered if x.shape[1] % 2 == 0 else None)
        folded_ranks = _folded_ranks(ordered, order, median)
    if folded_ranks is None:
        folded = z_scale(np.abs(s - median))
    else:
        folded = _normal_scores(folded_ranks, s.shape)
    r = np.maximum(_rhat(z), _rhat(folded)) if x.shape[0] >= 2 else np.ones(k)
    e = ess(np.concatenate([z, _tail_indicators(x, whole)], axis=2))
    out = (r, e[:k], np.minimum(e[k : 2 * k], e[2 * k :]))
    if superchains is None:
        return out
    ids = np.concatenate([np.asarray(superchains)] * 2)
    return (*out, np.maximum(_nested(z, ids), _nested(folded, ids)))


def _nested(x: np.ndarray, superchains: np.ndarray) -> np.ndarray:
    """Nested R-hat of each column (arviz-stats' ``_rhat_nested``; chains already split)."""
    ids = np.unique(superchains)
    per = len(superchains) // len(ids)
    mean, var = x.mean(axis=1), np.var(x, axis=1, ddof=1)  # (chains, k)
    groups = np.stack([superchains == s for s in ids])  # (K, chains)
    super_mean = np.stack([mean[g].mean(axis=0) for g in groups])
    if per == 1:
        between_chain = np.zeros_like(super_mean)
    else:
        between_chain = np.stack([np.var(mean[g], axis=0, ddof=1) for g in groups])
    within_chain = np.stack([var[g].mean(axis=0) for g in groups])
    between_super = np.var(super_mean, axis=0, ddof=1)
    within_super = np.mean(within_chain + between_chain, axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt(1 + between_super / within_super)


def nested_rhat(x: np.ndarray, superchains: np.ndarray) -> np.ndarray:
    """Rank-normalised nested R-hat of each column; ``superchains[c]`` is chain c's group."""
    superchains = np.asarray(superchains)
    s = split(x)
    ids = np.concatenate([superchains, superchains])
    folded = np.abs(s - np.median(s.reshape(-1, s.shape[2]), axis=0))
    return np.maximum(_nested(z_scale(s), ids), _nested(z_scale(folded), ids))
