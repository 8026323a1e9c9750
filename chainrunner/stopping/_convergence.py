"""R-hat, nested R-hat and ESS for many variables at once: what ``until=`` checks and
what ``diagnose`` reports.

ArviZ computes these one variable element at a time (a Python loop per element: about
0.1 s for 4 chains x 1000 draws x 10 elements on one core), which is too slow to check a
run after its chunks. The functions here compute the same quantities for every element
in one vectorised pass, following ArviZ (arviz 0.x's ``_rhat_rank``, ``_ess_bulk``,
``_ess_tail``; arviz-stats' ``rhat_nested``, Margossian et al. 2024) step for step;
``tests/test_until.py`` checks them against ArviZ to round-off.

Where the time goes at 10,000 chains x 200 draws (two million values a column): one
sort per column (packed keys for float32 draws), from which come the ranks, the median,
the folded ranks (a merge, not a second sort) and the tail quantiles; the normal scores
read from one table; the autocovariances from one Gram matrix per column. Measured on
the draws of ``benchmarks/bench_many_chains.py`` (10 columns, superchains, one BLAS
thread, 2 cores): 1.6 s, against 4.7 s with an argsort per ranking and FFTs, and 14 s
for ArviZ's own functions.

Arrays are ``(chain, draw, k)``: ``k`` columns, one per variable element.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import sys
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

    One sort per column, vectorised (scipy loops over columns). Continuous draws have
    few ties, if any (float32 draws, or a folded draw, may equal another): they are
    averaged where they are, run by run; many ties (discrete values, stuck chains) take a
    vectorised pass.
    """
    values, order = _sort(np.ascontiguousarray(flat.T))
    return _unsort(_rank_at(values), order).T


