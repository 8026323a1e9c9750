"""The Fisher-divergence adaptation (nutpie's), per chain, inside the sampling loop.

``cr.from_blackjax(factory, logdensity_fn=..., adaptation="fisher" | "fisher_low_rank")``
lands here. The mass matrix minimises a Fisher divergence between the target and a
Gaussian fitted to each chain's warmup draws *and their gradients* (Seyboldt, Carlson &
Carpenter), on nutpie's schedule:

- the chain starts from ``M⁻¹ = 1/|∇log p(x₀)|`` and a step size found by doubling or
  halving one leapfrog step until its acceptance crosses the target;
- every draw that moved feeds two estimators, a *foreground* one that sets the mass
  matrix after every draw, and a *background* one. At each switch the background becomes
  the foreground and a new background starts: in the first ``early_window`` of warmup
  every ``early_switch_freq`` draws, then in windows of ``switch_freq`` draws that grow
  by ``window_growth``. The mass matrix always reflects the last one to two windows, so
  the draws of the first transient are forgotten early;
- the step size follows dual averaging throughout (restarted when the mass matrix first
  changes), frozen at its averaged value after warmup, and jittered by
  ``±step_size_jitter`` on every step, warmup or not;
- the last ``step_size_window`` of warmup adapts the step size only.

``"fisher"`` adapts a diagonal, ``σ² = sqrt(Var[x] / Var[∇log p])`` per coordinate (blackjax's
``fisher_score_diagonal_from_moments``) from running moments. ``"fisher_low_rank"`` adds up
to ``max_rank`` eigen-directions (Algorithm 1, as blackjax's ``fisher_score_low_rank``)
from running co-moments of the foreground's draws and gradients (``low_rank_metric``).

The schedule is a constant of the program, computed from ``num_warmup`` alone: the same
call gives the same draws on every layout and in every process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from ...core._kernel import Kernel
from ...core._lazy import lazy_cond
from ...core._looped import looped
from ._low_rank_width import following_metric
from ._warmup_window import InLoop, adaptive_kernel, strong

OPTIONS = {
    "target_acceptance_rate": 0.8,
    "initial_step_size": 0.1,
    "early_window": 0.3,
    "step_size_window": 0.15,
    "early_switch_freq": 10,
    "switch_freq": 80,
    "window_growth": 1.5,
    "step_size_jitter": 0.1,
    "update_freq": 1,
    "pooled": False,
}
"""The options of both Fisher adaptations and their defaults (nutpie's; ``pooled``, one
estimate from every chain's draws before sampling, is chainrunner's: ``_warmup_pooled``)."""
LOW_RANK_OPTIONS = {"max_rank": None, "gamma": 1e-5, "eigenvalue_cutoff": 2.0, "update_freq": 10}
"""The further options of ``"fisher_low_rank"`` and their defaults.