def _sort(cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(values in order, order)`` of each row of ``cols`` (``(k, size)``, float64).

    Values that float32 holds exactly (float32 draws, JAX's default; integers, booleans)
    are sorted as one array of 64-bit keys, the value's bits above its index: 2x faster
    than ``argsort`` and its gather (45 against 80 ms for 2 million values). The order
    within a run of equal values differs from ``argsort``'s; ranks average over such
    runs, so nothing that follows depends on it.
    """
    if cols.shape[1] < 2**32:
        with np.errstate(over="ignore", invalid="ignore"):
            single = cols.astype(np.float32)
        if np.array_equal(single, cols):  # (nan never equals itself: argsort sorts it)
            return _sort_single(single)
    order = np.argsort(cols, axis=1)
    return np.take_along_axis(cols, order, axis=1), order


_LOW, _HIGH = (0, 1) if sys.byteorder == "little" else (1, 0)  # halves of a uint64
_SIGN = np.uint32(0x80000000)


def _sort_single(single: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``_sort`` of float32 rows: keys whose unsigned order is the values' order (a
    negative value's bits all flipped, a positive one's sign bit), each above its index."""
    k, n = single.shape
    bits = single.view(np.uint32)
    keys = np.empty((k, n), np.uint64)
    halves = keys.view(np.uint32).reshape(k, n, 2)
    halves[..., _HIGH] = bits ^ ((bits.view(np.int32) >> 31).view(np.uint32) | _SIGN)
    halves[..., _LOW] = np.arange(n, dtype=np.uint32)
    keys.sort(axis=1)
    high = halves[..., _HIGH]
    bits = high ^ ((~(high.view(np.int32) >> 31)).view(np.uint32) | _SIGN)
    return bits.view(np.float32).astype(np.float64), halves[..., _LOW].astype(np.intp)


def _unsort(at: np.ndarray, order: np.ndarray) -> np.ndarray:
    """The values ``at`` each sorted position (``(k, size)``) back in the columns' order."""
    out = np.empty(order.shape)
    np.put_along_axis(out, order, at, axis=1)
    return out


def _rank_at(values: np.ndarray) -> np.ndarray:
    """The average rank (1-based) at each position of rows sorted ascending.

    Ties are found where a value equals the one before it; each run of them gets the
    mean of its positions, all runs at once (float32 draws: tens of thousands of ties in
    two million values).
    """
    n = values.shape[1]
    rows, at = np.nonzero(values[:, 1:] == values[:, :-1])  # position at+1 ties with at
    if not rows.size:
        return np.broadcast_to(np.arange(1.0, n + 1), values.shape)
    new_run = np.ones(rows.size, bool)
    new_run[1:] = (rows[1:] != rows[:-1]) | (at[1:] != at[:-1] + 1)
    starts = np.flatnonzero(new_run)
    lengths = np.diff(starts, append=rows.size) + 1  # positions in each run
    first = at[starts]
    within = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    rank_at = np.tile(np.arange(1.0, n + 1), (values.shape[0], 1))
    rank_at[np.repeat(rows[starts], lengths), np.repeat(first, lengths) + within] = np.repeat(
        first + (lengths - 1) / 2 + 1, lengths
    )
    return rank_at


def z_scale(x: np.ndarray) -> np.ndarray:
    """Rank-normalised values (average ranks, Blom's offset, normal quantiles), per column."""
    m, n, k = x.shape
    values, order = _sort(np.ascontiguousarray(x.reshape(m * n, k).T))
    return _unsort(_scores_at(_rank_at(values)), order).T.reshape(x.shape)


def _scores_at(rank_at: np.ndarray) -> np.ndarray:
    """Blom's normal scores of the average ranks ``rank_at`` (``(k, size)``, at sorted
    positions) among ``size``: ``ndtri((rank - 3/8) / (size + 1/4))``. Where no tie moved
    a rank, the score is read from one table for every column."""
    size = rank_at.shape[1]
    ranks, table = _blom_table(size)
    out = np.empty(rank_at.shape)
    out[:] = table
    moved = rank_at != ranks
    if moved.any():
        out[moved] = _blom(rank_at[moved], size)
    return out


def _blom(rank: np.ndarray, size: int) -> np.ndarray:
    return special.ndtri((rank - 0.375) / (size - 0.75 + 1))


@functools.lru_cache(maxsize=4)
def _blom_table(size: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ranks 1..size, their scores)``, read-only (shared by threads and calls)."""
    ranks = np.arange(1.0, size + 1)
    table = _blom(ranks, size)
    ranks.flags.writeable = table.flags.writeable = False
    return ranks, table


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


def _autocov(cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(mean over chains of the autocovariances (n, k), each chain's variance (k, m))``
    of ``cols`` (``(k, m, n)``: column, chain, draw).

    ESS needs no chain's own autocovariances but at lag 0. Many short chains (``_gram``):
    the sum over chains of ``y[i] * y[i + t]`` is the ``t``-th diagonal of one ``n x n``
    Gram matrix per column, a matrix product. Otherwise the FFT, which is linear: the
    chains' power spectra are averaged before the one inverse FFT per column. Either is
    ArviZ's autocovariance to round-off.
    """
    k, c, n = cols.shape
    y = cols - cols.mean(axis=2, keepdims=True)
    variances = np.einsum("kcn,kcn->kc", y, y) / n
    if _gram(c, n):
        acov = np.empty((n, k))
        for j in range(k):
            acov[:, j] = _diagonal_sums(y[j].T @ y[j])
        return acov / (c * n), variances
    m = next_fast_len(2 * n)
    f = np.fft.rfft(y, n=m, axis=2)
    power = np.square(f.real)
    power += np.square(f.imag)
    return (np.fft.irfft(power.mean(axis=1), n=m, axis=1)[:, :n] / n).T, variances


def _gram(chains: int, draws: int) -> bool:
    """Whether the Gram matrix computes the autocovariances of ``chains`` (split) chains
    of ``draws`` draws faster than the FFT: at least half as many chains as draws, at most
    512 draws. Measured per column, one BLAS thread: 20,000 x 100, 6.7 against 29 ms;
    2,000 x 500, 9 against 16; 64 x 100, 0.04 against 0.07; 128 x 250 and 256 x 500,
    even; 32 x 100, 0.03 against 0.02; 8 x 500 (4 chains of 1,000 draws), 0.75 against
    0.09 (and 4 ms with the diagonals summed one by one in Python, 0.43 s of a run's
    diagnostics over 100 variables)."""
    return draws <= 512 and 2 * chains >= draws


def _diagonal_sums(gram: np.ndarray) -> np.ndarray:
    """``[trace(gram, offset=t) for t in range(n)]`` of an ``n x n`` matrix, in one sum:
    row ``i`` of a strided view of ``gram`` padded with ``n`` zero columns starts at
    column ``i``."""
    n = gram.shape[0]
    padded = np.zeros((n, 2 * n), gram.dtype)
    padded[:, :n] = gram
    row, col = padded.strides
    return np.lib.stride_tricks.as_strided(padded, (n, n), (row + col, col)).sum(axis=0)


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
    cols = np.ascontiguousarray(np.moveaxis(x, 2, 0))  # reduced along contiguous draws
    acov_mean, variances = _autocov(cols)
    mean_var = variances.mean(axis=1) * n / (n - 1.0)
    var_plus = mean_var * (n - 1.0) / n
    if m > 1:
        var_plus = var_plus + np.var(cols.mean(axis=2), axis=1, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = 1.0 - (mean_var - acov_mean) / var_plus
    rho[0] = 1.0
    size = m * n
    tau = np.maximum(_tau(rho, n), 1 / np.log10(size))
    out = size / tau
    out = np.where(np.isnan(rho).any(axis=0), np.nan, out)
    constant = (cols.max(axis=(1, 2)) - cols.min(axis=(1, 2))) < np.finfo(float).resolution
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
    """``rhat_and_ess`` on one thread: one sort of each column gives the ranks, the
    median, the folded ranks and (an even draw count splits into every draw) the tail
    quantiles."""
    k = x.shape[2]
    s = split(x)
    values, order = _sort(np.ascontiguousarray(s.reshape(-1, k).T))
    z = _unsort(_scores_at(_rank_at(values)), order).T.reshape(s.shape)
    if np.isnan(values[:, -1]).any():  # nan sorts last: np.median's nan
        folded, whole = z_scale(np.abs(s - np.median(s.reshape(-1, k), axis=0))), None
    else:
        at = _scores_at_folded(values, _median(values))
        folded = _unsort(at, order).T.reshape(s.shape)
        whole = values if x.shape[1] % 2 == 0 else None
    r = np.maximum(_rhat(z), _rhat(folded)) if x.shape[0] >= 2 else np.ones(k)
    tail = ess(_tail_indicators(x, whole))
    out = (r, ess(z), np.minimum(tail[:k], tail[k:]))
    if superchains is None:
        return out
    ids = np.concatenate([np.asarray(superchains)] * 2)
    return (*out, np.maximum(_nested(z, ids), _nested(folded, ids)))


def _scores_at_folded(values: np.ndarray, median: np.ndarray) -> np.ndarray:
    """The normal scores of ``|x - median|`` at each position of ``values`` (``(k,
    size)``, each column's values in order; no nan).

    No second sort: the distances below the median, read leftwards, and those above it,
    read rightwards, are two ascending runs; a stable sort of the two (timsort) merges
    them in one pass (26 ms for two million, against 62 ms by binary searches), and the
    merged distances are ranked with ties averaged.
    """
    k, n = values.shape
    out = np.empty((k, n))
    for c in range(k):
        v, m = values[c], median[c]
        cut = int(np.searchsorted(v, m, side="left"))
        distance = np.concatenate([(m - v[:cut])[::-1], v[cut:] - m])
        merged = np.argsort(distance, kind="stable")  # timsort: two runs merged, O(size)
        at = np.empty(n)
        at[merged] = _scores_at(_rank_at(distance[merged][None]))[0]
        out[c, :cut] = at[:cut][::-1]
        out[c, cut:] = at[cut:]
    return out


def _nested(x: np.ndarray, superchains: np.ndarray) -> np.ndarray:
    """Nested R-hat of each column (arviz-stats' ``_rhat_nested``; chains already split)."""
    ids, group, count = np.unique(superchains, return_inverse=True, return_counts=True)
    mean, var = x.mean(axis=1), np.var(x, axis=1, ddof=1)  # (chains, k)
    if (count == count[0]).all():  # superchains of equal sizes: one pass
        order = np.argsort(group, kind="stable")
        means = mean[order].reshape(len(ids), count[0], -1)
        super_mean, within_chain = means.mean(axis=1), var[order].reshape(means.shape).mean(1)
        between_chain = np.var(means, axis=1, ddof=1) if count[0] > 1 else 0.0
    else:
        groups = [group == g for g in range(len(ids))]
        super_mean = np.stack([mean[g].mean(axis=0) for g in groups])
        within_chain = np.stack([var[g].mean(axis=0) for g in groups])
        between_chain = (
            np.stack([np.var(mean[g], axis=0, ddof=1) for g in groups])
            if len(superchains) // len(ids) > 1
            else 0.0
        )
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