``gamma`` and ``eigenvalue_cutoff`` are nutpie's. ``max_rank=None`` is nutpie's too: every
direction outside the cutoff, here up to ``FULL_RANK_LIMIT`` of them, in float64 (see
``rank_of``). Measured, 4 chains x (1000 + 1000), ESS per 1000 gradients, mean of two
seeds: the dense 100-d Gaussian 186 with every direction, 14 with 10 (nutpie: 168); a
radon-like 89-d model 126 against 106 (nutpie: 133). ``update_freq``: nutpie updates
after every draw; here every 10th and at every switch (dense 100-d Gaussian: 176
effective draws per 1000 gradients at 10, 182 at 1, in a quarter of the time)."""
FULL_RANK_LIMIT = 100


def rank_of(options: dict, dim: int, dtype: Any) -> int:
    """The number of directions the low-rank metric keeps, a constant of the program.

    ``max_rank=None`` (the default) is nutpie's: every direction outside the cutoff, up
    to ``FULL_RANK_LIMIT`` (the metric's cost per leapfrog step and its updates grow with
    ``dim x rank``, its eigendecompositions with ``rank³``); an integer caps it. In
    float32 this holds since the regularisation is kept within float32's resolution
    (``float32_regularisation``): before, 50 or 100 directions left the chains of the
    dense 100-d Gaussian stuck, and float32 was capped at 10 (ESS per 1000 gradients 14,
    where every direction gives 145 in float32 and 199 in float64).
    """
    rank = options.get("max_rank")
    if rank is None:
        rank = FULL_RANK_LIMIT
    return min(int(rank), int(dim))


class Schedule(NamedTuple):
    """What each warmup draw does, a constant of the program.

    Attributes:
        adapts_metric: ``(num_warmup,)`` bool: the draw feeds the estimators and the mass
            matrix is updated after it (false in the final step-size-only window).
        switch: ``(num_warmup,)`` bool: after this draw the background estimator
            becomes the foreground one.
    """

    adapts_metric: np.ndarray
    switch: np.ndarray


def schedule(num_warmup: int, options: dict) -> Schedule:
    """nutpie's switching schedule for ``num_warmup`` draws (counting the initial point).

    Args:
        num_warmup: the number of warmup draws.
        options: ``early_window``, ``step_size_window``, ``early_switch_freq``,
            ``switch_freq``, ``window_growth``.

    Returns:
        The ``Schedule``.

    Examples:
        >>> s = schedule(100, OPTIONS)
        >>> int(s.adapts_metric.sum()), int(s.switch.sum())
        (85, 3)
    """
    n = int(num_warmup)
    early_end = int(options["early_window"] * n)
    final_start = n - int(options["step_size_window"] * n)
    adapts = np.arange(n) < final_start
    switch = np.zeros(n, bool)
    window, background = int(options["switch_freq"]), 1  # the initial point counts
    for draw in range(final_start):
        early = draw < early_end
        if draw == early_end:  # never shrink the window at the end of the early phase
            window = max(window, background)
        freq = int(options["early_switch_freq"]) if early else window
        background += 1
        following = freq if early else max(window + 1, round(window * options["window_growth"]))
        if background >= freq and following + draw <= final_start:
            switch[draw] = True
            background = 0
            window = window if early else following
    return Schedule(adapts, switch)


def _one_by_one(estimator: Any, x: jax.Array, g: jax.Array, good: jax.Array) -> Any:
    """``estimator`` fed the rows of ``x``, ``g`` one at a time, in row order.

    The pooled adaptation feeds every chain's draw of a step. A batched (Chan et al.)
    update is a sum over the rows, and XLA fuses such sums with what produced the rows:
    measured, the same rows sliced from a gather of 6 or of 8 (1 or 2 devices) summed to
    different bits. One row at a time is the same sum in the same order in every program.
    """
    return jax.lax.fori_loop(0, x.shape[0], lambda i, e: e.add(x[i], g[i], good[i]), estimator)


class Moments(NamedTuple):
    """Weighted running means and squared deviations of draws and gradients.

    ``add`` takes one draw (``x``, ``g``: ``(d,)``, ``good``: a scalar), or a batch of
    draws (``(n, d)``, ``good``: ``(n,)``: every chain's draw of a step, for the pooled
    adaptation), added one at a time in row order.
    """

    weight: jax.Array
    mean_x: jax.Array
    m2_x: jax.Array
    mean_g: jax.Array
    m2_g: jax.Array

    @classmethod
    def empty(cls, x: jax.Array) -> Moments:
        """No draws yet; ``x``'s last axis is the dimension."""
        zero = jnp.zeros(x.shape[-1:], x.dtype)
        return cls(jnp.zeros((), x.dtype), zero, zero, zero, zero)

    def add(self, x: jax.Array, g: jax.Array, good: jax.Array) -> Moments:
        """Welford's update with ``x``, ``g`` where ``good`` (one draw or a batch)."""
        if jnp.ndim(good) == 1:
            return _one_by_one(self, x, g, good)
        w = self.weight + good.astype(self.weight.dtype)
        share = jnp.where(good, 1.0 / jnp.maximum(w, 1.0), 0.0).astype(x.dtype)
        dx, dg = x - self.mean_x, g - self.mean_g
        mean_x, mean_g = self.mean_x + share * dx, self.mean_g + share * dg
        m2_x = self.m2_x + jnp.where(good, dx * (x - mean_x), 0.0)
        m2_g = self.m2_g + jnp.where(good, dg * (g - mean_g), 0.0)
        return Moments(w, mean_x, m2_x, mean_g, m2_g)


class CoMoments(NamedTuple):
    """``Moments`` with the co-moments ``Σ (x - x̄)(x - x̄)ᵀ`` of draws and gradients (for
    the low-rank metric: ``d²`` numbers each, in place of a buffer of draws)."""

    moments: Moments
    c2_x: jax.Array
    c2_g: jax.Array

    @classmethod
    def empty(cls, x: jax.Array) -> CoMoments:
        """No draws yet; ``x``'s last axis is the dimension."""
        zero = jnp.zeros((x.shape[-1], x.shape[-1]), x.dtype)
        return cls(Moments.empty(x), zero, zero)

    def add(self, x: jax.Array, g: jax.Array, good: jax.Array) -> CoMoments:
        """``Moments.add``, and the co-moments (one draw or a batch)."""
        if jnp.ndim(good) == 1:
            return _one_by_one(self, x, g, good)
        m = self.moments.add(x, g, good)
        keep = good.astype(x.dtype)
        c2_x = self.c2_x + keep * jnp.outer(x - self.moments.mean_x, x - m.mean_x)
        c2_g = self.c2_g + keep * jnp.outer(g - self.moments.mean_g, g - m.mean_g)
        return CoMoments(m, c2_x, c2_g)


class FisherAdaptation(NamedTuple):
    """One chain's Fisher-adaptation state (``WindowState.adaptation``).

    Attributes:
        step_size: the step size of the next step (before its jitter); after warmup the
            adapted one.
        inverse_mass_matrix: the current inverse mass matrix: ``(d,)``, or blackjax's
            ``LowRankInverseMassMatrix`` for ``"fisher_low_rank"``.
        dual_averaging: blackjax's dual-averaging state.
        foreground, background: the two estimators (``Moments``; ``CoMoments`` for the
            low rank).
        basis: for the low rank, the last estimates of the leading eigenvectors of the
            scaled draws' and gradients' covariances, ``(2, d, max_rank)``, where the next
            estimate starts (``(2, d, 0)`` when every direction is kept; ``None`` for the
            diagonal).
        changed: whether the mass matrix has changed from its start yet.
    """

    step_size: jax.Array
    inverse_mass_matrix: Any
    dual_averaging: Any
    foreground: Any
    background: Any
    basis: Any
    changed: jax.Array


def _velocity_verlet_accept(logdensity_fn: Callable, imm: Any) -> Callable:
    """``accept(state, step_size, key)``: the acceptance of one leapfrog step."""
    from blackjax.mcmc import integrators, metrics

    metric = metrics.default_metric(imm)
    step = integrators.velocity_verlet(logdensity_fn, metric.kinetic_energy)

    def accept(state, step_size, key):
        momentum = metric.sample_momentum(key, state.position)
        start = integrators.IntegratorState(
            state.position, momentum, state.logdensity, state.logdensity_grad
        )
        end = step(start, step_size)
        delta = (end.logdensity - metric.kinetic_energy(end.momentum)) - (
            state.logdensity - metric.kinetic_energy(momentum)
        )
        return jnp.where(jnp.isnan(delta), 0.0, jnp.minimum(1.0, jnp.exp(delta)))

    return accept


def find_step_size(logdensity_fn: Callable, state: Any, imm: Any, step_size: jax.Array,
                   target: float, key: jax.Array) -> jax.Array:  # fmt: skip
    """nutpie's start: double (or halve) ``step_size`` until one leapfrog step's
    acceptance falls below (rises above) ``target``; at most 100 tries.

    One loop makes every try, the first (at ``step_size``, which says the direction)
    included: the program holds one leapfrog step, not two (a PyMC model's init program
    compiles that much faster; the same step sizes)."""
    accept = _velocity_verlet_accept(logdensity_fn, imm)

    def more(c):
        i, _, _, done = c
        return (i <= 100) & ~done

    def body(c):
        i, eps, up, _ = c
        nxt = jnp.where(i == 0, eps, jnp.where(up, eps * 2.0, eps / 2.0))
        a = accept(state, nxt, key)
        up = jnp.where(i == 0, a > target, up)
        done = jnp.where(up, (a <= target) | (nxt > 1e5), (a >= target) | (nxt < 1e-10))
        return i + 1, nxt, up, (i > 0) & done

    start = (0, step_size, jnp.bool_(False), jnp.bool_(False))
    _, eps, _, done = jax.lax.while_loop(more, body, start)
    return jnp.where(done & jnp.isfinite(eps), eps, step_size).astype(step_size.dtype)


def gradient_start(g: jax.Array) -> jax.Array:
    """nutpie's first inverse mass matrix, ``1/|∇log p(x₀)|`` (1 where it vanishes)."""
    a = jnp.abs(g)
    return jnp.where(a < 1e-10, 1.0, 1.0 / jnp.clip(a, 1e-20, 1e20)).astype(g.dtype)


def _diag_metric(m: Moments, previous: jax.Array) -> jax.Array:
    from blackjax.adaptation.metric_estimators import fisher_score_diagonal_from_moments

    new = fisher_score_diagonal_from_moments(m.m2_x, m.m2_g).astype(previous.dtype)
    ok = (m.weight >= 3) & jnp.all(jnp.isfinite(new) & (new > 0))
    return jnp.where(ok, new, previous)


_eigh = looped(jnp.linalg.eigh)
_qr = looped(jnp.linalg.qr)
"""The update's decompositions one chain at a time under ``vmap`` (``looped``: jax 0.10's
batched ``eigh`` hung a vmapped 100-d model's run on 2 CPU devices)."""


def _leading(gram: jax.Array, start: jax.Array, iterations: int) -> jax.Array:
    """The leading eigenvectors of ``gram``: subspace iteration from ``start``."""
    for _ in range(iterations):
        start, _ = _qr(gram @ start)
    return start


def _spd_mean(a: jax.Array, b: jax.Array) -> jax.Array:
    """The geometric mean ``a # b⁻¹`` of SPD matrices (``b^-½ (b^½ a b^½)^½ b^-½``)."""
    vals, vecs = _eigh(b)
    vals = jnp.maximum(vals, _FLOOR[jnp.dtype(vals.dtype).name] * jnp.max(vals))
    root = (vecs * jnp.sqrt(vals)) @ vecs.T
    # rsqrt, not a division by sqrt: XLA rewrote the division into rsqrt in some programs
    # and not in others, and the two round differently (1 device against 2, pooled).
    inv_root = (vecs * jax.lax.rsqrt(vals)) @ vecs.T
    mvals, mvecs = _eigh(root @ a @ root)
    mroot = (mvecs * jnp.sqrt(jnp.maximum(mvals, 0.0))) @ mvecs.T
    return inv_root @ mroot @ inv_root


_FLOOR = {"float64": 1e-12, "float32": 1e-6, "float16": 1e-3, "bfloat16": 1e-2}
"""The smallest eigenvalue kept, relative to the largest, per dtype (below it: rounding)."""
FLOAT32_GAMMA = 3e-3
"""In float32, ``gamma`` is at least this times ``min(1, dim / draws)`` times the largest
diagonal of the scaled covariances (``float32_regularisation``)."""


def float32_regularisation(gamma: float, p_x: jax.Array, p_a: jax.Array,
                           draws: jax.Array) -> jax.Array:  # fmt: skip
    """In float32, nutpie's ``gamma``, or ``FLOAT32_GAMMA x min(1, dim / draws)`` of the
    covariances' scale if more.

    ``P + gamma I`` with nutpie's ``gamma = 1e-5`` against covariances of the order of the
    number of draws is below float32's resolution (``1e-7`` relative): the regularisation
    vanished in rounding, and in the early windows (fewer draws than dimensions) the
    metric went wrong: measured on eight schools in float32 (numpyro's default), warmup
    took 20x the gradients of float64's, the step size falling to 0.03. Chosen from a
    sweep in float32 (``benchmarks/bench_numpyro_fisher.py``'s models, one seed, ESS per
    1000 sampling gradients; float64: eight schools 95, radon-like 137, dense 100-d
    Gaussian 199, logistic 217). A constant share: at ``3e-3`` 73, 133, 145, 231; at
    ``1e-3`` the radon-like model's warmup took 10x the gradients (one chain in four at
    the tree depth limit for 350 draws: its early windows hold fewer draws than its 89
    dimensions); at ``1e-2`` the dense Gaussian fell to 92. Strong while the windows hold
    fewer draws than dimensions and weaker as they fill (the rule): 77, 144, 174, 240,
    every warmup within 1.2x of float64's gradients. float64 uses nutpie's ``gamma``.
    """
    scale = jnp.maximum(jnp.max(jnp.diagonal(p_x)), jnp.max(jnp.diagonal(p_a)))
    share = jnp.minimum(1.0, p_x.shape[0] / jnp.maximum(draws, 1.0))
    return jnp.maximum(jnp.asarray(gamma, p_x.dtype), FLOAT32_GAMMA * share * scale)


def low_rank_metric(m: CoMoments, basis: jax.Array, options: dict,
                    iterations: int = 2) -> tuple[Any, jax.Array]:  # fmt: skip
    """The Fisher low-rank inverse mass matrix of ``m``, and the new ``basis``.

    Algorithm 1 of Seyboldt, Carlson & Carpenter, as blackjax's ``fisher_score_low_rank``
    and nutpie compute it: ``sigma = (Var[x] / Var[grad log p])^(1/4)``; the leading
    ``max_rank`` directions of the scaled draws ``X = (x - mean)/sigma`` and gradients
    ``A = (g - mean) sigma``; in their joint span ``Q``, ``S = C_x # inv(C_a)`` with
    ``C = Q'(.'.)Q/gamma + I``; the eigenvalues of ``S`` outside ``[1/cutoff, cutoff]``
    give the low-rank part (every direction, ``Q = I``, when ``basis`` is empty). Two
    departures, for cost: the covariances ``XᵀX``, ``AᵀA`` come from the running
    co-moments (the same numbers, ``d²`` each instead of a buffer of draws), and their
    leading directions from ``iterations`` steps of subspace iteration started from the
    last estimate (``basis``) instead of two SVDs: XLA's CPU SVD of a 470 x 100 buffer
    costs 75 ms, which every warmup step would pay.
    """
    from blackjax.adaptation.metric_estimators import select_top_eigenvalues_by_informativeness
    from blackjax.mcmc.metrics import LowRankInverseMassMatrix

    var_x, var_g = jnp.diagonal(m.c2_x), jnp.diagonal(m.c2_g)
    sigma = jnp.clip(jnp.power(jnp.clip(var_x / jnp.maximum(var_g, 1e-10), 0.0), 0.25),
                     1e-20, 1e20)  # fmt: skip
    gram_x = m.c2_x / jnp.outer(sigma, sigma)
    gram_a = m.c2_g * jnp.outer(sigma, sigma)
    if basis.shape[-1] == 0:  # every direction: no subspace to find
        q, new_basis = jnp.eye(sigma.shape[0], dtype=sigma.dtype), basis
    else:
        u_x = _leading(gram_x, basis[0], iterations)
        u_a = _leading(gram_a, basis[1], iterations)
        q, _ = _qr(jnp.concatenate([u_x, u_a], axis=1))
        new_basis = jnp.stack([u_x, u_a])
    eye = jnp.eye(q.shape[1], dtype=q.dtype)
    p_x, p_a = q.T @ gram_x @ q, q.T @ gram_a @ q
    if jnp.dtype(p_x.dtype) == jnp.float64:  # nutpie's C = P/gamma + I
        c_x, c_a = p_x / options["gamma"] + eye, p_a / options["gamma"] + eye
        floor = 1e-10
    else:  # the same times gamma (their mean is the same): near the draws' scale
        gamma = float32_regularisation(options["gamma"], p_x, p_a, m.moments.weight)
        c_x, c_a = p_x + gamma * eye, p_a + gamma * eye
        floor = _FLOOR[jnp.dtype(p_x.dtype).name]
    vals, vecs = _eigh(_spd_mean(c_x, c_a))
    vals = jnp.maximum(vals, floor * jnp.max(vals))
    u, lam = select_top_eigenvalues_by_informativeness(
        vals, q @ vecs, rank_of(options, sigma.shape[0], sigma.dtype), tail_handling="mask_pad",
        cutoff=options["eigenvalue_cutoff"],
    )  # fmt: skip
    return LowRankInverseMassMatrix(sigma, u, lam), new_basis


def _low_rank_update(m: CoMoments, basis: jax.Array, previous: Any,
                     options: dict) -> tuple[Any, jax.Array]:  # fmt: skip
    """``low_rank_metric`` where it is finite and ``m`` holds 3 draws, else ``previous``."""
    new, new_basis = low_rank_metric(m, basis, options)
    leaves = [*jax.tree.leaves(new), new_basis]
    ok = (m.moments.weight >= 3) & jnp.all(jnp.array([jnp.all(jnp.isfinite(v)) for v in leaves]))
    ok = ok & jnp.all(new.sigma > 0)
    new = jax.tree.map(lambda a, p: jnp.where(ok, a.astype(p.dtype), p), new, previous)
    return new, jnp.where(ok, new_basis.astype(basis.dtype), basis)


def first_metric(abs_grad: jax.Array, low_rank: bool, options: dict) -> Any:
    """nutpie's first inverse mass matrix from ``|∇log p(x₀)|`` (``gradient_start``), as
    a ``LowRankInverseMassMatrix`` with no directions yet for the low rank."""
    from blackjax.mcmc.metrics import LowRankInverseMassMatrix

    imm = gradient_start(abs_grad)
    if not low_rank:
        return imm
    d, dtype = imm.shape[0], imm.dtype
    rank = rank_of(options, d, dtype)
    return LowRankInverseMassMatrix(
        jnp.sqrt(imm), jnp.zeros((d, rank), dtype), jnp.ones(rank, dtype)
    )


def start(x: jax.Array, g: jax.Array, good: jax.Array, imm: Any, step_size: jax.Array,
          low_rank: bool, options: dict, da_init: Callable) -> FisherAdaptation:  # fmt: skip
    """The adaptation state at ``imm`` and ``step_size``, its estimators holding the
    initial draw ``x``, ``g`` (one chain's, or every chain's with ``good`` per row)."""
    if low_rank:
        fg = bg = CoMoments.empty(x).add(x, g, good)
        # The same start for every chain: a fixed orthonormal basis (none when the
        # metric keeps every direction).
        d, rank = x.shape[-1], imm.U.shape[1]
        width = 0 if 2 * rank >= d else rank
        basis = jax.random.normal(jax.random.key(0), (d, width), x.dtype)
        basis = jnp.stack([jnp.linalg.qr(basis)[0]] * 2)
    else:
        fg = bg = Moments.empty(x).add(x, g, good)
        basis = None
    a = FisherAdaptation(step_size, imm, da_init(step_size), fg, bg, basis, jnp.bool_(False))
    return jax.tree.map(strong, a)


def _init_fn(low_rank: bool, options: dict, logdensity_fn: Callable,
             da_init: Callable) -> Callable:  # fmt: skip
    """``init(state, key)``: nutpie's start of one chain's Fisher adaptation."""
    target = float(options["target_acceptance_rate"])

    def init(state, key):
        x, _ = ravel_pytree(state.position)
        g, _ = ravel_pytree(state.logdensity_grad)
        imm = first_metric(jnp.abs(g), low_rank, options)
        eps = find_step_size(
            logdensity_fn, state, imm, jnp.asarray(options["initial_step_size"], x.dtype),
            target, key,
        )  # fmt: skip
        return start(x, g, jnp.ones((), bool), imm, eps, low_rank, options, da_init)

    return init


def fisher_adapt_fn(num_warmup: int, low_rank: bool, options: dict, logdensity_fn: Callable,
                    pooled: bool = False) -> tuple[Callable, Callable]:  # fmt: skip
    """``(init(state, key), adapt(a, t, old, new, info))`` of the Fisher adaptation.

    ``pooled``: ``adapt`` takes every chain's states at once (a leading chain axis) and
    feeds all their draws to one estimate; ``info.acceptance_rate`` is then the one that
    dual averaging follows, the mean over the chains (``_warmup_pooled``).
    """
    from blackjax.adaptation.step_size import dual_averaging_adaptation

    def flat(tree):
        if pooled:
            return jax.vmap(lambda t: ravel_pytree(t)[0])(tree)
        return ravel_pytree(tree)[0]

    target = float(options["target_acceptance_rate"])
    da_init, da_update, da_final = dual_averaging_adaptation(target)
    plan = schedule(num_warmup, options)

    init = _init_fn(low_rank, options, logdensity_fn, da_init)
    every = int(options["update_freq"])

    def update_low_rank(operand):
        return _low_rank_update(*operand, options)

    def metric_step(operand):
        """Feed draw ``u``, switch where the schedule says, update the mass matrix."""
        a, u, x, g, good = operand
        switch = jnp.asarray(plan.switch)[u - 1]
        fg, bg = a.foreground.add(x, g, good), a.background.add(x, g, good)
        fg = jax.tree.map(lambda b, f: jnp.where(switch, b, f), bg, fg)
        bg = jax.tree.map(lambda b, e: jnp.where(switch, e, b), bg, type(bg).empty(x))
        due = switch | (u % every == 0)
        if low_rank:
            # (1 draw in ``every``: the layout rule counts the update's arithmetic so)
            imm, basis = lazy_cond(due, update_low_rank, lambda o: (o[2], o[1]),
                                   (fg, a.basis, a.inverse_mass_matrix), 1 / every)  # fmt: skip
            return a._replace(foreground=fg, background=bg, basis=basis, inverse_mass_matrix=imm)
        imm = jnp.where(due, _diag_metric(fg, a.inverse_mass_matrix), a.inverse_mass_matrix)
        return a._replace(foreground=fg, background=bg, inverse_mass_matrix=imm)

    def warmup_step(operand):
        a, t, x, x_old, g, acceptance_rate = operand
        i = jnp.clip(t, 0, num_warmup - 1)
        good = jnp.any(x != x_old, axis=-1) & jnp.all(jnp.isfinite(g), axis=-1)
        da = da_update(a.dual_averaging, acceptance_rate)
        adapts = jnp.asarray(plan.adapts_metric)[i]
        # The estimators' work only on the steps that adapt the mass matrix.
        fed = lazy_cond(adapts, metric_step, lambda o: o[0], (a, i + 1, x, g, good))
        first = ~a.changed & _changes(fed.inverse_mass_matrix, a.inverse_mass_matrix)
        # When the mass matrix first changes, dual averaging restarts from the step size.
        da = jax.tree.map(lambda r, d: jnp.where(first, r, d), da_init(a.step_size), da)
        eps = jnp.where(t == num_warmup - 1, da_final(da), jnp.exp(da.log_step_size))
        new_a = fed._replace(step_size=eps, dual_averaging=da, changed=a.changed | first)
        return jax.tree.map(lambda n, o: n.astype(o.dtype), new_a, a)

    def adapt(a, t, old, new, info):
        """The update after warmup draw ``t`` (the initial point is draw 0 of the
        estimators, so draw ``t`` is their ``t + 1``); none at all after warmup."""
        x, g, x_old = flat(new.position), flat(new.logdensity_grad), flat(old.position)
        operand = (a, t, x, x_old, g, info.acceptance_rate)
        return lazy_cond(t < num_warmup, warmup_step, lambda o: o[0], operand)

    return init, adapt


def _changes(imm: Any, previous: Any) -> jax.Array:
    return jnp.any(
        jnp.array(
            [
                jnp.any(n != o)
                for n, o in zip(jax.tree.leaves(imm), jax.tree.leaves(previous), strict=True)
            ]
        )
    )


def fisher_kernel(algorithm: Callable, logdensity_fn: Callable, num_warmup: int,
                  options: dict, low_rank: bool) -> Kernel:  # fmt: skip
    """The ``Kernel`` that Fisher-adapts during its first ``num_warmup`` steps."""
    own = {**OPTIONS, **(LOW_RANK_OPTIONS if low_rank else {})}
    extra = {k: v for k, v in options.items() if k not in own}
    spec = fisher_in_loop(logdensity_fn, num_warmup, options, low_rank)
    return adaptive_kernel(algorithm, logdensity_fn, num_warmup, extra, spec)


def fisher_in_loop(logdensity_fn: Callable, num_warmup: int, options: dict,
                   low_rank: bool) -> InLoop:  # fmt: skip
    """The Fisher adaptation as an ``InLoop``. The diagonal one runs as the NUTS state
    machine; the low rank does not: its update (an eigendecomposition every few draws)
    runs for the whole batch whenever the machine processes ends, and measured 3x slower
    than the plain vmapped loop (docs/batches.md)."""
    from blackjax.mcmc.metrics import LowRankInverseMassMatrix

    init_adaptation, adapt = fisher_adapt_fn(num_warmup, low_rank, options, logdensity_fn)

    def init(state, rng_key):
        if not hasattr(state, "logdensity_grad"):
            raise TypeError(
                f"from_blackjax: adaptation={'fisher_low_rank' if low_rank else 'fisher'!r} "
                "needs the gradient of the log density in the kernel's state "
                f"(state.logdensity_grad); {type(state).__name__} has none."
            )
        return init_adaptation(state, rng_key)

    def initial(dim, dtype):
        step_size = jnp.asarray(options["initial_step_size"], dtype)
        if low_rank:
            rank = rank_of(options, dim, dtype)
            return step_size, LowRankInverseMassMatrix(
                jnp.ones(dim, dtype), jnp.zeros((dim, rank), dtype), jnp.ones(rank, dtype)
            )
        return step_size, jnp.ones(dim, dtype)

    jitter = float(options["step_size_jitter"])
    if low_rank:
        return InLoop(init, adapt, initial, jitter, machine=False, metric=following_metric)
    return InLoop(init, adapt, initial, jitter)
